"""The launch scripts run train_ray's own start-up checks (``--debug.check_only``) on their final command line before
Ray, the WebShop server or the job start: a value only train_ray checked used to pass the dry run and be refused
inside the submitted job, after the cluster and the server were up (``VLLM_NUM_ENGINES=8 VLLM_TP=2`` on 8 GPUs,
a NaN learning rate).

Each value train_ray refuses is refused by the dry run too, with train_ray's own line (and its hint), and nothing
is printed as a command to run.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "examples" / "scripts"
ONE_NODE = SCRIPTS / "train_progpo_alfworld.sh"
SLURM = SCRIPTS / "slurm_train_ray.sbatch"

#: (launch settings of the dry run, extra flags given to the script) -> the same values as train_ray flags
REFUSALS = [
    ({"VLLM_NUM_ENGINES": "8", "VLLM_TP": "2"}, [], ["--vllm.num_engines", "8", "--vllm.tensor_parallel_size", "2"]),
    ({"LR": "nan"}, [], ["--actor.adam.lr", "nan"]),
    ({"KL_COEF": "inf"}, [], ["--algo.kl.init_coef", "inf"]),
    ({"MAX_FAILED_FRAC": "1.5"}, [], ["--env.max_failed_frac", "1.5"]),
    ({}, ["--actor.max_norm", "nan"], ["--actor.max_norm", "nan"]),
    ({}, ["--actor.adam.lr", "-1e-5"], ["--actor.adam.lr", "-1e-5"]),
    ({}, ["--progpo.gamma", "2"], ["--progpo.gamma", "2"]),
    ({"MAX_PROMPT_TOKENS": "4096"}, [], ["--rollout.max_prompt_tokens", "4096"]),  # over --data.max_len 2560
]


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "PROGPO_DRY_RUN": "1", "GPUS_PER_NODE": "8", "NUM_NODES": "1",
            "OUTPUT_DIR": str(tmp_path / "run"), "PROGPO_REPO": str(REPO), **extra}


def _script(script: Path, env: dict[str, str], extra: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(script), *extra], capture_output=True, text=True, cwd=REPO, env=env,
                          timeout=300)


@pytest.fixture(scope="module")
def train_ray_lines(tmp_path_factory):
    """argv -> train_ray's own error and hint lines for it (``--debug.check_only``, in this process)."""
    from progpo.cli import train_ray

    parser = train_ray.build_parser()

    def lines(argv: list[str]) -> list[str]:
        err = io.StringIO()
        with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exc:
            train_ray.finalize(parser, parser.parse_args([*argv, "--debug.check_only"]))
        assert exc.value.code == 2
        text = err.getvalue().splitlines()
        return text[next(i for i, line in enumerate(text) if ": error: " in line):]

    return lines


@pytest.fixture(scope="module")
def good_commands(tmp_path_factory):
    """script -> the command line its dry run prints with the default settings (every check passed)."""
    out = {}
    for script in (ONE_NODE, SLURM):
        res = _script(script, _env(tmp_path_factory.mktemp(script.stem)), [])
        assert res.returncode == 0, res.stderr
        out[script] = res.stdout.splitlines()
    return out


# the SLURM script's dry run with the two values (it passes extra flags on as the one-node script does)
CASES = [(ONE_NODE, *r) for r in REFUSALS] + [(SLURM, *r) for r in REFUSALS[:2]]


@pytest.mark.parametrize("script, settings, extra, same", CASES,
                         ids=[f"{c[0].stem}-{' '.join(c[3])}" for c in CASES])
def test_each_value_train_ray_refuses_is_refused_by_the_dry_run_with_the_same_line(
        train_ray_lines, good_commands, tmp_path, script, settings, extra, same):
    argv = good_commands[script]
    assert argv[:3] == ["python3", "-m", "progpo.cli.train_ray"]
    expected = train_ray_lines([*argv[3:], *same])  # the script's command, the bad value last (argparse: it wins)
    res = _script(script, _env(tmp_path, **settings), extra)
    assert res.returncode == 2 and res.stdout == "", res.stderr
    assert res.stderr.splitlines() == expected
    assert expected[0].startswith("python -m progpo.cli.train_ray: error: argument --")


def test_a_refused_value_starts_no_server(tmp_path):
    """The one-node WebShop script outside a dry run: refused before the WebShop server starts (no log folder)."""
    logs = tmp_path / "logs"
    res = _script(SCRIPTS / "train_progpo_webshop.sh", _env(tmp_path, PROGPO_DRY_RUN="0", LR="inf",
                                                            PROGPO_LOG_DIR=str(logs), WEBSHOP_START_TIMEOUT="2"), [])
    assert res.returncode == 2 and res.stdout == "", res.stderr
    assert res.stderr.splitlines()[0] == ("python -m progpo.cli.train_ray: error: argument --actor.adam.lr must be a "
                                          "finite number > 0, got inf")
    assert not logs.exists() and not (tmp_path / "run").exists()


def test_the_check_writes_nothing(tmp_path):
    """``--debug.check_only`` on a good command line: exit 0, no task list, no run folder."""
    from progpo.cli import train_ray

    out = tmp_path / "run"
    assert train_ray.main(["--env.name", "alfworld", "--env.num_tasks", "4", "--rollout.n_samples_per_prompt", "2",
                           "--ckpt.path", str(out / "ckpt"), "--debug.check_only"]) == 0
    assert not out.exists()
