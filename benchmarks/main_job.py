"""``python -m benchmarks main-job``: the README's main job, one git ref against another, each from a fresh clone.

For each entry of ``--runs`` (``REF [FLAGS...]``, separated by ``;``), in order and one at a time on this machine:

1. ``git clone`` this repository into ``--out``/``runN`` and check out ``REF``;
2. run that clone's ``bash examples/scripts/run_local.sh FLAGS`` as a new user would, with a ``HOME`` of its own, so
   that the model conversion and the warm start are not read from another run's cache (``~/.cache/progpo``), and
   the data from ``--data`` (``PROGPO_DATA``, and ``../shared`` beside the clone);
3. read its ``runs/<env>_<estimator>/metrics.jsonl``.

The script's own first step, ``scripts/install.sh``, installs what the ref's requirements lack into this Python; a
``progpo`` installed from another checkout stays where it points, and the clone's script imports the clone's own code
(it runs from the clone's root, which is also first on ``PYTHONPATH``).

Printed per run: the commit, the whole wall time (install check, model conversion, warm start, iterations), the
part before the first iteration starts (install check, conversion, warm start, engine start), and per iteration
``gen_s`` (``perf/generate_s``), ``upd_s`` (``perf/update_s``), the iteration's own time (``perf/iteration_s``
plus ``perf/checkpoint_s``), ``valid`` (1 - ``rollout/invalid_format_frac``) and ``flat``
(``rollout/flat_group_frac``): the signal the main job promises (issue 42: valid >= 0.8 and flat 0.00 every
iteration). Then each run's wall time against the first's. The load average is printed at start and end: the
figures mean something only on an idle machine.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks import cli
from benchmarks.async_mode import run_logged

REPO = Path(__file__).resolve().parents[1]
SCRIPT = Path("examples") / "scripts" / "run_local.sh"
RUN_DIR = Path("runs") / "webshop_progpo"
"""The main job's run folder inside a clone (``run_local.sh``'s ``--ckpt.path`` with its default env and estimator)."""


@dataclass(frozen=True)
class MainJobBench:
    """The flags of ``python -m benchmarks main-job``."""

    runs: str = "bd412d4; HEAD"
    """runs in order, separated by ';': a git ref of this repository, then flags for its run_local.sh (shell words)"""
    data: str = ""
    """the shared data folder (its webshop/ and alfworld/ subfolders; empty: $PROGPO_DATA, else ../shared/data beside this checkout)"""
    out: str = ""
    """folder of the clones, their homes and logs (empty: a temporary folder, removed at the end)"""
    timeout_s: float = 3600.0
    """each run's wall-clock limit (seconds)"""

    def __post_init__(self) -> None:
        if self.timeout_s <= 0:
            raise ValueError(f"--timeout_s must be > 0, got {self.timeout_s}")
        parse_runs(self.runs)


def parse_runs(text: str) -> list[tuple[str, list[str]]]:
    """``--runs`` as ``[(ref, flags)]``: entries split at ``;``, each split into shell words, the first the ref.

    Raises:
        ValueError: naming ``--runs``: no entry, an empty entry, or unbalanced quotes.
    """
    entries = [e.strip() for e in text.split(";")]
    if not text.strip() or any(not e for e in entries):
        raise ValueError(f"--runs needs entries 'REF [FLAGS...]' separated by ';', got {text!r}")
    out = []
    for entry in entries:
        try:
            words = shlex.split(entry)
        except ValueError as exc:
            raise ValueError(f"--runs: {entry!r}: {exc}") from None
        out.append((words[0], words[1:]))
    return out


def resolve_commit(ref: str, repo: Path = REPO) -> str:
    """The full commit id of ``ref`` in ``repo``.

    Raises:
        ValueError: ``ref`` names no commit of ``repo`` (the message names the ref and ``--runs``).
    """
    done = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
                          capture_output=True, text=True)
    if done.returncode:
        raise ValueError(f"--runs: {ref!r} is not a commit of {repo}")
    return done.stdout.strip()


def data_dir(flag: str, repo: Path = REPO) -> Path:
    """The shared data folder: ``flag``, else ``$PROGPO_DATA``, else ``../shared/data`` beside ``repo``.

    Raises:
        FileNotFoundError: the folder has no ``webshop`` subfolder (naming ``--data`` and the path).
    """
    path = Path(flag or os.environ.get("PROGPO_DATA", "") or repo.parent / "shared" / "data").resolve()
    if not (path / "webshop").is_dir():
        raise FileNotFoundError(f"--data: {path} has no webshop/ folder (pass the shared data folder)")
    return path


