"""``python -m progpo.cli.train [FLAGS]``: train an LLM agent with a step-level group estimator.

Local backend (CPU or one GPU): transformers generation, DeepSpeed actor. Flags: ``--help`` and
``docs/training.md``. Prints one metrics line per iteration; writes ``<save_path>/metrics.jsonl``,
TensorBoard events and checkpoints.
"""

from __future__ import annotations

import logging
import os
import signal
import sys

SUMMARY_KEYS = (
    ("env/success_rate", "success", "{:.3f}"),
    ("env/score_mean", "score", "{:.3f}"),
    ("env/return_mean", "return", "{:+.3f}"),
    ("env/episode_length_mean", "len", "{:.1f}"),
    ("rollout/invalid_format_frac", "invalid", "{:.2f}"),
    ("rollout/truncated_response_frac", "cut", "{:.2f}"),
    ("loss/policy", "pg", "{:+.4f}"),
    ("loss/kl", "kl", "{:.4f}"),
    ("adv/std", "adv_std", "{:.3f}"),
    ("rollout/flat_group_frac", "flat", "{:.2f}"),
    ("perf/steps_per_s", "steps/s", "{:.2f}"),
    ("perf/generate_s", "gen_s", "{:.1f}"),
    ("perf/env_s", "env_s", "{:.1f}"),
    ("perf/advantages_s", "adv_s", "{:.3f}"),
    ("perf/update_s", "upd_s", "{:.1f}"),
)


def format_metrics(it: int, metrics: dict[str, float]) -> str:
    """One human-readable line of the main metrics of an iteration.

    ``flat`` is ``rollout/flat_group_frac`` (share of tasks whose rollouts all got the same return).
    When every task is flat the batch carries no learning signal, and the line says so (with the
    advantages' spread, which should then be zero).
    """
    parts = [f"iter {it}"]
    for key, label, fmt in SUMMARY_KEYS:
        if key in metrics:
            parts.append(f"{label}={fmt.format(metrics[key])}")
    line = " ".join(parts)
    if metrics.get("rollout/flat_group_frac") == 1.0:
        line += " | no signal: every task's rollouts got the same return"
    return line


def setup_logging(level: str = "INFO") -> None:
    """Log to stderr; keep DeepSpeed / HTTP libraries at WARNING."""
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    for name in ("DeepSpeed", "deepspeed", "httpx", "urllib3", "sentence_transformers", "werkzeug"):
        logging.getLogger(name).setLevel(logging.WARNING)


def unwind_on_sigterm() -> None:
    """Make SIGTERM (kill, job schedulers) unwind like Ctrl-C, so context managers stop the WebShop
    server and the env pool instead of leaving them running. Both signals also stop a running decode
    at its next token (``generation.request_stop``); the unwind used to wait for the whole batch."""
    from progpo.trainer.generation import request_stop

    def on_sigterm(signum, frame):
        request_stop()
        sys.exit(128 + signum)

    def on_sigint(signum, frame):
        request_stop()
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_sigterm)
    signal.signal(signal.SIGINT, on_sigint)


def prepare_process() -> None:
    """Start of a training CLI (``train``, ``sft``): offline Hugging Face and quiet tokenizers unless
    the environment says otherwise, logging at ``$PROGPO_LOG_LEVEL`` (INFO), and the signal unwind."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    setup_logging(os.environ.get("PROGPO_LOG_LEVEL", "INFO"))
    unwind_on_sigterm()


def main(argv: list[str] | None = None) -> int:
    """Parse flags, run the trainer, print metrics per iteration. Exit code 2 on a bad flag value."""
    prepare_process()
    from progpo.trainer.config import config_from_args
    from progpo.envs.base import EnvFailure
    from progpo.trainer.loop import Trainer

    try:
        cfg = config_from_args(argv)
    except ValueError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2

    from tqdm.contrib.logging import logging_redirect_tqdm

    from progpo.trainer.progress import write

    def show(it: int, metrics: dict[str, float]) -> None:
        write(format_metrics(it, metrics))

    print(f"run folder: {cfg.run.save_path} | env {cfg.env.name} | estimator {cfg.advantage.estimator} | "
          f"model {cfg.actor.pretrain}", flush=True)
    try:
        with logging_redirect_tqdm():  # log lines above the progress bar, not through it
            history = Trainer(cfg, on_iteration=show).fit()
    except (ValueError, FileNotFoundError, EnvFailure) as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    if history:
        last = history[-1]
        print(f"done: {len(history)} iterations; last success {last.get('env/success_rate', float('nan')):.3f}, "
              f"return {last.get('env/return_mean', float('nan')):+.3f}; metrics in {cfg.run.save_path}/metrics.jsonl",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
