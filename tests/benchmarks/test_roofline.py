"""``python -m benchmarks roofline``'s work model on hand-computed values (the benchmark itself prints measured
figures)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from benchmarks.roofline import ModelShape, generation_work, prefill_work, same_samples, update_work

SHAPE = ModelShape(linear=10, layers=1, d_attn=2, kv_dim=2, hidden=3, vocab=4, weight_bytes=0, dtype=torch.float32)


def test_generation_counts_each_distinct_prompt_once_and_every_decode_position():
    steps = [((1, 2, 3), 2), ((1, 2, 3), 1), ((4, 5), 3)]  # two rollouts of one task share their first prompt
    g = generation_work(SHAPE, steps)
    # prefill of prompts of 3 and 2 tokens: 2*10*5 + 2*1*2*(9 + 4) + logits of 2 last positions 2*3*4*2
    assert g["prefill_flops"] == pytest.approx(100 + 52 + 48)
    # decode positions: step 1 one token at context 4, step 3 two at contexts 3 and 4 (sum 11)
    assert g["decode_flops"] == pytest.approx(2 * 10 * 3 + 2 * 1 * 2 * 22 + 2 * 3 * 4 * 3)
    assert g["decode_kv_bytes"] == pytest.approx(2 * 1 * 2 * 11 * 4)  # K and V of every context token, fp32
    assert (g["prompt_tokens"], g["distinct_prompt_tokens"], g["decode_tokens"]) == (8, 5, 3)
    bf16 = generation_work(SHAPE, steps, torch.bfloat16)  # mixed precision: the KV cache is held in bf16
    assert bf16["decode_kv_bytes"] == pytest.approx(2 * 1 * 2 * 11 * 2)
    assert bf16["decode_flops"] == g["decode_flops"]


def test_update_counts_log_prob_passes_and_the_training_pass():
    u = update_work(SHAPE, [(3, 2), (2, 1)], logprob_passes=1.5, train_forwards=3.0)
    fwd = 2 * 10 * 8 + 2 * 1 * 2 * (25 + 9) + 2 * 3 * 4 * 3  # sequences of 5 and 3 tokens, logits on 3 responses
    assert (u["logprobs_flops"], u["train_flops"]) == pytest.approx((1.5 * fwd, 3 * fwd))


def test_prefill_work_reads_the_generator_counters():
    stats = {"prompt_tokens": 5, "prefill_causal_sq": 18, "prefill_logit_rows": 2}
    assert prefill_work(SHAPE, stats) == pytest.approx(2 * 10 * 5 + 2 * 1 * 2 * 18 + 2 * 3 * 4 * 2)


def test_same_samples_compares_prompt_and_response_tokens_in_order():
    a = [SimpleNamespace(prompt_ids=[1, 2], response_ids=[3]), SimpleNamespace(prompt_ids=[1], response_ids=[4])]
    b = [SimpleNamespace(prompt_ids=[1, 2], response_ids=[3]), SimpleNamespace(prompt_ids=[1], response_ids=[5])]
    assert same_samples(a, b) == (1, 2)
    assert same_samples(a, a[:1]) == (1, 2)  # a missing step differs
