"""No measured figure lives in a source comment or docstring (issue 45, item 5): those point to the docs.

A measurement (a timing, a speed-up, a memory peak, a success count, an NLL reached, a GEMM rate) belongs in
the docs section that also gives its date, machine and command (docs/training.md, docs/distributed.md,
docs/estimators.md, docs/fidelity.md, docs/alfworld.md, docs/webshop.md, ...); a comment or docstring says
what the code does and why, and points to that section for the figure. Otherwise the figure goes stale in
the code while the docs are re-measured.

What is scanned: every comment (``tokenize``) and every module, class and function docstring (``ast``) of
the Python files under :data:`FOLDERS`, and the ``#`` comment lines of their shell scripts. (Field
docstrings of the settings dataclasses are flag help, checked by the ``--help`` diff, not here.)

The rule, :data:`MEASUREMENT_PATTERNS`: a text is flagged when it holds

* a duration after a verb of measuring: ``took 16 s``, ``takes 4-5 s``, ``costs ~75 s``, ``cost 60 ms``;
* an approximate duration (a setting is exact): ``(C++, ~75 s)``, ``~1.3 s reset``, ``~6-7 CPU-minutes``;
* a speed ratio: ``5.5x slower``, ``1.4-1.7x faster``;
* a rate of work: ``293 GFLOP/s``, ``180 tok/s``;
* a memory figure used as a measurement: ``~3 GB of memory``, ``fits in ~300 MB``, ``7.1 GB peak``;
* a result count or loss: ``won 1 of 64``, ``wins 40 of 256``, ``on 1 of 8 seeds``, ``0 of 48 times``,
  ``NLL 0.105``, ``fell from 1.354 to 0.296``, ``84-87% of the time``;
* an average or a simulation's outcome: ``needs 4.85 steps on average``, ``Simulated with ...: ... 47%``;
* ``measured`` with its figure: ``(measured: max |log-prob diff| 1.1``, ``measured here: ... 180``.

It stays narrow on purpose: a setting or a default is not a measurement, so ``timeout 300 s``, ``every 30 s``,
``SIGKILL after 5 s``, ``0.5 s doubling``, ``a 256 MiB fp32 copy``, ``<= 1.5x GiGPO and <= 250 ms`` (a target),
``the 5.1 GB file`` (a data size), an equation number or a paper's reported value pass. A figure a comment
must keep (a threshold the code uses, with its reason) is written so that none of the patterns reads it as
a result.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

from progpo.paths import REPO_ROOT

#: the folders whose comments and docstrings are held to the rule.
FOLDERS = ("progpo", "research", "benchmarks", "envs", "examples/scripts", "scripts")

_NUM = r"\d[\d,]*(?:\.\d+)?"
_RANGE = rf"~?{_NUM}(?:\s*-\s*{_NUM})?"
_TIME_UNIT = r"(?:ms|s|sec|seconds?|min|minutes?|h|hours?)\b"

#: name -> pattern (case-insensitive) of a measured figure; see the module docstring.
MEASUREMENT_PATTERNS: dict[str, re.Pattern[str]] = {
    name: re.compile(pattern, re.IGNORECASE)
    for name, pattern in {
        "timing": rf"\b(?:took|takes|take|cost|costs|ran in|runs in|lasted|spent)\s+(?:about\s+|only\s+)?"
                  rf"{_RANGE}\s*{_TIME_UNIT}",
        "approximate duration": rf"~{_RANGE}\s*(?:CPU-)?{_TIME_UNIT}",
        "speed ratio": rf"{_RANGE}\s*x\s+(?:faster|slower)\b",
        "work rate": rf"{_NUM}\s*(?:GFLOP|TFLOP|FLOP|tok|tokens|steps|episodes)/s\b",
        "memory": rf"(?:~{_NUM}\s*(?:GiB|GB|MiB|MB)\s+of\s+memory|fits in\s+~?{_NUM}\s*(?:GiB|GB|MiB|MB)"
                  rf"|{_NUM}\s*(?:GiB|GB|MiB|MB)\s+peak|peak\s+(?:RSS\s+)?(?:of\s+)?~?{_NUM}\s*(?:GiB|GB|MiB|MB))",
        "result count": rf"\b(?:won|wins|win|reaching|reached|answered\s+\w+)\s+(?:\w+\s+)?\d+\s+of\s+\d+"
                        rf"|\bon\s+\d+\s+of\s+\d+\s+seeds\b|\b\d+\s+of\s+\d+\s+times\b",
        "loss reached": rf"\bNLL\s+(?:of\s+|at\s+)?{_NUM}|\b(?:fell|rose|dropped|grew)\s+from\s+{_NUM}\s+to\s+{_NUM}",
        "share of the time": rf"{_RANGE}\s*%\s+of\s+the\s+time",
        "average measured": rf"\b(?:needs|takes|took|used|uses)\s+{_NUM}\s+\w+\s+on\s+average\b",
        "simulated with its figure": rf"\bsimulated\b.{{0,300}}?(?<![\w.-]){_NUM}\s*%",
        "measured with its figure": rf"\bmeasured\b[^.;:()]{{0,60}}:[^;)]*?(?<![\w.-]){_NUM}(?![\w-])",
    }.items()
}


def measured_figures(text: str) -> list[str]:
    """The measured figures ``text`` states: ``"<pattern name>: <matched text>"`` per match (empty: none)."""
    flat = " ".join(text.split())
    return [f"{name}: {m.group(0)}" for name, rx in MEASUREMENT_PATTERNS.items() for m in rx.finditer(flat)]


def _python_texts(path: Path) -> list[tuple[int, str]]:
    """``(line, text)`` of every comment and every module/class/function docstring of a Python file."""
    source = path.read_text(encoding="utf-8")
    out = [(tok.start[0], tok.string.lstrip("#:"))
           for tok in tokenize.generate_tokens(io.StringIO(source).readline) if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc is not None:
                out.append((node.body[0].lineno, doc))
    return out


def _shell_texts(path: Path) -> list[tuple[int, str]]:
    """``(line, text)`` of the ``#`` comment lines of a shell script (not the shebang, not ``#SBATCH``)."""
    out = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("#") and not stripped.startswith(("#!", "#SBATCH")):
            out.append((number, stripped.lstrip("#")))
    return out


