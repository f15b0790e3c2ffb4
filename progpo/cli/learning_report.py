"""``python -m progpo.cli.learning_report OUT``: figures of ``examples/scripts/run_local_learning.sh``.

Reads the run folder ``OUT`` written by that script:

* ``eval_base_train.json``, ``eval_sft_train.json``: ``progpo.cli.evaluate`` on train-split tasks
  (before / after SFT, sampled at the RL rollout temperature);
* ``rl/metrics.jsonl``: one record per RL iteration (its rollouts are on the train split);
* ``eval_sft_rltasks.json``, ``eval_rl_rltasks.json``: the train tasks RL trained on, before / after RL
  (several episodes per task, sampled at the rollout temperature);
* ``eval_sft_test.json``, ``eval_rl_test.json``: the held-out test split before / after RL;
* ``sft/sft_summary.json``: the expert's success rate and the SFT losses.

Writes ``OUT/learning.png`` (valid-format share and WebShop score per stage: train split as a line,
RL tasks and test split as points with 95% intervals) and ``OUT/learning.json`` (the same figures), and
prints them as a Markdown table plus whether the RL tasks' score after RL lies above the 95% interval
of its start, and the difference after - before with its own 95% interval (a rise beyond noise when
that interval excludes 0). Intervals: Wilson for shares, normal for the mean score (``progpo.run.evaluation``); the
RL iterations' rollout points have none (one batch each).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any


def _load(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``, or None when there is no such file.

    Raises:
        ValueError: ``path`` is not a JSON object (cut short, a folder, another format); names it.
    """
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a readable JSON file ({e}); rerun the step that writes it") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, found {type(data).__name__}")
    return data


def _read(path: Path, what: str, read):
    """``read()``, with a missing key or a wrong type reported as a ValueError naming ``path``."""
    try:
        return read()
    except (KeyError, TypeError, IndexError) as e:
        raise ValueError(f"{path}: not {what} ({type(e).__name__}: {e})") from None


def _eval_point(label: str, ev: dict[str, Any]) -> dict[str, Any]:
    fmt = ev["format_invalid"]
    score = ev.get("score", {})
    return {
        "stage": label, "episodes": ev["episodes"] - ev.get("failed_episodes", 0),
        "valid": 1.0 - fmt["rate"], "valid_low": 1.0 - fmt["high"], "valid_high": 1.0 - fmt["low"],
        "score": score.get("mean"), "score_low": score.get("low"), "score_high": score.get("high"),
        "success": ev["success"]["rate"], "success_low": ev["success"]["low"], "success_high": ev["success"]["high"],
    }


def collect(out: Path) -> dict[str, Any]:
    """The figures of one learning run folder (see module docstring).

    Raises:
        FileNotFoundError: ``OUT`` is not a folder or holds none of the expected files.
        ValueError: one of them is unreadable or not of its kind (cut short, another format); names it.
    """
    from progpo.run.metrics import read_metrics

    if not out.is_dir():
        raise FileNotFoundError(f"{out} is not a folder (pass the OUT folder of examples/scripts/run_local_learning.sh)")
    evaluation = "an evaluation written by progpo.cli.evaluate"
    train: list[dict[str, Any]] = []
    for name, label in (("eval_base_train.json", "base"), ("eval_sft_train.json", "SFT")):
        ev = _load(out / name)
        if ev is not None:
            train.append(_read(out / name, evaluation, lambda: _eval_point(label, ev)))
    metrics = out / "rl" / "metrics.jsonl"
    if metrics.exists():
        try:
            records = read_metrics(out / "rl")
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"{metrics}: not readable JSON lines ({e})") from None
        train += _read(metrics, "the metrics of progpo.cli.train", lambda: [_rl_point(r) for r in records])
    test, rl_tasks = [], []
    for name, label in (("eval_base_test.json", "base"), ("eval_sft_test.json", "before RL (SFT)"),
                        ("eval_rl_test.json", "after RL")):
        ev = _load(out / name)
        if ev is not None:
            test.append(_read(out / name, evaluation, lambda: _eval_point(label, ev)))
    for name, label in (("eval_sft_rltasks.json", "before RL (SFT)"), ("eval_rl_rltasks.json", "after RL")):
        ev = _load(out / name)
        if ev is not None:
            rl_tasks.append(_read(out / name, evaluation, lambda: _eval_point(label, ev)))
    summary = out / "sft" / "sft_summary.json"
    sft = _load(summary)
    if not train and not test and not rl_tasks and sft is None:
        raise FileNotFoundError(f"{out} holds no evaluation, RL metrics or SFT summary (run examples/scripts/run_local_learning.sh)")
    expert = None
    if sft is not None:
        expert = _read(summary, "an sft summary of progpo.cli.sft", lambda: {
            "success": sft["expert_success"], "score_mean": sft.get("expert_score_mean"),
            "samples": sft["samples"], "epochs": [e["loss/sft_nll"] for e in sft["epochs"]]})
    return {"train": train, "rl_tasks": rl_tasks, "test": test, "expert": expert, "verdict": verdict(rl_tasks)}


