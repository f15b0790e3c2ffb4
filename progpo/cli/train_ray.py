"""``python -m progpo.cli.train_ray``: OpenRLHF's Ray PPO trainer with ProGPO's step-level estimators.

Accepts every flag of OpenRLHF 0.11.2's ``train_ppo_ray`` (its own parser) but ``--train.num_episodes`` (the run's
length is ``--train.num_iterations``, as on ``train``), plus:

* ``--algo.advantage.estimator`` -- OpenRLHF's flag, the same name as on ``train``, taking ours (the
  ``progpo.advantages`` registry: per-step samples; the default, ``progpo``) or OpenRLHF's critic-free ones;
* ``--progpo.<field>`` / ``--progpo.preset NAME`` -- the estimator's settings, as on ``train``;
* ``--env.*``, ``--rollout.max_prompt_tokens``, ``--eval.num_tasks`` -- the environment, episode loop and
  task list, the same settings classes (and so the same flags) as ``train``;
* ``--rollout.backend hf`` and ``--cpu.*`` -- the whole job on CPU (a local Ray head, OpenRLHF's own actors,
  DeepSpeed over gloo, a transformers engine; :mod:`progpo.openrlhf.cpu`), to debug a launch on a
  laptop before a cluster run;
* ``--debug.*`` -- run checks (weight sync, dumps of the step batches and the rows the actor trained on), and
  ``--debug.check_only``: every start-up check of the flags' values, then exit (the launch scripts' dry run).

``--help`` works without the GPU stack (vLLM, flash-attn). A bad value exits with status 2 and one
line naming the flag, plus a hint. Every float flag, OpenRLHF's own included, takes a finite number, in the
range ``train`` declares for the same setting where it has one (``--actor.adam.lr nan`` is refused).
The launch code is :mod:`progpo.openrlhf.launch`; see ``docs/distributed.md``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from progpo.bounds import Range
from progpo.run.flags import as_flag_error, check_numbers, one_line_errors

logger = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    """OpenRLHF's parser plus our flags (:mod:`progpo.openrlhf.launch`, :mod:`progpo.run.settings`).

    Imports OpenRLHF; where vLLM / flash-attn are not installed, the import shims of
    :mod:`progpo.openrlhf.cpu` stand in during the import only (nothing of them is called).
    A flag error exits with one line naming the flag plus a hint (see :func:`one_line_errors`).
    """
    from progpo.openrlhf import launch
    from progpo.openrlhf.cpu import import_shims
    from progpo.run.settings import add_advantage_flags

    with import_shims():
        from progpo.openrlhf.trainer import openrlhf_parser

        parser = openrlhf_parser()
    parser.prog = "python -m progpo.cli.train_ray"
    parser.description = __doc__.split("\n")[0]
    one_line_errors(parser)
    add_advantage_flags(parser)
    launch.add_flags(parser)
    return parser


def declared_ranges() -> dict[str, Range]:
    """``flag -> range`` of every float setting ``train`` declares (:mod:`progpo.bounds`) and of ``--progpo.*``:
    the ranges OpenRLHF's own flags of the same name are held to (``--actor.adam.lr``: > 0)."""
    from progpo.advantages import AdvantageConfig
    from progpo.run.flags import iter_flags
    from progpo.trainer.config import TrainConfig

    found = [*iter_flags(TrainConfig), *iter_flags(AdvantageConfig, ("progpo",))]
    return {f.option: f.bounds for f in found if f.bounds is not None}


def finalize(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """Every float flag's value checked (:func:`progpo.run.flags.check_numbers`, :func:`declared_ranges`), then
    :func:`progpo.openrlhf.launch.finalize`; a bad flag exits through ``parser.error`` (status 2)."""
    from progpo.openrlhf.launch import finalize as fold

    try:
        check_numbers(parser, args, declared_ranges())
        return fold(args)
    except ValueError as exc:  # every check names its flag (FlagError, or a message starting with it)
        parser.error(f"argument {as_flag_error(exc)}")


def main(argv: list[str] | None = None) -> int:
    """Parse, check, then run OpenRLHF's training with our trainer actor (blocks until done).

    Returns 0 when training finished, or when ``--debug.check_only`` found every flag good (nothing started);
    a bad flag, or ``--rollout.backend vllm`` without vLLM / flash-attn installed, exits with status 2 (one
    line naming the flag, plus a hint); a rollout batch whose failed episodes crossed ``--env.max_failed_frac``
    (or all failed) exits with status 3 and one line naming the cause (``progpo.run.failures``), before anything
    more is trained or saved; a generation engine that died exits with status 4 and one line naming the engine
    (``EngineDied``); ``--train.max_nonfinite_skips`` optimizer steps in a row skipped for a non-finite gradient
    norm exit with status 5 and one line naming the iteration and the flag to lower (``progpo.run.divergence``).
    """
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    parser = build_parser()
    args = finalize(parser, parser.parse_args(argv))
    from progpo.openrlhf.cpu import install, missing_gpu_packages
    from progpo.openrlhf.launch import init_ray, ray_run

    run = ray_run(args)
    if run.settings.debug.check_only:  # the launch scripts' dry run: every check above passed, nothing started
        return 0
    if run.device == "cpu":
        install()
    elif missing_gpu_packages():
        parser.error(f"argument --rollout.backend: vllm needs {' and '.join(missing_gpu_packages())} installed (torch, "
                     "flash-attn, then pip install -e '.[gpu]': docs/distributed.md \"Install\"); "
                     "for a CPU dry run of this job add --rollout.backend hf")
    from progpo.run.answer_format import check_model_answer_format

    try:  # before Ray starts: the policy's tokenizer must carry the answer format (loaded as OpenRLHF's actors do)
        check_model_answer_format(getattr(args, "actor.model_name_or_path"), run.agent.env.name, trust_remote_code=True)
    except ValueError as exc:
        parser.error(f"argument {exc}")
    from progpo.openrlhf.trainer import run_openrlhf_main
    from progpo.run.divergence import EXIT_NONFINITE, NonFiniteUpdate
    from progpo.run.failures import EXIT_ENGINE_DIED, EXIT_ROLLOUT_FAILED, EngineDied, RolloutFailed

    os.environ["PROGPO_AGENT_CONFIG"] = run.agent.to_json()
    started = init_ray(args)
    failure, status = None, 0
    try:
        run_openrlhf_main(args)
    except (RolloutFailed, EngineDied, NonFiniteUpdate) as exc:  # raised in OpenRLHF's trainer actor; ray.get
        failure = " ".join(str(getattr(exc, "cause", None) or exc).split())  # re-raises a subclass
        status = (EXIT_ENGINE_DIED if isinstance(exc, EngineDied) else EXIT_NONFINITE if isinstance(exc, NonFiniteUpdate)
                  else EXIT_ROLLOUT_FAILED)
    finally:
        if started:
            import ray

            ray.shutdown()
            logger.info("local Ray head shut down")
    if failure is not None:  # the last line on stderr
        parser.exit(status, f"{parser.prog}: error: {failure}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
