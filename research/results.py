"""``python -m research results --write|--check``: assemble docs/results.md, the headline tables only.

The page is built, never typed: the learning and fidelity tables are cut from the generated blocks of
docs/fidelity-results.md (``<!-- BEGIN name (generated) -->``), the throughput tables from the measured
sections of docs/training.md (no machine-readable copy of those runs is stored; each table names the
section it comes from). Each table carries its date, commit, machine and command, read from the
provenance header of its source (:class:`research.report.Provenance`): the first line of each block, which the
lab's block writer writes, and the ``Measured by ...`` line above each measured table of docs/training.md; a
source without one is an error naming it. ``--check`` exits 1 when docs/results.md differs from what the
sources give, so a regenerated block without a regenerated page fails.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from progpo.run.flags import one_line_errors
from research.report import Provenance, parse_provenance

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "results.md"
BLOCKS = REPO / "docs" / "fidelity-results.md"
TRAINING = REPO / "docs" / "training.md"

#: The learning tables of the page, current ones only (issue 43's comparison, rerun 2026-12-06 after the ALFWorld
#: state_extra and G2PO fixes): draw -> (column, block) per regime. Older blocks (issue 32's draw 1 and held-out
#: draw 9001) stay in docs/fidelity-results.md under a **Superseded** note, issue 43's first run of 2026-12-05 in
#: docs/fidelity-history.md; neither is quoted here.
LEARNING: dict[str, tuple[tuple[str, str], ...]] = {
    "new draw 4343 (issue 43)": (("fresh ALFWorld-like", "learning-alfworld-fresh-task4343"),
                                 ("fresh WebShop-like", "learning-webshop-fresh-task4343"),
                                 ("fixed ALFWorld-like", "learning-task4343"),
                                 ("fixed WebShop-like", "learning-webshop-fixed-task4343"),
                                 ("fresh ALFWorld-like, hard", "learning-alfworld-fresh-hard-task4343"),
                                 ("fresh WebShop-like, hard", "learning-webshop-fresh-hard-task4343")),
    "developers' draw 1 (issue 43)": (("fresh ALFWorld-like", "i43-learning-alfworld-fresh"),
                                      ("fresh WebShop-like", "i43-learning-webshop-fresh"),
                                      ("fixed ALFWorld-like", "i43-learning-alfworld-fixed"),
                                      ("fixed WebShop-like", "i43-learning-webshop-fixed"),
                                      ("fresh ALFWorld-like, hard", "i43-learning-alfworld-fresh-hard"),
                                      ("fresh WebShop-like, hard", "i43-learning-webshop-fresh-hard")),
}
#: Rows shown as one row of the page: GRAFT's paper preset per family (``graft``: lambda 0.95 on ALFWorld,
#: ``graft_webshop``: 0.8 on WebShop, arXiv 2609.28963 Sec. 4.1) and G2PO's released scripts' (``g2po`` /
#: ``g2po_webshop``), so each one's two columns share a line.
ROW_ALIASES = {"graft preset=graft": "graft, paper preset (`graft`; `graft_webshop` on WebShop-like)",
               "graft preset=graft_webshop": "graft, paper preset (`graft`; `graft_webshop` on WebShop-like)",
               "g2po preset=g2po": "g2po, released preset (`g2po`; `g2po_webshop` on WebShop-like)",
               "g2po preset=g2po_webshop": "g2po, released preset (`g2po`; `g2po_webshop` on WebShop-like)"}
FIDELITY = {"ALFWorld-like": "fidelity", "WebShop-like": "fidelity-webshop"}
FIDELITY_ROWS = ("grpo", "rloo", "gigpo", "hgpo", "progpo paper", "progpo", "TD oracle (true V)")
THROUGHPUT = {  # name -> section heading of docs/training.md (its table follows its "Measured by" line)
    "main-job": "Measured on a fresh clone (2026-12-02)",
    "roofline": "Throughput against this machine's bound (`python -m benchmarks roofline`)",
}
FIDELITY_NOTE = ("`progpo` in this table is the default of 2026-11-30, before its `zero_signal_return = discounted` "
                 "(2026-12-04, commit c0ea0cc), and the ALFWorld-like rows keyed on observation + state_extra ran before "
                 "state_extra named the held object's transition (2026-12-06, commit b6f8acf); these blocks were not "
                 "regenerated since. The learning blocks above carry today's default's fixed-policy fidelity.")


class SourceError(ValueError):
    """A source the page is built from lacks a block, table or section it needs."""


def block(text: str, name: str) -> str:
    """The body of the generated block ``name`` in ``text``."""
    m = re.search(rf"<!-- BEGIN {re.escape(name)} \(generated\) -->\n(.*?)<!-- END {re.escape(name)} -->", text, re.S)
    if not m:
        raise SourceError(f"no generated block {name!r} in {BLOCKS.name}")
    return m.group(1)


def header(body: str, name: str = "?") -> Provenance:
    """The provenance header on the first line of the body ``body`` of the block ``name``."""
    run = parse_provenance(body.split("\n", 1)[0])
    if run is None:
        raise SourceError(f"block {name!r} has no provenance header (first line 'Generated by `CMD` on DATE (UTC), "
                          f"commit C, machine: M:'); regenerate it with its command")
    return run


def command(body: str) -> str:
    """The command a block names in its provenance header."""
    return header(body).command


def shown(cmd: str) -> str:
    """``cmd`` as the page shows it: without its ``--out DIR`` (a folder on the machine that ran it; the figures
    do not depend on it, and the command's default folder under ``runs/bench`` serves a reader)."""
    return re.sub(r" --out (?:'[^']*'|\S+)", "", cmd)


def table_after(text: str, marker: str) -> list[str]:
    """The lines of the first markdown table after the first line starting with ``marker``."""
    lines = text.split("\n")
    start = next((i for i, line in enumerate(lines) if line.startswith(marker)), None)
    if start is None:
        raise SourceError(f"no line starting with {marker!r}")
    first = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("|")), None)
    if first is None:
        raise SourceError(f"no table after {marker!r}")
    end = first
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return lines[first:end]