def _scanned_files() -> list[Path]:
    files = []
    for folder in FOLDERS:
        for path in sorted((REPO_ROOT / folder).rglob("*")):
            if path.is_file() and path.suffix in (".py", ".sh", ".sbatch"):
                files.append(path)
    return files


def _findings() -> list[str]:
    out = []
    for path in _scanned_files():
        texts = _python_texts(path) if path.suffix == ".py" else _shell_texts(path)
        for line, text in texts:
            out += [f"{path.relative_to(REPO_ROOT)}:{line} {hit}" for hit in measured_figures(text)]
    return out


def test_the_scan_sees_comments_and_docstrings_of_every_folder():
    files = {p.relative_to(REPO_ROOT).as_posix() for p in _scanned_files()}
    assert {"progpo/run/agent_model.py", "research/survival.py", "benchmarks/webshop.py",
            "envs/webshop_server/catalog.py", "examples/scripts/run_local.sh", "scripts/install.sh"} <= files
    assert any("oneDNN runs bf16 GEMMs natively" in t for t in _python_texts_of("progpo/run/precision.py"))
    assert any("fp32 logits" in t for t in _python_texts_of("progpo/trainer/actor.py"))  # a comment


def _python_texts_of(relative: str) -> list[str]:
    return [text for _, text in _python_texts(REPO_ROOT / relative)]


def test_no_measured_figure_in_a_comment_or_docstring():
    found = _findings()
    assert not found, ("measured figures in comments/docstrings (move each to its docs section and point "
                       "there): " + "; ".join(found))


