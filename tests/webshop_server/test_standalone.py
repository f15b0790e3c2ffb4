"""The server stands alone: it imports no training code, and where it keeps its own copy of a rule
the training package also applies (data folder search, action normalisation) the two agree."""

from __future__ import annotations

import subprocess
import sys

import pytest
import requests
from hypothesis import given, settings
from hypothesis import strategies as st

from envs.webshop_server.engine import normalize_action as server_rule
from progpo.envs.base import normalize_action as agent_rule
from progpo.paths import REPO_ROOT
from progpo_tests.patience import PATIENCE_S


def test_server_modules_import_no_training_code():
    code = ("import sys, envs.webshop_server.app, envs.webshop_server.shop, envs.webshop_server.process, "
            "envs.webshop_server.synth, envs.webshop_server.__main__; "
            "bad = sorted(m for m in sys.modules if m == 'progpo' or m.startswith('progpo.')); "
            "print(bad); sys.exit(1 if bad else 0)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True,
                         timeout=PATIENCE_S)
    assert out.returncode == 0, out.stdout + out.stderr


@settings(deadline=None)
@given(st.text(alphabet=st.sampled_from(list("aB c\t\n\u00a0\u2003[]|/-Xé")), max_size=30))
def test_normalize_action_is_the_agents_rule(text):
    assert server_rule(text) == agent_rule(text)


@pytest.mark.parametrize("setting", ["env", "shared", "cache"])
def test_default_data_dir_is_the_training_packages_rule(setting, monkeypatch, tmp_path):
    import envs.webshop_server.paths as server_paths
    import progpo.paths as train_paths

    monkeypatch.delenv("PROGPO_DATA", raising=False)
    if setting == "env":
        monkeypatch.setenv("PROGPO_DATA", str(tmp_path / "data"))
    elif setting == "cache":  # no ../shared/data beside either checkout root
        monkeypatch.setattr(server_paths, "CHECKOUT_ROOT", tmp_path / "a" / "repo")
        monkeypatch.setattr(train_paths, "REPO_ROOT", tmp_path / "a" / "repo")
    assert server_paths.default_data_dir() == train_paths.data_root() / "webshop"


def test_goal_endpoint_serves_the_goal_a_session_plays(server):
    created = requests.post(f"{server.url}/api/sessions", json={"goal_index": 7}, timeout=PATIENCE_S)
    assert created.status_code == 201
    goal = requests.get(f"{server.url}/api/goals/7", timeout=PATIENCE_S).json()
    assert {"asin", "instruction_text", "goal_options", "price_upper"} <= set(goal)
    assert " ".join(goal["instruction_text"].split()) in " ".join(created.json()["observation"].split())
    missing = requests.get(f"{server.url}/api/goals/99999999", timeout=PATIENCE_S)
    assert missing.status_code == 404 and "out of range" in missing.json()["error"]
