"""``python -m progpo.cli.train [FLAGS]``: train an LLM agent with a step-level group estimator.

Local backend (CPU or one GPU): transformers generation, DeepSpeed actor. Flags: ``--help`` and
``docs/training.md``. Prints one metrics line per iteration; writes ``<save_path>/metrics.jsonl``,
TensorBoard events and checkpoints.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """Parse flags, run the trainer, print metrics per iteration. Exit code 2 on a bad flag value, 3 when a
    batch's failed episodes crossed ``--env.max_failed_frac`` (one line naming the cause), 5 when
    ``--train.max_nonfinite_skips`` consecutive optimizer steps were skipped for non-finite numbers (one line
    naming the iteration and the flag to lower; :mod:`progpo.run.divergence`)."""
    from progpo.run.process import prepare_process

    prepare_process()
    from progpo.trainer.config import config_from_args
    from progpo.envs.base import EnvFailure
    from progpo.run.divergence import EXIT_NONFINITE, NonFiniteUpdate
    from progpo.run.failures import EXIT_ROLLOUT_FAILED, RolloutFailed
    from progpo.trainer.loop import Trainer

    try:
        cfg = config_from_args(argv)
    except ValueError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2

    from tqdm.contrib.logging import logging_redirect_tqdm

    from progpo.run.metrics import format_metrics
    from progpo.trainer.progress import write

    def show(it: int, metrics: dict[str, float]) -> None:
        write(format_metrics(it, metrics))

    print(f"run folder: {cfg.save_path} | env {cfg.env.name} | estimator {cfg.algo.advantage.estimator} | "
          f"model {cfg.actor.model_name_or_path}", flush=True)
    try:
        with logging_redirect_tqdm():  # log lines above the progress bar, not through it
            history = Trainer(cfg, on_iteration=show).fit()
    except RolloutFailed as exc:
        sys.stderr.write(f"error: {exc}\n")
        return EXIT_ROLLOUT_FAILED
    except NonFiniteUpdate as exc:
        sys.stderr.write(f"error: {exc}\n")
        return EXIT_NONFINITE
    except (ValueError, FileNotFoundError, EnvFailure) as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    if history:
        last = history[-1]
        print(f"done: {len(history)} iterations; last success {last.get('env/success_rate', float('nan')):.3f}, "
              f"return {last.get('env/return_mean', float('nan')):+.3f}; metrics in {cfg.save_path}/metrics.jsonl",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
