"""``python -m progpo.cli.evaluate --model PATH --env.name NAME [...]``: success on a fixed test split.

Plays tasks ``0..N-1`` of ``--env.eval_split`` (default: WebShop ``test``, ALFWorld ``valid_unseen``)
and prints JSON: success rate with a 95% Wilson interval, mean return and length (95% intervals),
WebShop mean score, ALFWorld success per task type. ``--model`` is a HF folder, a run folder (its
latest checkpoint) or an alias (``smollm2-135m``, ``tiny``). ``--out FILE`` also writes the JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    """The evaluate CLI parser."""
    from progpo.trainer.config import ENV_DEFAULTS

    p = argparse.ArgumentParser(prog="python -m progpo.cli.evaluate", description=__doc__.split("\n")[0])
    a = p.add_argument
    a("--model", required=True, help="HF folder, run folder (latest checkpoint), smollm2-135m or tiny")
    a("--env.name", default="webshop", choices=sorted(ENV_DEFAULTS))
    a("--env.eval_split", default=None)
    a("--env.max_steps", type=int, default=None)
    a("--env.data_dir", default=None)
    a("--env.webshop_url", default=None)
    a("--env.history_length", type=int, default=2)
    a("--eval.num_tasks", type=int, default=None, help="first N tasks of the split (default: all)")
    a("--eval.n_samples", type=int, default=1, help="episodes per task")
    a("--rollout.temperature", type=float, default=0.4)
    a("--rollout.top_p", type=float, default=1.0)
    a("--rollout.max_new_tokens", type=int, default=256)
    a("--rollout.max_prompt_tokens", type=int, default=2048)
    a("--seed", type=int, default=0)
    a("--out", default=None, help="also write the JSON here")
    return p


def main(argv: list[str] | None = None) -> int:
    """Evaluate and print the JSON summary; exit code 2 on bad flags or missing data/model."""
    from progpo.agents.types import SamplingParams
    from progpo.run.process import setup_logging, unwind_on_sigterm
    from progpo.trainer.config import ENV_DEFAULTS, EnvSettings
    from progpo.run.evaluation import play_split, summarize
    from progpo.run.models import resolve_pretrain

    setup_logging("WARNING")
    unwind_on_sigterm()
    ns = vars(build_parser().parse_args(argv))
    name = ns["env.name"]
    try:
        if ns["eval.num_tasks"] is not None and ns["eval.num_tasks"] < 1:
            raise ValueError(f"--eval.num_tasks must be >= 1, got {ns['eval.num_tasks']}")
        if ns["eval.n_samples"] < 1:
            raise ValueError(f"--eval.n_samples must be >= 1, got {ns['eval.n_samples']}")
        split = ns["env.eval_split"] or ENV_DEFAULTS[name]["eval_split"]
        env = EnvSettings(name=name, max_steps=ns["env.max_steps"] or ENV_DEFAULTS[name]["max_steps"],
                          history_length=ns["env.history_length"], data_dir=ns["env.data_dir"],
                          webshop_url=ns["env.webshop_url"], eval_split=split)
        try:
            sampling = SamplingParams(temperature=ns["rollout.temperature"], top_p=ns["rollout.top_p"],
                                      max_new_tokens=ns["rollout.max_new_tokens"], seed=ns["seed"])
        except ValueError as exc:
            raise ValueError(f"--rollout.*: {exc}") from exc
        model = resolve_pretrain(ns["model"])
        episodes, total = play_split(env, model, split=split, num_tasks=ns["eval.num_tasks"],
                                     n_samples=ns["eval.n_samples"], sampling=sampling,
                                     max_prompt_tokens=ns["rollout.max_prompt_tokens"], history_length=env.history_length)
    except (ValueError, FileNotFoundError) as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    result = {"model": model, "split": split, "tasks_in_split": total, **summarize(name, episodes)}
    text = json.dumps(result, indent=2, default=lambda v: None if isinstance(v, float) and math.isnan(v) else v)
    text = text.replace("NaN", "null")
    print(text)
    if ns["out"]:
        Path(ns["out"]).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