#: sentences this rule removed from the tree (issue 45), each of which it must flag.
PLANTED = (
    "one SFT epoch over 2,200 expert steps took 16 s (quiet machine)",
    "takes 4-5 s wall with 2 torch threads",
    "the same clone stalled at NLL 0.105 and won 1 of 64 unseen tasks",
    "it wins 40 of 256 episodes on unseen test tasks (0.156, sampled at T = 1)",
    "a dense solve of the ~100-node systems cost 60 ms per task here",
    "DeepSpeed builds FusedAdam (a C++ op, ~155 s compile on CPU)",
    "builds its shared-memory allreduce op (C++, ~75 s) on CPU",
    "building it costs ~75 s",
    "the full 376 MB unpack takes ~4 s",
    "a SmolLM2-135M forward 5.5x slower under autocast",
    "bf16 mixed precision (1.4-1.7x faster prefill and training where native)",
    "(measured: 1,787 vs 293 GFLOP/s fp32 on an AMX machine)",
    "(measured here: the same fp32 GEMM at 180 and 21 GFLOP/s a minute apart)",
    "logits stay those of the old weights (measured: max |log-prob diff| 1.1 after a sync)",
    "needs ~3 GB of memory for ours",
    "so the 1.18M-product file fits in ~300 MB",
    "GiGPO reaching 80% on 1 of 8 seeds",
    "answered in the valid format 84-87% of the time, where the base model answered validly 0 of 48 times",
    "the NLL per response token fell from 1.354 to 0.296",
    "a full run: 15 min 29 s wall, 7.1 GB peak RSS",
    "ALFWorld's ~1.3 s reset on 8 actors overlaps 8-fold",
    "opt-in, ~6-7 CPU-minutes",
    "WebShop 6 (its expert needs 4.85 steps on average)",
    "Simulated with a steady success rate p (no learning): without it, 47% at p = 0.02",
)


@pytest.mark.parametrize("text", PLANTED)
def test_a_planted_measurement_is_flagged(text):
    assert measured_figures(text), f"not flagged: {text!r}"


def test_a_planted_measurement_in_a_file_fails_the_scan(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text('"""A module."""\n\n\ndef f():\n    """Fast: it took 16 s here."""\n\n\n'
                       "x = 1  # 3.7x faster than before\n", encoding="utf-8")
    hits = [hit for _, text in _python_texts(planted) for hit in measured_figures(text)]
    assert len(hits) == 2, hits


#: settings, defaults, targets, units and sizes, which are not measurements.
NOT_MEASUREMENTS = (
    "timeout 300 s plus 0.25 s per MiB of the products file",
    "stage starts and otherwise at most every 30 s (mininterval 30 s)",
    "stop() terminates it (SIGTERM, then SIGKILL after 5 s)",
    "transport retries: connection errors only, backoff 0, 0.5, 1, 2, ... s",
    "ProGPO without embeddings <= 1.5x GiGPO and <= 250 ms; embedding time is reported separately",
    "the memory bandwidth (a 256 MiB fp32 copy, bytes read + written)",
    "the full items_shuffle.json (5.1 GB)",
    "Reward success_reward (default 10.0, as in GiGPO/verl-agent) on the step that wins, else 0.",
    "crbc_beta: CRBC's Bellman discount (the paper's 0.98, App. C.3)",
    "the update (sampled every 20 ms)",
    "peak = best mean of 3 consecutive iterations, final = mean of the last 5",
    "success rate with a 95% Wilson interval, mean return and length",
    "its logits measured on SmolLM2-135M, whose checkpoint is bf16: docs/training.md, \"Precision\"",
    "0/15 or 2/15 (seeds 5, 10): the collapsed seeds of runs",
)


@pytest.mark.parametrize("text", NOT_MEASUREMENTS)
def test_a_setting_or_default_is_not_flagged(text):
    assert not measured_figures(text)
