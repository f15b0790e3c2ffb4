"""``train --sft.num_tasks N``: behaviour cloning inside the train run, cached under a key of every
setting that shapes the cloned model, reused when nothing changed, never half-written.

Tiny model, 2 expert episodes, one epoch, on the shared WebShop server (seconds per clone)."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import os
from pathlib import Path

import pytest
import torch

from progpo.envs import spec
from progpo.trainer.warm_start import SFTArgs, cache_key

WARM = ["--sft.num_tasks", "2", "--sft.max_epochs", "1", "--sft.batch_size", "4",
        "--sft.lr", "1e-3"]
PROTOCOL = ["--actor.model_name_or_path", "tiny", "--env.max_steps", "8", "--rollout.max_new_tokens", "160",
            "--rollout.max_prompt_tokens", "384", "--rollout.batch_size", "1", "--rollout.n_samples_per_prompt", "2",
            "--train.num_iterations", "1", "--train.micro_batch_size", "4", "--logger.progress_bar", "false",
            "--logger.tensorboard_dir", "none"]


def _cfg(tmp_path, webshop_url, cache, *extra):
    from progpo.trainer.config import config_from_args

    return config_from_args([*PROTOCOL, *WARM, "--env.url", webshop_url, "--sft.cache_dir", str(cache),
                             "--ckpt.path", str(tmp_path / f"run{len(list(tmp_path.glob('run*')))}"), *extra])


def _warm(cfg, capsys=None):
    from progpo.run.env_setup import open_env_pool
    from progpo.trainer.warm_start import warm_start

    with open_env_pool(cfg.env, 2) as handle:
        return warm_start(cfg, handle)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("warm_cache")


def test_train_starts_rl_from_the_cloned_model(tmp_path, webshop_url, cache, capsys):
    from transformers import AutoModelForCausalLM

    from progpo.run.models import resolve_pretrain
    from progpo.trainer.loop import Trainer

    trainer = Trainer(_cfg(tmp_path, webshop_url, cache))
    history = trainer.fit()
    assert [m["iteration"] for m in history] == [1]
    folder = trainer.warm_start_path
    assert os.path.dirname(folder) == str(cache) and os.path.basename(folder).startswith("webshop-")
    out = capsys.readouterr().out
    assert "warm start: behaviour cloning on 2 expert episodes" in out and "expert: won" in out
    key = json.loads(open(os.path.join(folder, "warm_start_key.json")).read())
    assert key["settings"]["rollout"]["max_prompt_tokens"] == 384 and key["settings"]["env"]["max_steps"] == 8
    assert key["settings"]["sft"]["num_tasks"] == 2 and len(key["sha256"]) == 64
    summary = json.loads(open(os.path.join(folder, "sft_summary.json")).read())
    assert all(e["checkpoint"].startswith(folder) for e in summary["epochs"])  # no temporary path left in it
    cloned = AutoModelForCausalLM.from_pretrained(resolve_pretrain(folder)).state_dict()
    tiny = AutoModelForCausalLM.from_pretrained(resolve_pretrain("tiny")).state_dict()
    ref = trainer.actor.ref.state_dict()  # the KL reference is the cloned model, not the base
    assert all(torch.equal(ref[k], v) for k, v in cloned.items())
    assert any(not torch.equal(tiny[k], v) for k, v in cloned.items())
    assert not [p for p in cache.iterdir() if p.name.startswith(".tmp-")]


def test_same_settings_reuse_changed_settings_clone_again(tmp_path, webshop_url, cache, capsys):
    first = _warm(_cfg(tmp_path, webshop_url, cache))
    capsys.readouterr()
    stamp = os.stat(first / "sft_summary.json").st_mtime_ns
    assert _warm(_cfg(tmp_path, webshop_url, cache, "--train.num_iterations", "5")) == first  # RL-only setting
    assert "reusing" in capsys.readouterr().out and os.stat(first / "sft_summary.json").st_mtime_ns == stamp
    other = _warm(_cfg(tmp_path, webshop_url, cache, "--rollout.max_prompt_tokens", "320"))
    assert other != first and (other / "sft_summary.json").is_file()
    assert "behaviour cloning" in capsys.readouterr().out


def test_a_failed_clone_leaves_nothing_behind(tmp_path, webshop_url, monkeypatch):
    from progpo.trainer import warm_start

    cache = tmp_path / "cache"
    cache.mkdir()
    stale = cache / ".tmp-webshop-0123456789abcdef-999999999"  # a run that died (no such pid)
    stale.mkdir()

    def boom(*args, **kwargs):
        raise RuntimeError("killed mid-epoch")

    monkeypatch.setattr(warm_start, "sft_epoch", boom)  # the name the behaviour cloning calls
    with pytest.raises(RuntimeError, match="killed mid-epoch"):
        _warm(_cfg(tmp_path, webshop_url, cache, "--sft.max_epochs", "2"))
    assert [p.name for p in cache.iterdir()] == [stale.name]  # nothing of ours; a stale one of another key stays
    monkeypatch.undo()
    done = _warm(_cfg(tmp_path, webshop_url, cache, "--sft.max_epochs", "2", "--train.seed", "3"))
    assert (done / "sft_summary.json").is_file()
    assert sorted(p.name for p in cache.iterdir()) == sorted([stale.name, done.name])


def test_bad_warm_start_values_name_the_flag():
    from progpo.trainer.config import config_from_args

    for argv, flag in ((["--sft.num_tasks", "-1"], "--sft.num_tasks"),
                       (["--sft.lr", "0"], "--sft.lr"),
                       (["--sft.max_epochs", "0"], "--sft.max_epochs")):
        with pytest.raises(ValueError, match=f"^{flag}"):
            config_from_args(argv)


@pytest.mark.parametrize("env", ["webshop", "alfworld", "alfworld_like"])
def test_the_cache_key_holds_the_env_modules_that_shape_the_samples(tmp_path, env):
    """The template and syntax check live in the env's own module (issue 33): a change there must clone again,
    as a change in ``agents/templates.py`` does."""
    (tmp_path / "config.json").write_text("{}")
    args = SFTArgs()
    args = dataclasses.replace(args, env=dataclasses.replace(args.env, name=env))
    code = cache_key(args, str(tmp_path), {"data": 1})["code"]
    for field in ("template", "syntax", "expert"):
        module = getattr(spec(env), field).split(":")[0]
        source = Path(importlib.util.find_spec(module).origin).read_bytes()
        assert code[module] == hashlib.sha256(source).hexdigest()
    assert "agents/templates.py" in code and "agents/parsing.py" in code