def verdict(rl_tasks: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Whether the RL tasks' mean score after RL lies above the 95% interval of the score before RL, and
    the difference after - before with its 95% interval (:func:`progpo.run.evaluation.mean_difference_interval`;
    ``diff_low`` > 0: a rise beyond noise; None where an interval is missing)."""
    from progpo.run.evaluation import mean_difference_interval

    if len(rl_tasks) < 2 or any(p.get("score") is None for p in rl_tasks):
        return None
    before, after = rl_tasks[0], rl_tasks[-1]
    high = before.get("score_high")
    out = {"before": before["score"], "before_high": high, "after": after["score"],
           "above_start_interval": bool(high is not None and after["score"] > high),
           "diff": after["score"] - before["score"], "diff_low": None, "diff_high": None}
    try:
        d = mean_difference_interval(*({"mean": p["score"], "low": p.get("score_low"), "high": p.get("score_high"),
                                        "n": p.get("episodes")} for p in (after, before)))
        out.update(diff_low=d["low"], diff_high=d["high"])
    except ValueError:
        pass
    return out


def _rl_point(r: dict[str, Any]) -> dict[str, Any]:
    inv = r.get("rollout/invalid_format_frac")
    return {"stage": f"RL {r['iteration']}", "episodes": int(r.get("rollout/num_episodes") or 0),
            "valid": None if inv is None else 1.0 - inv, "score": r.get("env/score_mean"),
            "success": r.get("env/success_rate"), "adv_std": r.get("adv/std"),
            "flat_group_frac": r.get("rollout/flat_group_frac"), "iteration_s": r.get("perf/iteration_s")}


def plot(figures: dict[str, Any], path: Path) -> Path:
    """Two panels (valid-format share, WebShop score) into ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    train = figures["train"]
    test = [{**p, "stage": f"RL tasks, {p['stage']}"} for p in figures.get("rl_tasks", [])] + [
        {**p, "stage": f"test, {p['stage']}"} for p in figures["test"]]
    xs = list(range(len(train)))
    for ax, key, title in ((axes[0], "valid", "valid-format share"), (axes[1], "score", "WebShop score (mean)")):
        ys = [p.get(key) for p in train]
        pts = [(x, y) for x, y in zip(xs, ys) if y is not None]
        if pts:
            ax.plot(*zip(*pts), marker="o", label="train split (sampled at T=1.0)")
        for k, p in enumerate(test):
            y = p.get(key)
            if y is None or (isinstance(y, float) and math.isnan(y)):
                continue
            lo, hi = p.get(f"{key}_low"), p.get(f"{key}_high")
            err = None if lo is None or hi is None else [[max(y - lo, 0.0)], [max(hi - y, 0.0)]]
            x = len(train) + k
            ax.errorbar([x], [y], yerr=err, fmt="s", capsize=4, color=f"C{k + 1}",
                        label=f"{p['stage']} (95% interval)")
        ax.set_xticks(list(range(len(train) + len(test))))
        ax.set_xticklabels([p["stage"] for p in train] + [p["stage"].replace(", ", ":\n") for p in test], fontsize=7,
                           rotation=45, ha="right")
        ax.set_ylim(-0.05, 1.05)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _fmt(p: dict[str, Any], key: str) -> str:
    y = p.get(key)
    if y is None or (isinstance(y, float) and math.isnan(y)):
        return "-"
    lo, hi = p.get(f"{key}_low"), p.get(f"{key}_high")
    if lo is None or hi is None or any(isinstance(v, float) and math.isnan(v) for v in (lo, hi)):
        return f"{y:.3f}"
    return f"{y:.3f} [{lo:.3f}, {hi:.3f}]"


def table(figures: dict[str, Any]) -> str:
    """The figures as a Markdown table (one row per stage; split in the first column)."""
    rows = ["| split | stage | episodes | valid-format share | WebShop score | success |", "| --- | --- | --- | --- | --- | --- |"]
    for split in ("train", "rl_tasks", "test"):
        for p in figures.get(split, []):
            rows.append(f"| {split.replace('rl_tasks', 'RL tasks')} | {p['stage']} | {p.get('episodes')} | {_fmt(p, 'valid')} | {_fmt(p, 'score')} | "
                        f"{_fmt(p, 'success')} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; exit code 2 when the folder holds nothing to report or an unreadable file."""
    p = argparse.ArgumentParser(prog="python -m progpo.cli.learning_report", description=__doc__.split("\n")[0])
    p.add_argument("out", help="the run folder of run_local_learning.sh")
    args = p.parse_args(argv)
    out = Path(args.out)
    try:
        figures = collect(out)
    except (FileNotFoundError, ValueError) as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    png = plot(figures, out / "learning.png")
    (out / "learning.json").write_text(json.dumps(figures, indent=2))
    if figures["expert"] is not None:
        e = figures["expert"]
        s = e["success"]
        print(f"expert: won {s['wins']}/{s['n']} ({s['rate']:.3f}, 95% {s['low']:.3f}-{s['high']:.3f}); "
              f"SFT on {e['samples']} steps, NLL per epoch {', '.join(f'{v:.3f}' for v in e['epochs'])}")
    print(table(figures))
    v = figures["verdict"]
    if v is not None:
        where = "above" if v["above_start_interval"] else "not above"
        line = (f"RL tasks: WebShop score {v['before']:.3f} before RL (95% interval up to {v['before_high']:.3f}) -> "
                f"{v['after']:.3f} after RL: {where} the start's interval")
        if v.get("diff_low") is not None:
            beyond = "beyond noise" if v["diff_low"] > 0 else "an interval that holds 0: not beyond noise"
            line += f"; difference {v['diff']:+.3f} [{v['diff_low']:+.3f}, {v['diff_high']:+.3f}]: {beyond}"
        print(line)
    print(f"wrote {png} and {out / 'learning.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