def cells(line: str) -> list[str]:
    """The cells of one markdown table line."""
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _provenance(names: Sequence[str], runs: Sequence[Provenance], labels: Sequence[str]) -> list[str]:
    return [f"- {label}: {run.date}, commit {run.commit}, {run.machine}; block `{name}`; `{shown(run.command)}`"
            for name, run, label in zip(names, runs, labels)]


def learning_table(text: str, draw: str, columns: Sequence[tuple[str, str]]) -> list[str]:
    """Env steps to 80% success as a multiple of GiGPO's (95% interval), one column per ``(regime, block)`` of
    ``columns``, from the ``**Learning**`` table of each block; collapsed final seeds where any."""
    cols, order, runs = [], [], []
    for _, name in columns:
        body = block(text, name)
        runs.append(header(body, name))
        rows = table_after(body, "**Learning**")
        head = cells(rows[0])
        if "x gigpo [95%]" not in head or "collapsed" not in head:
            raise SourceError(f"block {name!r}: its Learning table lacks 'x gigpo [95%]' or 'collapsed'")
        ratio, collapsed = head.index("x gigpo [95%]"), head.index("collapsed")
        col = {}
        for line in rows[2:]:
            c = cells(line)
            if len(c) != len(head):
                raise SourceError(f"block {name!r}: a Learning table row has {len(c)} cells, its header {len(head)}: "
                                  f"{line.strip()!r}")
            row = ROW_ALIASES.get(c[0], c[0])
            col[row] = c[ratio] + ("" if c[collapsed].startswith("0/") else f", {c[collapsed]} collapsed")
            if row not in order:
                order.append(row)
        cols.append(col)
    labels = [label for label, _ in columns]
    out = [f"### Learning, {draw}", "",
           "Environment steps to 80% success as a multiple of GiGPO's (restricted mean, 95% bootstrap interval; "
           "below 1 is faster), each row at its best learning rate of its block's sweep; the lab's log-linear learner. "
           "Seeds and sweep as each column's command below says (`--seeds`, `--sweep_seeds`).", "",
           "| row | " + " | ".join(labels) + " |", "|---|" + "---|" * len(labels)]
    for row in order:
        out.append(f"| {row} | " + " | ".join(col.get(row, "-") for col in cols) + " |")
    return out + [""] + _provenance([name for _, name in columns], runs, labels)


def fidelity_table(text: str) -> list[str]:
    """Fidelity against the exact advantage under a fixed behaviour policy, N = 8, both families, headline rows."""
    out = ["### Fidelity under a fixed behaviour policy (N = 8 rollouts per task)", "",
           "Agreement of each estimator's step advantages with the exact advantage (mean ± 95% interval over "
           "50 batches); higher is better, NMSE lower is better.", "",
           "| family | row | sign agree | Spearman | Pearson | NMSE |", "|---|---|---|---|---|---|"]
    names, runs = list(FIDELITY.values()), []
    for family, name in FIDELITY.items():
        body = block(text, name)
        runs.append(header(body, name))
        rows = {cells(line)[0]: cells(line) for line in table_after(body, "**N = 8**")[2:]}
        for row in FIDELITY_ROWS:
            if row not in rows:
                raise SourceError(f"block {name!r}: no row {row!r} in its N = 8 table")
            if len(rows[row]) < 5:
                raise SourceError(f"block {name!r}: row {row!r} of its N = 8 table has {len(rows[row])} cells, "
                                  f"not the 5 it needs (row, sign agree, Spearman, Pearson, NMSE)")
            out.append(f"| {family} | {row} | " + " | ".join(rows[row][1:5]) + " |")
    return out + ["", FIDELITY_NOTE, ""] + _provenance(names, runs, list(FIDELITY))


