"""Small parts on the training path (issue 33, item 5): no function of the episode loop, the advantages, the
update or the OpenRLHF glue is over 80 lines (``def`` line to last line, docstring included).

Walks every module of these packages with ``ast``; a long function fails here with its file, line and length,
to be split into well-named pieces.
"""

from __future__ import annotations

import ast

from progpo.paths import REPO_ROOT

#: the packages of the training path.
TRAINING_PATH = ("progpo/agents", "progpo/advantages", "progpo/run", "progpo/trainer", "progpo/openrlhf")
MAX_LINES = 80


def _long_functions() -> list[str]:
    out = []
    for package in TRAINING_PATH:
        for path in sorted((REPO_ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    lines = node.end_lineno - node.lineno + 1
                    if lines > MAX_LINES:
                        out.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    return out


def test_the_walk_sees_the_training_path():
    seen = {p.relative_to(REPO_ROOT).as_posix() for pkg in TRAINING_PATH for p in (REPO_ROOT / pkg).rglob("*.py")}
    assert {"progpo/trainer/update.py", "progpo/agents/episode.py", "progpo/openrlhf/samples.py",
            "progpo/advantages/progpo.py", "progpo/run/settings.py"} <= seen


def test_no_function_on_the_training_path_is_over_80_lines():
    long = _long_functions()
    assert not long, f"functions over {MAX_LINES} lines (split them): " + "; ".join(long)