@dataclass(frozen=True)
class JobResult:
    """One run's figures: ``wall_s`` (the whole script), ``setup_s`` (before the first iteration) and the
    per-iteration records of its ``metrics.jsonl``."""

    ref: str
    commit: str
    flags: list[str]
    wall_s: float
    records: list[dict]

    @property
    def setup_s(self) -> float:
        return self.wall_s - sum(r["perf/iteration_s"] + r.get("perf/checkpoint_s", 0.0) for r in self.records)


def run_job(ref: str, commit: str, flags: list[str], data: Path, root: Path, timeout_s: float) -> JobResult:
    """Clone, check out ``commit`` (``ref`` as resolved when the benchmark started), run the main job with ``flags``
    from the clone with a home of its own.

    Raises:
        RuntimeError: the clone failed, the job failed, ran past ``timeout_s`` or wrote no ``metrics.jsonl`` (the
            log's path, and the tail of a failed job's log).
    """
    from progpo.run.metrics import read_metrics

    clone, home = root / "repo", root / "home"
    home.mkdir(parents=True, exist_ok=True)
    for cmd in (["git", "clone", "--quiet", str(REPO), str(clone)], ["git", "-C", str(clone), "checkout", "--quiet", commit]):
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"{shlex.join(cmd)} failed: {done.stderr.strip()}")
    shared = root / "shared"  # ../shared beside the clone, as on a user's machine
    shared.mkdir(exist_ok=True)
    if not (shared / "data").exists():
        (shared / "data").symlink_to(data)
    env = {"HOME": str(home), "PROGPO_DATA": str(data)}
    log = root / "job.log"
    wall = run_logged(["bash", str(SCRIPT), *flags], log, timeout_s, cwd=clone, **env)
    try:
        records = read_metrics(clone / RUN_DIR)
    except FileNotFoundError as exc:
        raise RuntimeError(f"the job exited 0 but wrote no iteration ({exc}); log {log}") from None
    return JobResult(ref, commit[:7], flags, wall, records)


def report(results: list[JobResult]) -> str:
    """The tables of the module doc for ``results`` (the first is the reference of the ratio)."""
    lines = []
    for r in results:
        flags = f" {shlex.join(r.flags)}" if r.flags else ""
        lines.append(f"\n{r.ref} ({r.commit}){flags}: wall {r.wall_s:.0f} s, before the first "
                     f"iteration {r.setup_s:.0f} s")
        lines.append(f"{'iter':>4} {'iter_s':>7} {'gen_s':>7} {'upd_s':>7} {'valid':>6} {'flat':>5}")
        for k, m in enumerate(r.records, 1):
            lines.append(f"{k:>4} {m['perf/iteration_s'] + m.get('perf/checkpoint_s', 0.0):7.0f} "
                         f"{m['perf/generate_s']:7.1f} {m['perf/update_s']:7.1f} "
                         f"{1 - m['rollout/invalid_format_frac']:6.2f} {m['rollout/flat_group_frac']:5.2f}")
    first = results[0]
    lines.append("\n" + "; ".join(f"{r.ref}: {first.wall_s / r.wall_s:.2f}x faster than {first.ref}"
                                  for r in results[1:]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the jobs and print their tables (0; 2 on a bad flag; 1 when a job failed, naming it)."""
    parser = cli.settings_parser(MainJobBench, "python -m benchmarks main-job", __doc__.split("\n")[0])
    args = cli.parse(MainJobBench, parser, argv)
    runs = parse_runs(args.runs)  # checked by MainJobBench already
    try:
        commits = [resolve_commit(ref) for ref, _ in runs]  # once: a commit made while the runs go changes nothing
        data = data_dir(args.data)
    except (ValueError, FileNotFoundError) as exc:
        print(f"python -m benchmarks main-job: error: {exc}", file=sys.stderr)
        return 2
    print(f"main job benchmark | {len(runs)} runs | {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}", flush=True)
    results: list[JobResult] = []
    with tempfile.TemporaryDirectory(prefix="progpo-bench-main-") as tmp:
        root = Path(args.out).resolve() if args.out else Path(tmp)
        for k, ((ref, flags), commit) in enumerate(zip(runs, commits), 1):
            print(f"run {k}: {ref} ({commit[:7]}) {shlex.join(flags)} (started {time.strftime('%H:%M:%S')})", flush=True)
            try:
                results.append(run_job(ref, commit, flags, data, root / f"run{k}", args.timeout_s))
            except RuntimeError as exc:
                print(f"error: run {k} ({ref}): {exc}", file=sys.stderr)
                return 1
    print(report(results))
    print(f"\nload average at the end: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