def section(text: str, heading: str) -> str:
    """The text of the docs section whose heading line ends with ``heading``, up to the next heading."""
    m = re.search(rf"^#+ {re.escape(heading)}\n(.*?)(?=^#+ |\Z)", text, re.S | re.M)
    if not m:
        raise SourceError(f"no section {heading!r} in {TRAINING.name}")
    return m.group(1)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading (lower case, punctuation but ``-`` and ``_`` dropped, spaces to ``-``)."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def throughput_tables(training: str) -> list[str]:
    """The main job's per-iteration times and the roofline table, copied from docs/training.md."""
    titles = {"main-job": "Main job, per iteration (fp32, SmolLM2-135M-Instruct, WebShop, 2 tasks x 4 rollouts)",
              "roofline": "Phase times against this machine's bound, fp32 and bf16-mixed (main job's batch)"}
    out = []
    for name, heading in THROUGHPUT.items():
        text = section(training, heading)
        line = next((line for line in text.split("\n") if line.startswith("Measured by `")), "")
        run = parse_provenance(line)
        if run is None:
            raise SourceError(f"section {heading!r} of {TRAINING.name} has no provenance line ('Measured by `CMD` on "
                              f"DATE (UTC), commit C, machine: M:') above its table")
        out += [f"### {titles[name]}", ""] + table_after(text, line) + [
            "", f"- {run.date}, commit {run.commit}, {run.machine}; `{run.command}`; copied from "
                f"[training.md, \"{heading}\"](training.md#{slug(heading)}), no stored machine-readable copy.",
            ""]
    return out


def render(blocks_text: str, training_text: str) -> str:
    """docs/results.md from the text of docs/fidelity-results.md and docs/training.md."""
    out = ["# Results: the headline tables", "",
           "<!-- generated by `python -m research results --write`; do not edit by hand -->", "",
           "Cut from the generated blocks of [fidelity-results.md](fidelity-results.md) (full tables, readings, "
           "\"Where ProGPO stands\") and the measured sections of [training.md](training.md). How the lab measures: "
           "[fidelity.md](fidelity.md); older figures: [fidelity-history.md](fidelity-history.md). Commands are shown "
           "without their `--out` (a folder on the machine that ran them).", "",
           "## Learning", "",
           "Issue 43's comparison (rerun 2026-12-06, after ALFWorld's `state_extra` gained the held object's item "
           "transitions and G2PO's released reading its envs' win/lose reward): every estimator behind "
           "`--algo.advantage.estimator`, each paper's row at its paper preset (G2PO at its released scripts'), "
           "ProGPO's paper reading, its default and `potential_target=closure`, and the oracle. The first run of "
           "2026-12-05 and the learning blocks of issue 32 (draw 1 and held-out draw 9001, 2026-12-04) are superseded "
           "by these and not quoted here.", ""]
    for draw, columns in LEARNING.items():
        out += learning_table(blocks_text, draw, columns) + [""]
    out += ["## Fidelity", ""] + fidelity_table(blocks_text) + ["", "## Throughput", ""]
    out += throughput_tables(training_text)
    return "\n".join(out).rstrip("\n") + "\n"


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """``--write`` or ``--check`` (one of them)."""
    ap = argparse.ArgumentParser(prog="python -m research results", description=__doc__.split("\n")[0])
    one_line_errors(ap)  # no usage dump, and --chec is no --check
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="write docs/results.md")
    mode.add_argument("--check", action="store_true", help="exit 1 when docs/results.md is stale")
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None, page: Path = PAGE, blocks: Path = BLOCKS, training: Path = TRAINING) -> int:
    """Write or check ``page``; exit 1 when it is stale (``--check``), 2 when a source lacks what it needs."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        text = render(blocks.read_text(encoding="utf-8"), training.read_text(encoding="utf-8"))
        current = page.read_text(encoding="utf-8") if page.exists() else None
        if args.write:
            page.write_text(text, encoding="utf-8")
    except SourceError as e:
        print(f"research results: {e}", file=sys.stderr)
        return 2
    except (OSError, UnicodeDecodeError) as e:  # a source or the page missing, unreadable, a folder, not UTF-8
        print(f"research results: {e}", file=sys.stderr)
        return 2
    if args.write:
        print(f"wrote {page}")
        return 0
    if current == text:
        print(f"{page} is current")
        return 0
    print(f"{page} is stale: run `python -m research results --write`", file=sys.stderr)
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
