"""``python -m progpo.cli.plot RUN_DIR [RUN_DIR ...] [--out FILE]``: success and return curves.

Reads each run's ``metrics.jsonl`` and draws ``env/success_rate`` and ``env/return_mean`` against the
iteration, one line per run (labelled by the run folder name, e.g. progpo vs gigpo vs grpo), the two
panels side by side, into a PNG (default ``curves.png`` in the current folder).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

PANELS = (("env/success_rate", "success rate"), ("env/return_mean", "episode return"))


def plot_runs(run_dirs: list[str], out: str, smooth: int = 1) -> Path:
    """Draw the curves of ``run_dirs`` into ``out`` (PNG) and return its path.

    Args:
        run_dirs: run folders written by ``progpo.cli.train``.
        out: output PNG path. smooth: moving-average window in iterations (1 = raw).

    Raises:
        FileNotFoundError: a folder without ``metrics.jsonl``. ValueError: ``smooth < 1``.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from progpo.run.metrics import read_metrics

    if smooth < 1:
        raise ValueError(f"--smooth must be >= 1, got {smooth}")
    fig, axes = plt.subplots(1, len(PANELS), figsize=(6 * len(PANELS), 4))
    for run in run_dirs:
        records = read_metrics(run)
        label = Path(run).resolve().name
        for ax, (key, title) in zip(axes, PANELS):
            pts = [(r["iteration"], r[key]) for r in records if r.get(key) is not None]
            if not pts:
                continue
            x, y = map(np.asarray, zip(*pts))
            if smooth > 1 and len(y) >= smooth:
                y = np.convolve(y, np.ones(smooth) / smooth, mode="valid")
                x = x[smooth - 1:]
            ax.plot(x, y, marker="o" if len(x) < 30 else None, label=label)
    for ax, (_, title) in zip(axes, PANELS):
        ax.set_xlabel("iteration")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; exit code 2 on a missing run folder."""
    p = argparse.ArgumentParser(prog="python -m progpo.cli.plot", description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="+", help="run folders (each with metrics.jsonl)")
    p.add_argument("--out", default=None, help="output PNG (default: curves.png in the first run folder)")
    p.add_argument("--smooth", type=int, default=1, help="moving-average window (iterations)")
    args = p.parse_args(argv)
    try:
        out = args.out if args.out is not None else str(Path(args.runs[0]) / "curves.png")
        path = plot_runs(args.runs, out, args.smooth)
    except (FileNotFoundError, ValueError) as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
