"""Markdown tables, PNG figures (matplotlib, Agg) and generated blocks of docs/fidelity-results.md for the benchmarks."""

from __future__ import annotations

import datetime
import math
import os
import pickle
import platform
import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

DOCS_DIR = Path(__file__).resolve().parents[1] / "docs"
DOCS = DOCS_DIR / "fidelity-results.md"  # the current blocks; a new block goes here
HISTORY = DOCS_DIR / "fidelity-history.md"  # superseded blocks: read, never written
BLOCK_FILES = (DOCS,)  # where a block is written: a regenerated block is current, whatever the history holds


def block_file(block: str, files: Sequence[Path] = BLOCK_FILES) -> Path:
    """The docs file a regenerated block ``block`` is written to: the first of ``files`` that holds its BEGIN
    marker, else the first of ``files`` (the current results page; a block that stands only in the history page
    is superseded there, and its new run is current)."""
    begin = f"<!-- BEGIN {block} (generated) -->"
    for path in files:
        if path.exists() and begin in path.read_text():
            return path
    return files[0]


@dataclass(frozen=True)
class Provenance:
    """What produced a table: the command, the date (UTC), the commit and the machine it ran on.

    Written as the first line of each generated block (:func:`write_docs_block`) and of each measured
    table that docs/results.md copies, :meth:`line`; read back by :func:`parse_provenance`.
    """

    command: str
    date: str
    commit: str
    machine: str

    def line(self, verb: str = "Generated") -> str:
        """The one-line header: ``{verb} by `command` on DATE (UTC), commit C, machine: M:``.

        Raises:
            ValueError: the command holds a backquote or a line break, or a field a line break (the line
                could not be read back).
        """
        if "`" in self.command or any("\n" in f for f in (self.command, self.date, self.commit, self.machine)):
            raise ValueError(f"provenance of {self.command!r}: no backquote in the command, no line break in a field")
        return f"{verb} by `{self.command}` on {self.date} (UTC), commit {self.commit}, machine: {self.machine}:"


PROVENANCE = re.compile(r"(?:Generated|Measured) by `([^`\n]+)` on (\d{4}-\d\d-\d\d) \(UTC\), commit (\S+), "
                        r"machine: ([^\n]+):$", re.M)


def parse_provenance(line: str) -> Provenance | None:
    """The :class:`Provenance` of a header line written by :meth:`Provenance.line`, else None."""
    m = PROVENANCE.fullmatch(line.strip())
    return Provenance(*m.groups()) if m else None


def git_commit(repo: Path = DOCS_DIR.parent) -> str:
    """``git rev-parse --short HEAD`` of ``repo``, with ``+dirty`` when a tracked file outside docs/ differs from
    it (the docs are where blocks are written, so an earlier block of the same session does not count), or
    ``unknown`` outside git."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True,
                              check=True).stdout.strip()
        changes = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":!docs"],
                                 cwd=repo, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if changes else "")


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's ``model name`` from ``cpuinfo``, else what :mod:`platform` knows."""
    try:
        m = re.search(r"^model name\s*:\s*(.+)$", cpuinfo.read_text(), re.M)
    except OSError:
        m = None
    return m.group(1).strip() if m else (platform.processor() or platform.machine() or "unknown CPU")


def machine() -> str:
    """This machine in words: core count, CPU model and bf16 capability (:func:`progpo.run.precision.bf16_capability`),
    e.g. ``2-core AMD EPYC, bf16 native (avx512_bf16)``."""
    from progpo.run.precision import bf16_capability

    cap = bf16_capability()
    flags = cap.detail.partition(": ")[2] or cap.detail
    return f"{os.cpu_count()}-core {cpu_model()}, bf16 {'native' if cap.native else 'emulated'} ({flags})"


def provenance(command: str) -> Provenance:
    """The :class:`Provenance` of ``command`` run here and now: today's UTC date, :func:`git_commit`,
    :func:`machine`."""
    today = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    return Provenance(command, today, git_commit(), machine())


