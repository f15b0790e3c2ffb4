"""Each environment owns its facts (issue 33): the registry points into the env's own modules, code outside
them never branches on an env's name, and the facts are one query away for the launch scripts."""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
from pathlib import Path

import pytest

from progpo.cli import envs as envs_cli
from progpo.envs import env_ids, spec
from progpo.envs.spec import REF_FIELDS, EnvSpec, replace_spec
from progpo.paths import REPO_ROOT

MAX_UPWARD = 4
"""At most this many ``"module:attr"`` references of the registry point up out of ``progpo.envs`` (issue 33 item 4)."""


def upward_refs(specs: list[EnvSpec]) -> list[str]:
    """``id.field = module:attr`` of every reference (one per spec field) into a ``progpo`` package other than
    ``progpo.envs``: a higher layer (agents, run, ...) that the env's facts live in instead of its own module."""
    return [f"{s.id}.{name} = {ref}" for s in specs for name in REF_FIELDS
            if (ref := getattr(s, name)) is not None and ref.startswith("progpo.")
            and not ref.startswith("progpo.envs.")]


def test_ref_fields_are_every_field_that_names_code():
    """A new ``"module:attr"`` field of the spec is counted too: every one the specs fill is in REF_FIELDS."""
    named = {f.name for name in env_ids() for f in dataclasses.fields(EnvSpec)
             if isinstance(v := getattr(spec(name), f.name), str) and v.count(":") == 1 and "." in v.split(":")[0]}
    assert named == set(REF_FIELDS)


def test_at_most_four_registry_references_point_up_out_of_the_envs():
    up = upward_refs([spec(name) for name in env_ids()])
    assert len(up) <= MAX_UPWARD, "\n".join(up)
    for name in env_ids():  # the template and syntax check each env needs live in an env module
        for field in ("template", "syntax"):
            assert getattr(spec(name), field).startswith("progpo.envs."), (name, field)


def test_the_upward_count_sees_a_reference_into_agents_or_run():
    base = replace_spec("alfworld_like", expert="progpo.envs.synthetic.env:synthetic_expert")
    assert upward_refs([base]) == []
    bad = [replace_spec("alfworld_like", template="progpo.agents.templates:T", syntax="progpo.agents.parsing:ok",
                        summary="progpo.run.evaluation:s")] * 2
    assert len(upward_refs(bad)) == 6 > MAX_UPWARD


def _own_files() -> set[Path]:
    """Where an env's facts may name it: the registry (``progpo/envs/__init__.py``), every env module a spec
    points into (with the whole subpackage when it is one, as ``progpo/envs/synthetic``), and the WebShop
    server (``envs/``, the env's own server)."""
    own = {REPO_ROOT / "progpo" / "envs" / "__init__.py"}
    for name in env_ids():
        for field in REF_FIELDS:
            ref = getattr(spec(name), field)
            if ref is None or not ref.startswith("progpo.envs."):
                continue
            path = Path(importlib.util.find_spec(ref.split(":")[0]).origin)
            own |= set(path.parent.rglob("*.py")) if path.parent.name != "envs" else {path}
    return own


def env_name_branches(source: str, names: set[str]) -> list[int]:
    """Lines of ``source`` that compare something with an env id: ``==``/``!=``/``is``/``in`` against the id
    or a literal collection holding it, ``match`` cases on it, ``.startswith``/``.endswith`` with it."""

    def names_it(node: ast.AST) -> bool:
        if isinstance(node, ast.Constant):
            return node.value in names if isinstance(node.value, str) else False
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return any(names_it(e) for e in node.elts)
        return False

    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(names_it(n) for n in (node.left, *node.comparators)):
            lines.append(node.lineno)
        elif isinstance(node, ast.MatchValue) and names_it(node.value):
            lines.append(node.lineno)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ("startswith", "endswith") and any(names_it(a) for a in node.args)):
            lines.append(node.lineno)
    return sorted(lines)


@pytest.mark.parametrize("code, lines", [
    ('if env_name != "webshop":\n    pass', [1]),
    ('x = name == "alfworld"', [1]),
    ('x = 1\ny = name in ("webshop", "sokoban")', [2]),
    ('match name:\n    case "alfworld_like":\n        pass', [2]),
    ('x = name.startswith("webshop")', [1]),
    ('x = name == "sokoban"\ny = {"webshop": 1}\nz = "alfworld"', []),
])
def test_the_branch_finder_finds_each_form(code, lines):
    assert env_name_branches(code, set(env_ids())) == lines


def test_no_code_outside_an_env_module_branches_on_an_env_name():
    """The lab (``research/``, outside the product) is not searched: its synthetic task families are named as the
    envs they imitate (``--family alfworld``), and its fidelity study's ``--mode alfworld`` picks its own
    real-ALFWorld experiment."""
    names, own = set(env_ids()), _own_files()
    offenders = []
    for root in ("progpo", "examples", "scripts"):
        for path in sorted((REPO_ROOT / root).rglob("*.py")):
            if path in own:
                continue
            offenders += [f"{path.relative_to(REPO_ROOT)}:{n}"
                          for n in env_name_branches(path.read_text(encoding="utf-8"), names)]
    assert not offenders, offenders


def test_the_spec_query_prints_each_field_one_a_line(capsys):
    assert envs_cli.main(["get", "alfworld", "max_steps", "eval_split", "service", "splits", "reports_score"]) == 0
    s = spec("alfworld")
    assert capsys.readouterr().out.split("\n")[:-1] == [str(s.max_steps), s.eval_split, "", " ".join(s.splits),
                                                        "false"]
    assert envs_cli.main(["get", "webshop", "train_split", "pool"]) == 0
    assert capsys.readouterr().out == f"{spec('webshop').train_split}\n{spec('webshop').pool}\n"
    assert envs_cli.main(["list"]) == 0
    assert capsys.readouterr().out.split() == list(env_ids())


@pytest.mark.parametrize("argv, says", [(["get", "sokoban", "max_steps"], "unknown env 'sokoban'; registered:"),
                                        (["get", "webshop", "steps"], "unknown spec field(s) ['steps']; known:")])
def test_the_spec_query_names_an_unknown_env_or_field_in_one_line(argv, says, capsys):
    assert envs_cli.main(argv) == 2
    out = capsys.readouterr()
    assert out.out == "" and len(out.err.splitlines()) == 1 and says in out.err


@pytest.mark.parametrize("env, server", [("webshop", "envs.webshop_server:main"), ("webshop", "python -m x"),
                                         ("webshop_like", "envs.webshop_server")])
def test_a_server_is_a_module_of_an_env_with_a_service(env, server):
    """``server`` is what the launch scripts run as ``python3 -m``; its URL reaches the env through its service."""
    with pytest.raises(ValueError, match=f"EnvSpec '{env}': server must be a module name"):
        replace_spec(env, server=server)
    assert replace_spec("webshop", server="a.b_c").server == "a.b_c"
