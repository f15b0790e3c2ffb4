"""The precision choice (``--ds.mixed_precision``): detection from injected CPU flags (so it is tested on
machines without native bf16 too), the resolution table, the autocast context, the fp32 output head, and
the generator-vs-trainer log-prob mismatch metric (hand-computed values)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from progpo.run.precision import (FP32, MIXED_PRECISION_CHOICES, Bf16Capability, bf16_capability, fp32_output_head,
                                  resolve_precision)
from progpo.trainer.settings import DeepSpeedSettings
from progpo.trainer.update import TrainSample, rollout_mismatch

# torch.cpu.get_capabilities() of the two machines named in issue 35 (the flags that matter; the rest False)
AVX2_EPYC = {"cpu_name": "AMD EPYC", "avx2": True, "avx512_f": False, "avx512_bf16": False, "amx_bf16": False}
AVX512_BF16_EPYC = {"cpu_name": "AMD EPYC", "avx2": True, "avx512_f": True, "avx512_bf16": True, "amx_bf16": False}
AMX_XEON = {"cpu_name": "Intel Xeon", "avx2": True, "avx512_f": True, "avx512_bf16": True, "amx_bf16": True}


@pytest.mark.parametrize("caps, native, words", [
    (AVX2_EPYC, False, "AMD EPYC: no amx_bf16 or avx512_bf16"),
    (AVX512_BF16_EPYC, True, "AMD EPYC: avx512_bf16"),
    (AMX_XEON, True, "Intel Xeon: amx_bf16, avx512_bf16"),
    ({"amx_bf16": True}, True, "CPU: amx_bf16"),
    ({}, False, "CPU: no amx_bf16 or avx512_bf16"),
])
def test_cpu_capability_is_read_from_the_flags(caps, native, words):
    cap = bf16_capability("cpu", capabilities=caps)
    assert cap == Bf16Capability(native, "cpu", words)


def test_this_machines_capability_is_torchs_own_reading():
    caps = torch.cpu.get_capabilities()
    assert bf16_capability().native == bool(caps.get("amx_bf16") or caps.get("avx512_bf16"))


def test_cuda_capability_and_a_bad_device():
    assert bf16_capability("cuda", cuda_bf16=True).native
    assert not bf16_capability("cuda", cuda_bf16=False).native
    with pytest.raises(ValueError, match="device_type must be 'cpu' or 'cuda', got 'mps'"):
        bf16_capability("mps")


@pytest.mark.parametrize("setting, param_dtype, native", list(itertools.product(("auto", "off"), ("fp32", "bf16"),
                                                                                  (False, True))))
def test_resolution_table(setting, param_dtype, native):
    cap = Bf16Capability(native, "cpu", "test CPU")
    p = resolve_precision(setting, param_dtype=param_dtype, capability=cap)
    assert not p.autocast  # auto: bf16 matmuls lose sub-spacing fine-tuning steps (measured), so fp32 everywhere
    assert p.name == ("bf16-mixed" if p.autocast else "fp32")
    assert p.reason  # printed at start-up
    if setting == "auto" and param_dtype == "fp32":
        assert "test CPU" in p.reason and ("native" if native else "emulated") in p.reason


@pytest.mark.parametrize("native", [False, True])
def test_bf16_is_forced_even_where_emulated_and_says_so(native):
    p = resolve_precision("bf16", capability=Bf16Capability(native, "cpu", "test CPU"))
    assert p.autocast and p.name == "bf16-mixed"
    assert ("emulated" in p.reason) == (not native)


def test_bad_settings_name_the_flag_and_value():
    with pytest.raises(ValueError, match=r"--ds.mixed_precision must be one of auto, bf16, off, got 'fp16'"):
        resolve_precision("fp16")
    with pytest.raises(ValueError, match=r"--ds.param_dtype must be fp32 or bf16, got 'fp16'"):
        resolve_precision("auto", param_dtype="fp16")
    with pytest.raises(ValueError, match=r"--ds.mixed_precision bf16 .* --ds.param_dtype bf16"):
        resolve_precision("bf16", param_dtype="bf16")
    assert MIXED_PRECISION_CHOICES == ("auto", "bf16", "off")


def test_the_context_is_autocast_bf16_only_under_mixed_precision():
    with resolve_precision("bf16", capability=Bf16Capability(False, "cpu", "x")).context():
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
        assert (torch.ones(2, 3) @ torch.ones(3, 2)).dtype == torch.bfloat16
    with FP32.context():
        assert not torch.is_autocast_enabled("cpu")
        assert (torch.ones(2, 3) @ torch.ones(3, 2)).dtype == torch.float32


def test_flags_parse_and_refuse(tmp_path):
    from progpo.run.flags import FlagError
    from progpo.trainer.config import config_from_args

    assert config_from_args([]).ds.mixed_precision == "auto"  # the CLI's default
    cfg = config_from_args(["--ds.mixed_precision", "off"])
    assert cfg.actor_config(1).ds.mixed_precision == "off"
    with pytest.raises(FlagError, match=r"^--ds.mixed_precision bf16 .* --ds.param_dtype bf16"):
        config_from_args(["--ds.mixed_precision", "bf16", "--ds.param_dtype", "bf16"])
    with pytest.raises(SystemExit):
        config_from_args(["--ds.mixed_precision", "fp16"])


def test_actor_config_refuses_an_unknown_setting():
    from progpo.trainer.actor import ActorConfig

    with pytest.raises(ValueError, match=r"--ds.mixed_precision must be one of auto, bf16, off, got 'yes'"):
        ActorConfig(ds=DeepSpeedSettings(mixed_precision="yes"))


def test_fp32_output_head_gives_fp32_logits_under_autocast(tiny_model_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).eval()
    ids = torch.arange(3, 19).reshape(2, 8)
    with torch.no_grad():
        plain = model(input_ids=ids).logits
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert model(input_ids=ids).logits.dtype == torch.bfloat16  # what autocast does to the head by itself
        keys = sorted(model.state_dict())
        fp32_output_head(model)
        fp32_output_head(model)  # idempotent
        assert sorted(model.state_dict()) == keys
        torch.testing.assert_close(model(input_ids=ids).logits, plain, rtol=0, atol=0)  # outside autocast: unchanged
        with torch.autocast("cpu", dtype=torch.bfloat16):
            mixed = model(input_ids=ids).logits
    assert mixed.dtype == torch.float32
    assert not torch.equal(mixed, plain)  # the body did run in bf16
    torch.testing.assert_close(mixed, plain, rtol=0, atol=0.1)


def test_rollout_mismatch_hand_computed():
    s1 = TrainSample([1], [2, 3], 1.0, old_logprobs=torch.tensor([math.log(1.1), 0.0]),
                     rollout_logprobs=torch.tensor([0.0, 0.0]))
    s2 = TrainSample([1], [4], 1.0, old_logprobs=torch.tensor([-1.0]), rollout_logprobs=torch.tensor([-1.0 - math.log(0.7)]))
    s3 = TrainSample([1], [5], 1.0, old_logprobs=torch.tensor([0.0]))  # no rollout log-probs: left out
    m = rollout_mismatch([s1, s2, s3])
    # |w - 1| per token: 0.1, 0.0, 0.3 (w = 1.1, 1, 0.7) -> median 0.1, max 0.3
    assert m["rollout/ratio_dev_p50"] == pytest.approx(0.1, abs=1e-6)
    assert m["rollout/ratio_dev_max"] == pytest.approx(0.3, abs=1e-6)
    assert m["rollout/ratio_dev_p99"] == pytest.approx(0.1 + 0.98 * 0.2, abs=1e-6)  # linear between 0.1 and 0.3
    assert m["rollout/mismatch_kl"] == pytest.approx((-math.log(1.1) + 0.0 - math.log(0.7)) / 3, abs=1e-6)  # mean of rollout - old
    assert rollout_mismatch([s3]) == {}
    with pytest.raises(ValueError, match=r"rollout_logprobs has shape \(1,\) but old_logprobs \(2,\)"):
        rollout_mismatch([TrainSample([1], [2, 3], 0.0, old_logprobs=torch.zeros(2), rollout_logprobs=torch.zeros(1))])


@pytest.fixture(scope="module")
def tiny_model_path():
    from progpo.run.tiny_model import tiny_model_path as path

    return path()


@pytest.mark.parametrize("setting", ["auto", "off", "bf16"])
def test_the_warm_start_cache_key_holds_the_resolved_precision(tmp_path, monkeypatch, setting):
    """The key holds the precision cloning really runs in: bf16 matmuls clone another model than fp32."""
    import dataclasses

    from progpo.run import precision
    from progpo.trainer.warm_start import SFTArgs, _key_digest, cache_key

    (tmp_path / "config.json").write_text("{}")
    args = SFTArgs()
    args = dataclasses.replace(args, ds=dataclasses.replace(args.ds, mixed_precision=setting))
    keys = {}
    for native in (False, True):
        monkeypatch.setattr(precision, "bf16_capability",
                            lambda device_type="cpu", native=native: Bf16Capability(native, device_type, "test CPU"))
        keys[native] = cache_key(args, str(tmp_path), {"data": 1})
    expected = {"auto": ("fp32", "fp32"), "off": ("fp32", "fp32"), "bf16": ("bf16-mixed", "bf16-mixed")}[setting]
    assert (keys[False]["precision"], keys[True]["precision"]) == expected
    assert (_key_digest(keys[False]) == _key_digest(keys[True])) == (expected[0] == expected[1])
