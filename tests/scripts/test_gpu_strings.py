"""The GPUs per node that the launch scripts read from what SLURM (or the user) writes.

``lib/train_args.sh``'s ``progpo_gpu_count NAME VALUE`` is the one place where a GPU string becomes a
count. SLURM sets ``SLURM_GPUS_PER_NODE`` to the ``--gpus-per-node`` value as typed (``src/common/env.c``,
``set_env_from_opts``): ``N``, ``TYPE:N``, or a comma list ``TYPE:N,TYPE:M`` (sbatch(1): "Multiple
options can be requested in a comma separated list, for example: --gpus-per-node=volta:3,kepler:1"),
and ``SLURM_GPUS_ON_NODE`` to a plain count (``gres_common.c``); ``--gres`` style ``gpu:N`` /
``gpu:TYPE:N`` is taken too. Anything else is refused in one line naming the variable and the value.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

REPO = Path(__file__).resolve().parents[2]
LIB = REPO / "examples" / "scripts" / "lib" / "train_args.sh"
SLURM = REPO / "examples" / "scripts" / "slurm_train_ray.sbatch"


def _count(name: str, value: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", f'source "{LIB}"; progpo_gpu_count "$0" "$1"', name, value],
                          capture_output=True, text=True)


@pytest.mark.parametrize("value, gpus", [
    ("8", 8), ("h100:8", 8), ("gpu:h100:8", 8), ("gpu:8", 8), ("volta:3,kepler:1", 4),
    ("a100:4,h100:4", 8), ("nvidia_h100_80gb_hbm3:8", 8), ("1g.10gb:7", 7), ("a100-sxm4-80gb:2", 2),
    ("08", 8), ("0", 0), ("gpu:h100:4,gpu:a100:2", 6),
])
def test_every_form_slurm_writes_gives_the_count(value, gpus):
    res = _count("SLURM_GPUS_PER_NODE", value)
    assert (res.returncode, res.stdout.strip(), res.stderr) == (0, str(gpus), "")


@pytest.mark.parametrize("value", [
    "", "h100", "h100:", ":8", "8,", ",8", "8,,8", "h100:8(x2)", "8(x2)", "eight", "-1", "8.0", " 8", "8 ",
    "h100:8:2", "gres/gpu:h100=8", "h100=8", "12345", "8\n8", "gpu:h100:8;rm -rf /",
])
def test_anything_else_is_one_line_naming_the_variable_and_value(value):
    res = _count("SLURM_GPUS_PER_NODE", value)
    assert res.returncode == 2 and res.stdout == ""
    lines = res.stderr.splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("progpo: SLURM_GPUS_PER_NODE=") and "not a GPU count" in lines[0]
    if re.fullmatch(r"[\w:().,-]+", value):
        assert f"'{value}'" in lines[0]


_TYPE = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.+-", min_size=1,
                max_size=12)
_ITEM = st.tuples(st.sampled_from(["", "gpu:"]), st.one_of(st.none(), _TYPE), st.integers(0, 64),
                  st.integers(0, 2))


@settings(max_examples=60, deadline=None)
@given(items=st.lists(_ITEM, min_size=1, max_size=4))
def test_any_list_of_typed_counts_sums(items):
    """Any comma list of ``[gpu:][TYPE:]N`` (N with leading zeros too) gives the sum of its counts."""
    parts = []
    for gres, kind, n, zeros in items:
        count = "0" * zeros + str(n)
        parts.append(count if kind is None else f"{gres}{kind}:{count}")
    res = _count("SLURM_GPUS_PER_NODE", ",".join(parts))
    assert (res.returncode, res.stdout.strip()) == (0, str(sum(n for *_, n, _ in items))), res.stderr


_GRAMMAR = re.compile(r"((gpu:)?[A-Za-z0-9_.+-]+:)?[0-9]{1,4}(,((gpu:)?[A-Za-z0-9_.+-]+:)?[0-9]{1,4})*")


@settings(max_examples=60, deadline=None)
@given(value=st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                     max_size=16))
def test_any_text_is_a_count_or_one_line_naming_it(value):
    """Any text (all of Unicode but NUL): the count when it is in the grammar, else exit 2 and one line."""
    res = _count("GPUS_PER_NODE", value)
    if _GRAMMAR.fullmatch(value):
        assert res.returncode == 0 and int(res.stdout) == sum(int(p.rsplit(":", 1)[-1]) for p in value.split(","))
    else:
        assert res.returncode == 2 and res.stdout == "", (value, res.stdout)
        assert len(res.stderr.splitlines()) == 1 and res.stderr.startswith("progpo: GPUS_PER_NODE="), res.stderr


def _slurm_dry_run(**env) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") and k != "GPUS_PER_NODE"}
    return subprocess.run(["bash", str(SLURM)], capture_output=True, text=True, cwd="/",
                          env=dict(clean, PROGPO_DRY_RUN="1", PROGPO_REPO=str(REPO), NUM_NODES="2", **env))


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


@pytest.mark.parametrize("env, gpus", [
    ({"SLURM_GPUS_PER_NODE": "h100:4"}, "4"),           # the typed GRES (was read as 8: the default)
    ({"SLURM_GPUS_PER_NODE": "volta:3,kepler:1"}, "4"),  # sbatch(1)'s comma list
    ({"SLURM_GPUS_ON_NODE": "2"}, "2"),                 # --gres=gpu:h100:2 sets no SLURM_GPUS_PER_NODE
    ({"GPUS_PER_NODE": "h100:8"}, "8"),                 # was: "h100:8: syntax error in expression"
    ({}, "8"),
])
def test_the_slurm_script_reads_the_allocations_gpus(env, gpus):
    res = _slurm_dry_run(**env)
    assert res.returncode == 0, res.stderr
    argv = res.stdout.splitlines()
    assert _flag(argv, "--actor.num_gpus_per_node") == gpus and _flag(argv, "--ref.num_gpus_per_node") == gpus
    assert int(_flag(argv, "--vllm.num_engines")) == 2 * int(gpus)


@pytest.mark.parametrize("name", ["SLURM_GPUS_PER_NODE", "SLURM_GPUS_ON_NODE", "GPUS_PER_NODE"])
def test_the_slurm_script_stops_in_one_line_on_a_string_it_cannot_read(name):
    res = _slurm_dry_run(**{name: "h100:8(x2)"})
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.splitlines() == [f"progpo: {name}='h100:8(x2)' is not a GPU count per node "
                                       "(N, TYPE:N, gpu:TYPE:N, or a comma list of them)"]