def fmt_ci(mean: float, half: float, digits: int = 3) -> str:
    """``mean ± half`` (a 95% interval half-width), or ``n/a`` for NaN."""
    if not math.isfinite(mean):
        return "n/a"
    return f"{mean:.{digits}f} ± {half:.{digits}f}"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A GitHub markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_fidelity(results: dict[int, dict], sweep: dict[str, dict], out: Path, prefix: str = "fidelity") -> list[Path]:
    """Bar chart of Spearman per estimator and N (with 95% CIs) and a line chart of the sweep, written as
    ``{prefix}_spearman.png`` and ``{prefix}_sweep.png`` in ``out`` (one prefix per task family, so the
    families' figures do not overwrite each other)."""
    from research.fidelity_core import mean_ci

    plt = _plt()
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    if results:
        names = list(next(iter(results.values()))["rows"])
        fig, ax = plt.subplots(figsize=(max(8, 0.6 * len(names)), 4.5))
        width = 0.8 / len(results)
        for k, (n, res) in enumerate(results.items()):
            stats = [mean_ci(res["rows"][name]["spearman"]) for name in names]
            xs = [i + (k - (len(results) - 1) / 2) * width for i in range(len(names))]
            ax.bar(xs, [s[0] for s in stats], width, yerr=[s[1] for s in stats], label=f"N={n}", capsize=2)
        ax.set_xticks(range(len(names)), names, rotation=60, ha="right", fontsize=8)
        ax.set_ylabel("Spearman with true advantage")
        ax.set_title("Credit-assignment fidelity (synthetic MDPs, exact truth)")
        ax.legend()
        fig.tight_layout()
        paths.append(out / f"{prefix}_spearman.png")
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    if sweep:
        settings = list(sweep)
        names = list(next(iter(sweep.values()))["rows"])
        fig, ax = plt.subplots(figsize=(10, 4.5))
        for name in names:
            stats = [mean_ci(sweep[s]["rows"][name]["spearman"]) for s in settings]
            ax.errorbar(range(len(settings)), [m for m, _ in stats], yerr=[h for _, h in stats], marker="o",
                        capsize=2, label=name)
        ax.set_xticks(range(len(settings)), settings, rotation=20, ha="right", fontsize=8)
        ax.set_ylabel("Spearman with true advantage")
        ax.set_title("Where each estimator wins: fragmentation sweep")
        ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        paths.append(out / f"{prefix}_sweep.png")
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    return paths


def plot_curves(curves: dict[str, list[tuple[list[float], list[float]]]], path: Path, title: str) -> Path:
    """Success rate vs env steps: mean over seeds per estimator, shaded min-max band.

    Args:
        curves: estimator -> one ``(env_steps [I], success [I])`` pair per seed (cumulative steps).
    """
    import numpy as np

    plt = _plt()
    path.parent.mkdir(parents=True, exist_ok=True)
    many = len(curves) > 10  # the default colour cycle repeats after 10: one colour per row from tab20
    colours = plt.get_cmap("tab20").colors if many else [None] * len(curves)
    fig, ax = plt.subplots(figsize=(11, 5) if many else (8, 4.5))
    for k, (name, runs) in enumerate(curves.items()):
        n = min(len(s) for s, _ in runs)
        steps = np.mean([s[:n] for s, _ in runs], axis=0)
        succ = np.array([y[:n] for _, y in runs])
        style = "-" if name.split()[0] in ("progpo", "oracle") else "--"  # ProGPO rows solid, baselines dashed
        (line,) = ax.plot(steps, succ.mean(0), style, color=colours[k % len(colours)], label=name)
        ax.fill_between(steps, succ.min(0), succ.max(0), color=line.get_color(), alpha=0.06 if many else 0.15)
    ax.axhline(0.8, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("environment steps")
    ax.set_ylabel("success rate (training batch)")
    ax.set_title(title)
    if many:
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    else:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_docs_block(block: str, command: str, text: str, docs: Path | None = None,
                     run: Provenance | None = None) -> None:
    """Replace (or append) the block ``<!-- BEGIN {block} -->...<!-- END {block} -->`` of ``docs`` (default:
    :func:`block_file`, docs/fidelity-results.md; a superseded copy in docs/fidelity-history.md stays as it is).

    The block holds its provenance header (``run``, default :func:`provenance` of ``command``: the command that
    produced ``text``, today's date, the commit and the machine) and ``text``, its exact output; nothing is
    typed by hand.
    """
    docs = block_file(block) if docs is None else docs
    run = provenance(command) if run is None else run
    begin, end = f"<!-- BEGIN {block} (generated) -->", f"<!-- END {block} -->"
    body = f"{begin}\n{run.line()}\n\n{text}\n{end}"
    current = docs.read_text() if docs.exists() else "# Credit-assignment fidelity\n"
    pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
    new = pattern.sub(lambda _: body, current) if pattern.search(current) else current.rstrip() + "\n\n" + body + "\n"
    docs.parent.mkdir(parents=True, exist_ok=True)
    docs.write_text(new)


def save_report(out: str | Path, block: str, command: str, text: str, results: object, *, write_docs: bool) -> None:
    """Write a benchmark's outputs into ``out``: ``{block}.md`` (the command, then ``text``), ``{block}-runs.pkl``
    (``results``: every run's curves, for re-analysis) and, with ``write_docs``, the docs block ``block``
    (:func:`write_docs_block`)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{block}.md").write_text(f"`{command}`\n\n{text}\n")
    with open(out / f"{block}-runs.pkl", "wb") as fh:
        pickle.dump(results, fh)
    if write_docs:
        write_docs_block(block, command, text)
