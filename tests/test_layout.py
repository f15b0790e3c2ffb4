"""The product's import graph runs one way, with no cycle between packages or modules (design: cli -> backends -> run ->
agents -> envs -> advantages); the research harness (``research/``, ``benchmarks/``) sits outside the ``progpo``
package and imports the product, never the reverse; the WebShop server imports no training code.

Walks every module's imports with ``ast`` (top-level and function-level ``import`` statements alike).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from progpo.paths import REPO_ROOT

#: layer of each sub-package: a module may import its own package and lower layers only.
LAYERS = {
    "progpo.bounds": -1,  # the declared ranges of number settings: imports nothing, any layer declares them
    "progpo.paths": 0, "progpo_tests.patience": 0, "progpo.advantages": 0,
    "progpo.envs": 1, "progpo.agents": 2, "progpo.run": 3,
    "progpo.trainer": 4, "progpo.openrlhf": 4,
    "progpo.cli": 5,
    # outside the product package: the speed benchmarks, then the lab (its dispatcher is benchmarks.cli's)
    "benchmarks": 6, "research": 7,
}
#: the only modules of the training package that may import the WebShop server (they start it).
STARTS_THE_SERVER = {"progpo.run.env_setup", "benchmarks.webshop"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return {m for m in out if m.split(".")[0] in ROOTS}


def _package(module: str) -> str | None:
    return next((p for p in sorted(LAYERS, key=len, reverse=True) if module == p or module.startswith(p + ".")), None)


#: the import roots: the product package, the WebShop server, the research harness and the test-only helpers.
ROOTS = ("progpo", "envs", "benchmarks", "research", "progpo_tests", "tests")
GRAPH = {_module_name(p): _imports(p) for root in ("progpo", "envs", "benchmarks", "research")
         for p in (REPO_ROOT / root).rglob("*.py")}


def test_the_product_imports_no_research_benchmark_or_test_code():
    """``progpo`` is what a trainer user installs: the lab, the benchmarks and the test helpers sit beside it."""
    out = sorted(f"{m} -> {t}" for m, ts in GRAPH.items() if m.split(".")[0] in ("progpo", "envs") for t in ts
                 if t.split(".")[0] in ("benchmarks", "research", "progpo_tests", "tests"))
    assert not out, out


def test_the_product_package_holds_no_research_or_test_only_module():
    """The lab and benchmarks live in top-level folders; loop references and test patience under tests/support."""
    product = {p.name for p in (REPO_ROOT / "progpo").iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert product == {"advantages", "agents", "cli", "envs", "openrlhf", "run", "trainer"}, product
    assert not (REPO_ROOT / "progpo" / "testing.py").exists()
    assert not (REPO_ROOT / "progpo" / "advantages" / "reference.py").exists()


def test_every_package_has_a_layer():
    missing = sorted({m for m in GRAPH if m.split(".")[0] != "envs" and m != "progpo" and _package(m) is None})
    assert not missing, f"add these to LAYERS: {missing}"


def test_no_import_runs_back_up():
    up = []
    for mod, targets in GRAPH.items():
        src = _package(mod)
        if src is None:
            continue
        for target in targets:
            dst = _package(target)
            if dst is not None and dst != src and LAYERS[dst] >= LAYERS[src]:
                up.append(f"{mod} -> {target}")
    assert not up, "imports against the layer order:\n" + "\n".join(sorted(up))


def test_no_package_cycle():
    edges = {p: set() for p in LAYERS}
    for mod, targets in GRAPH.items():
        src = _package(mod)
        for target in targets:
            dst = _package(target)
            if src and dst and src != dst:
                edges[src].add(dst)

    def reaches(a: str, b: str, seen: set[str]) -> bool:
        return any(n == b or (n not in seen and reaches(n, b, seen | {n})) for n in edges[a])

    cycles = sorted(p for p in edges if reaches(p, p, set()))
    assert not cycles, f"packages on an import cycle: {cycles}"


def module_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module of ``graph`` (module -> the modules it
    imports, at any level; an import of a package's submodule is an edge to that submodule only)."""
    edges = {m: sorted(t for t in targets if t in graph and t != m) for m, targets in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []
    for root in sorted(edges):  # Tarjan's algorithm, iterative (no recursion limit)
        if root in index:
            continue
        work = [(root, iter(edges[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        x = stack.pop()
                        comp.append(x)
                        if x == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
            elif w not in index:
                index[w] = low[w] = len(index)
                stack.append(w)
                work.append((w, iter(edges[w])))
            elif w in stack:
                low[v] = min(low[v], index[w])
    return out


def test_no_module_cycle():
    """Not even through a function-level import (trainer.loop <-> trainer.warm_start once was one)."""
    assert module_cycles(GRAPH) == []


def test_the_cycle_check_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c", "x.attr"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert module_cycles(graph) == [["a", "b", "c"]]


@pytest.mark.parametrize("pair", [("progpo.openrlhf.cpu.engine", "progpo.openrlhf.cpu.launch"),
                                  ("progpo.openrlhf.cpu.runtime", "progpo.openrlhf.cpu.engine")])
def test_cpu_mode_modules_import_downward_only(pair):
    low, high = pair
    assert not any(t == high or t.startswith(high + ".") for t in GRAPH[low]), f"{low} imports {high}"


def test_the_server_imports_no_training_code_and_is_imported_only_where_it_is_started():
    server_out = sorted(f"{m} -> {t}" for m, ts in GRAPH.items() if m.startswith("envs.") for t in ts
                        if t.split(".")[0] == "progpo")
    assert not server_out, server_out
    server_in = sorted(m for m, ts in GRAPH.items() if m.startswith("progpo.")
                       and any(t.startswith("envs.webshop_server") for t in ts))
    assert set(server_in) <= STARTS_THE_SERVER, server_in
