"""``python -m progpo.cli.sft [FLAGS]``: behaviour-cloning warm start on expert trajectories.

1. plays ``--sft.num_tasks`` tasks of ``--env.train_split`` (seeded random order; with ``--env.num_tasks``
   from the range ``--env.task_offset ..`` only, repeating it when ``--sft.num_tasks`` is larger) with the env's
   expert (``progpo.agents.experts``: WebShop's scripted expert, ALFWorld's walkthroughs) through the
   RL episode loop, with the RL run's template, ``--env.history_length`` and context guard
   (``--rollout.max_prompt_tokens``): pass the values the later ``train`` run will use;
2. keeps the steps of the episodes the expert won, and trains the policy on them through DeepSpeed
   (token-mean NLL on response tokens only; ``progpo.trainer.sft``);
3. writes a checkpoint per epoch in the layout of ``train`` (``<ckpt.path>/checkpoints/iter_N/hf`` is
   a Hugging Face folder), ``metrics.jsonl`` and ``sft_summary.json`` (expert success rate with a
   95% interval, samples, NLL per epoch). ``train --actor.model_name_or_path <ckpt.path>`` starts RL from it.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from typing import Any

from progpo.run import flags
from progpo.trainer.warm_start import SUMMARY, SFTArgs, SFTSettings  # noqa: F401 - SUMMARY, SFTSettings: this CLI's API

logger = logging.getLogger(__name__)

def build_parser() -> argparse.ArgumentParser:
    """The sft CLI parser (flag names shared with ``progpo.cli.train`` where they mean the same)."""
    p = argparse.ArgumentParser(prog="python -m progpo.cli.sft", description=__doc__.split("\n")[0], allow_abbrev=False)
    flags.add_flags(p, SFTArgs)
    return p


def parse(argv: list[str] | None = None) -> SFTArgs:
    """Parse and check ``argv``; :class:`~progpo.run.flags.FlagError` (a ValueError) names a bad flag."""
    args = flags.build(SFTArgs, build_parser().parse_args(argv))
    return dataclasses.replace(args, env=args.env.resolved(pool="local"))


def run(args: SFTArgs) -> dict[str, Any]:
    """Collect expert data, train, checkpoint into ``--ckpt.path`` (:func:`progpo.trainer.warm_start.run_sft`)."""
    from progpo.trainer.warm_start import run_sft

    return run_sft(args)


def main(argv: list[str] | None = None) -> int:
    """Parse flags and run; exit code 2 on bad flags or missing data/model, 5 when the cloned weights are no longer
    finite (one line naming the epoch and ``--sft.lr``; nothing written from them)."""
    from tqdm.contrib.logging import logging_redirect_tqdm

    from progpo.run.process import prepare_process
    from progpo.envs.base import EnvFailure
    from progpo.run.divergence import EXIT_NONFINITE, NonFiniteUpdate

    prepare_process()
    try:
        args = parse(argv)
        with logging_redirect_tqdm():
            summary = run(args)
    except NonFiniteUpdate as exc:
        sys.stderr.write(f"error: {exc}\n")
        return EXIT_NONFINITE
    except (ValueError, FileNotFoundError, EnvFailure) as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    print(f"done: {summary['samples']} samples x {len(summary['epochs'])} epochs in {summary['total_s']:.0f} s; "
          f"RL from it: python -m progpo.cli.train --actor.model_name_or_path {args.save_path} ...", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
