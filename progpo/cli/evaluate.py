"""``python -m progpo.cli.evaluate --actor.model_name_or_path PATH --env.name NAME [...]``: success on a fixed split.

Plays tasks ``0..N-1`` of ``--env.eval_split`` (default: the env spec's, WebShop ``test``, ALFWorld
``valid_unseen``) and prints JSON: success rate with a 95% Wilson interval, mean return and length
(95% intervals), and the env's own figures (WebShop mean score, ALFWorld success per task type).
The model is a HF folder, a run folder (its latest checkpoint) or an alias (``smollm2-135m``,
``tiny``). ``--out FILE`` also writes the JSON. Flag names are ``train``'s where they mean the same.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

from progpo.run import flags
from progpo.run.settings import EnvSettings, EvalSettings, RolloutSettings


@dataclass(frozen=True)
class ModelSettings:
    """The policy evaluated (``--actor.*``)."""

    model_name_or_path: str
    """HF folder, run folder (its latest checkpoint), smollm2-135m or tiny"""


@dataclass(frozen=True)
class EvaluateArgs:
    """The flags of ``python -m progpo.cli.evaluate``."""

    actor: ModelSettings
    env: EnvSettings = field(default_factory=lambda: EnvSettings(pool="local"), metadata={
        "flags": ("name", "eval_split", "max_steps", "history_length", "invalid_penalty", "data_dir", "url")})
    eval: EvalSettings = field(default_factory=EvalSettings)
    rollout: RolloutSettings = field(default_factory=lambda: RolloutSettings(temperature=0.4, max_prompt_tokens=2048),
                                     metadata={"flags": ("temperature", "top_p", "max_new_tokens", "max_prompt_tokens")})
    out: str | None = None
    """also write the JSON here"""


def build_parser() -> argparse.ArgumentParser:
    """The evaluate CLI parser."""
    p = argparse.ArgumentParser(prog="python -m progpo.cli.evaluate", description=__doc__.split("\n")[0])
    flags.add_flags(p, EvaluateArgs)
    return p


def main(argv: list[str] | None = None) -> int:
    """Evaluate and print the JSON summary; exit code 2 on bad flags or missing data/model."""
    from progpo.agents.types import SamplingParams
    from progpo.run.evaluation import play_split, summarize
    from progpo.run.models import resolve_pretrain
    from progpo.run.process import setup_logging, unwind_on_sigterm

    setup_logging("WARNING")
    unwind_on_sigterm()
    try:
        args = flags.build(EvaluateArgs, build_parser().parse_args(argv))
        env = args.env.resolved(pool="local")
        split = env.eval_split
        if args.eval.num_tasks == 0:
            raise flags.FlagError("--eval.num_tasks", "must be >= 1 (or unset for the whole split), got 0")
        try:
            sampling = SamplingParams(temperature=args.rollout.temperature, top_p=args.rollout.top_p,
                                      max_new_tokens=args.rollout.max_new_tokens, seed=args.eval.seed)
        except ValueError as exc:
            raise ValueError(f"--rollout.*: {exc}") from exc
        model = resolve_pretrain(args.actor.model_name_or_path)
        episodes, total = play_split(env, args.rollout, model, split=split, num_tasks=args.eval.num_tasks,
                                     task_offset=args.eval.task_offset, n_samples=args.eval.n_samples,
                                     sampling=sampling)
    except (ValueError, FileNotFoundError) as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    result = {"model": model, "split": split, "tasks_in_split": total, **summarize(env.name, episodes),
              "settings": dataclasses.asdict(args)}
    text = json.dumps(result, indent=2, default=lambda v: None if isinstance(v, float) and math.isnan(v) else v)
    text = text.replace("NaN", "null")
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
