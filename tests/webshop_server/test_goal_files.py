"""Issue 12, case 12: empty splits and bad human-goal files give clear errors, never a 500 or a traceback."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import requests

from envs.webshop_server.process import WebShopServerProcess
from progpo.envs.base import EnvFailure
from progpo.envs.webshop import WebShopEnv
from progpo.paths import REPO_ROOT


@pytest.fixture(scope="module")
def tiny_server(webshop_dir):
    """4 products -> 1 synthetic goal: train 1, eval 0, test 0."""
    with WebShopServerProcess(data_dir=webshop_dir, num_products=4, threads=4) as srv:
        yield srv


def test_empty_split_answers_4xx_naming_split_and_size(tiny_server):
    assert requests.get(f"{tiny_server.url}/health").json()["splits"] == {"train": 1, "eval": 0, "test": 0}
    for body in ({"split": "test", "seed": 0}, {"split": "eval", "index": 0}):
        r = requests.post(f"{tiny_server.url}/api/sessions", json=body, timeout=10)
        assert r.status_code == 409, r.text  # was 500 (randrange of an empty range)
        msg = r.json()["error"]
        assert f"split {body['split']!r} has no goals" in msg and "train 1, eval 0, test 0" in msg
    assert requests.post(f"{tiny_server.url}/api/sessions", json={"split": "train", "seed": 0}).status_code == 201


@pytest.mark.parametrize("kwargs", [{"seed": 0}, {"index": 0}])
def test_client_reset_on_empty_split_is_an_env_failure(tiny_server, kwargs):
    env = WebShopEnv(tiny_server.url)
    with pytest.raises(EnvFailure, match="split 'test' has no goals"):  # was a bare ValueError
        env.reset(split="test", **kwargs)
    obs, _ = env.reset(split="train", **kwargs)  # the env stays usable
    assert "Instruction" in obs
    env.close()


def _data_with_human_file(webshop_dir, tmp_path, content: str):
    data = tmp_path / "data"
    data.mkdir()
    for name in ("items_shuffle_prefix.json", "items_ins_v2_1000.json"):
        (data / name).symlink_to(webshop_dir / name)
    (data / "items_human_ins.json").write_text(content)
    return data


def _start(data, *args: str) -> subprocess.CompletedProcess:
    """Run the server CLI until it fails (or 60 s); the tests here expect it to fail fast."""
    cmd = [sys.executable, "-m", "envs.webshop_server", "--data-dir", str(data), "--port", "0",
           *args]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=str(REPO_ROOT))
    except subprocess.TimeoutExpired as e:  # started serving: the test expected an error
        raise AssertionError(f"server did not stop: {e.stdout}{e.stderr}") from None


GOOD = {"instruction": "i want tea.", "instruction_attributes": ["natural"], "instruction_options": []}


@pytest.mark.parametrize("content, expected", [
    ('{"B06Y3VLDFB": [', "not valid JSON"),
    (json.dumps({"B06Y3VLDFB": [GOOD, {"instruction": "no attributes key"}]}),
     "entry 'B06Y3VLDFB'[1]: missing 'instruction_attributes'"),
    (json.dumps({"B06Y3VLDFB": {"instruction": "not a list"}}), "entry 'B06Y3VLDFB': expected a list"),
    (json.dumps(["not", "an", "object"]), "expected a JSON object"),
])
@pytest.mark.parametrize("goal_source", ["auto", "human"])
def test_malformed_human_goals_file_gives_one_line_naming_it(webshop_dir, tmp_path, content, expected, goal_source):
    data = _data_with_human_file(webshop_dir, tmp_path, content)
    done = _start(data, "--goal-source", goal_source)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr  # was a raw traceback that did not name the file
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, done.stderr
    assert str(data / "items_human_ins.json") in errors[0] and expected in errors[0]


def test_placeholder_human_goals_file_falls_back_to_synthetic_with_auto(webshop_dir, tmp_path):
    data = _data_with_human_file(webshop_dir, tmp_path, "{}")
    with WebShopServerProcess(data_dir=data, threads=4) as srv:  # was: exit 1
        health = requests.get(f"{srv.url}/health").json()
        assert health["goal_source"] == "synthetic" and health["num_goals"] == 489
        assert "WARNING" in srv.log_tail() and "items_human_ins.json" in srv.log_tail()
    done = _start(data, "--goal-source", "human")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "0 usable human goals" in done.stderr and str(data / "items_human_ins.json") in done.stderr
