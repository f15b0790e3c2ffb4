"""Metric sinks: JSONL (one record per iteration) and TensorBoard, plus the progress bar.

Every metric is a plain float named ``<namespace>/<name>`` with namespace ``rollout``, ``env``,
``adv``, ``loss`` or ``perf`` (definitions in ``docs/training.md``).
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path

from progpo.run.atomic import append_line, atomic_write_text, complete_lines, drop_torn_tail

logger = logging.getLogger(__name__)

NAMESPACES = ("rollout", "env", "adv", "loss", "perf", "eval")

SKIPPED_KEY = "loss/update_skipped_nonfinite"
"""Metric: optimizer steps of the iteration skipped for a non-finite loss, gradient norm or learning rate
(:mod:`progpo.run.divergence`)."""

SUMMARY_KEYS = (
    ("env/success_rate", "success", "{:.3f}"),
    ("env/score_mean", "score", "{:.3f}"),
    ("env/return_mean", "return", "{:+.3f}"),
    ("env/episode_length_mean", "len", "{:.1f}"),
    ("rollout/invalid_format_frac", "valid", "{:.2f}"),  # shown as the valid-format share, 1 - invalid
    ("rollout/truncated_response_frac", "cut", "{:.2f}"),
    ("loss/policy", "pg", "{:+.4f}"),
    ("loss/kl", "kl", "{:.4f}"),
    ("adv/std", "adv_std", "{:.3f}"),
    ("rollout/flat_group_frac", "flat", "{:.2f}"),
    ("rollout/dynamic_dropped_frac", "dropped", "{:.2f}"),
    ("rollout/dynamic_extra_groups", "extra", "{:.0f}"),
    ("perf/steps_per_s", "steps/s", "{:.2f}"),
    ("perf/generate_s", "gen_s", "{:.1f}"),
    ("perf/env_s", "env_s", "{:.1f}"),
    ("perf/advantages_s", "adv_s", "{:.3f}"),
    ("perf/update_s", "upd_s", "{:.1f}"),
)


def format_metrics(it: int, metrics: dict[str, float]) -> str:
    """One human-readable line of the main metrics of an iteration.

    ``valid`` is the share of answers in the ``<think>/<action>`` format (``1 -
    rollout/invalid_format_frac``); ``flat`` is ``rollout/flat_group_frac`` (share of tasks whose
    rollouts all got the same return); ``dropped`` / ``extra`` are dynamic sampling's dropped share
    and extra groups. When every task is flat the batch carries no learning signal, and the line
    says so (with the advantages' spread, which should then be zero); a skipped update
    (``loss/update_skipped``) and optimizer steps skipped for non-finite numbers (:data:`SKIPPED_KEY`) are said too.
    """
    parts = [f"iter {it}"]
    for key, label, fmt in SUMMARY_KEYS:
        if key in metrics:
            value = 1.0 - metrics[key] if key == "rollout/invalid_format_frac" else metrics[key]
            parts.append(f"{label}={fmt.format(value)}")
    line = " ".join(parts)
    if metrics.get("rollout/flat_group_frac") == 1.0:
        line += " | no signal: every task's rollouts got the same return"
    if metrics.get("loss/update_skipped") == 1.0:
        line += (" | update skipped: every advantage is 0 and the policy equals the reference or the KL term is off"
                 if metrics.get("rollout/num_steps", 1.0) > 0 and "adv/std" in metrics else
                 " | update skipped: no group with a return signal")
    if metrics.get(SKIPPED_KEY, 0.0) > 0:
        line += (f" | {metrics[SKIPPED_KEY]:.0f} optimizer step(s) skipped: non-finite loss or gradient norm "
                 "(no checkpoint this iteration)")
    return line


class MetricsLogger:
    """Append metrics to ``<run>/metrics.jsonl`` and (optionally) TensorBoard events (``<run>/tensorboard``).

    Args:
        run_dir: the run folder. tensorboard: the TensorBoard event folder (``--logger.tensorboard_dir``;
            relative: inside ``run_dir``), True for ``tensorboard``, False or None for no events.
    """

    def __init__(self, run_dir: str | os.PathLike, tensorboard: bool | str | os.PathLike | None = True) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / "metrics.jsonl"
        if drop_torn_tail(self.path):  # a record cut by a kill: never complete, so never a record
            logger.warning("%s: dropped an unfinished last line (a write cut short)", self.path)
        self._tb = None
        if tensorboard not in (None, False):
            from torch.utils.tensorboard import SummaryWriter

            folder = "tensorboard" if tensorboard is True else tensorboard
            self._tb = SummaryWriter(log_dir=str(self.run_dir / folder))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Write one record ``{"iteration": step, ...metrics}``: one line appended in one write and fsynced
        (:func:`progpo.run.atomic.append_line`), so a kill leaves at most an unfinished last line, which readers skip.

        Raises:
            ValueError: a metric name outside the known namespaces.
        """
        for name in metrics:
            if name.split("/", 1)[0] not in NAMESPACES:
                raise ValueError(f"metric {name!r} is not namespaced ({', '.join(NAMESPACES)})")
        record = {"iteration": step, **{k: (float(v) if math.isfinite(float(v)) else None) for k, v in metrics.items()}}
        append_line(self.path, json.dumps(record))
        if self._tb is not None:
            for k, v in metrics.items():
                if math.isfinite(float(v)):
                    self._tb.add_scalar(k, float(v), step)
            self._tb.flush()

    def truncate_after(self, step: int) -> None:
        """Drop records with ``iteration > step`` (a resumed run re-logs the iterations it repeats)."""
        if not self.path.exists():
            return
        keep = [line for line in complete_lines(self.path) if json.loads(line)["iteration"] <= step]
        atomic_write_text(self.path, "".join(line + "\n" for line in keep))

    def close(self) -> None:
        """Flush and close TensorBoard."""
        if self._tb is not None:
            self._tb.close()


def read_metrics(run_dir: str | os.PathLike) -> list[dict]:
    """The records of ``<run_dir>/metrics.jsonl`` in order; an unfinished last line (a write cut by a kill, no
    newline) is skipped.

    Raises:
        FileNotFoundError: the run has no metrics file.
    """
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"no metrics.jsonl in {run_dir} (is it a run folder written by progpo.cli.train?)")
    return [json.loads(line) for line in complete_lines(path)]
