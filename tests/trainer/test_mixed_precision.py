"""Mixed precision (``--ds.mixed_precision bf16``) on the tiny random model, on any CPU (where bf16 is
emulated it is slow, not wrong): the weights and AdamW state stay fp32, behaviour cloning learns as in
fp32 (NLL per epoch within 5% on the same seed), and the generator's recorded log-probs stay close to the
trainer's behaviour log-probs of the same tokens."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from progpo.agents.types import SamplingParams
from progpo.run.generation import HFGenerator
from progpo.run.settings import TrainSettings
from progpo.trainer.settings import ActorSettings, AdamSettings, DeepSpeedSettings
from progpo.trainer.sft import mean_nll, sft_epoch
from progpo.trainer.update import TrainSample, rollout_mismatch


def _samples(seed: int = 0, n: int = 16) -> list[tuple[list[int], list[int]]]:
    g = np.random.default_rng(seed)  # a learnable target: each response repeats the prompt's last tokens
    out = []
    for _ in range(n):
        prompt = [int(t) for t in g.integers(3, 200, size=int(g.integers(6, 14)))]
        out.append((prompt, prompt[-4:] + [prompt[0]]))
    return out


def _actor(tiny_model, mixed: str):
    from progpo.trainer.actor import Actor, ActorConfig

    return Actor(ActorConfig(actor=ActorSettings(model_name_or_path=str(tiny_model), adam=AdamSettings(lr=3e-3)),
                             ds=DeepSpeedSettings(mixed_precision=mixed), train=TrainSettings(micro_batch_size=4),
                             use_ref=False))


def _clone(actor, epochs: int) -> list[float]:
    rng = np.random.default_rng(0)
    data = _samples()
    nll = [mean_nll(actor, data)]
    for _ in range(epochs):
        sft_epoch(actor, data, batch_size=8, rng=rng)
        nll.append(mean_nll(actor, data))
    return nll


def test_weights_and_adam_state_stay_fp32_and_learning_matches_fp32(tiny_model, caplog):
    with caplog.at_level(logging.INFO, logger="progpo.trainer.actor"):
        mixed = _actor(tiny_model, "bf16")
    assert "precision: bf16-mixed (--ds.mixed_precision bf16" in caplog.text
    assert mixed.precision.autocast
    plain = _actor(tiny_model, "off")
    assert not plain.precision.autocast
    nll_mixed, nll_plain = _clone(mixed, 4), _clone(plain, 4)
    assert nll_mixed[-1] < nll_mixed[0] - 1.0  # it learns (measured: 8.35 -> 6.54 nats in both precisions)
    for a, b in zip(nll_mixed, nll_plain):  # ... as fp32 does, epoch by epoch
        assert a == pytest.approx(b, rel=0.05), (nll_mixed, nll_plain)
    assert {p.dtype for p in mixed.model.parameters()} == {torch.float32}
    states = [v for st in mixed.optimizer.state.values() for v in st.values() if torch.is_tensor(v) and v.numel() > 1]
    assert states and {v.dtype for v in states} == {torch.float32}


def test_generator_and_trainer_log_probs_agree_under_mixed_precision(tiny_model):
    actor = _actor(tiny_model, "bf16")
    gen = HFGenerator(actor.model, actor.tokenizer, max_batch_size=8, seed=0, precision=actor.precision)
    prompts = [p for p, _ in _samples(1, n=6)]
    results = gen.generate_batch(prompts, [SamplingParams(temperature=1.0, max_new_tokens=12)] * len(prompts),
                                 list(range(len(prompts))))
    samples = [TrainSample(p, r.token_ids, 0.0, rollout_logprobs=torch.tensor(r.logprobs))
               for p, r in zip(prompts, results) if r.token_ids]
    for s, lp in zip(samples, actor.logprobs([(s.prompt_ids, s.response_ids) for s in samples])):
        s.old_logprobs = lp
    m = rollout_mismatch(samples)
    # left-padded KV-cached decode vs right-padded full pass, both with bf16 matmuls and an fp32 head
    assert m["rollout/ratio_dev_p50"] < 0.02 and m["rollout/ratio_dev_max"] < 0.1, m
    assert m["rollout/ratio_dev_max"] > 0  # bf16 did run (fp32 would agree to ~1e-6)


def _autocast_seen(model) -> list[tuple[bool, torch.dtype]]:
    """``(autocast on, its dtype)`` on CPU at every forward pass of ``model`` (read in the thread that runs it)."""
    seen: list[tuple[bool, torch.dtype]] = []
    model.register_forward_pre_hook(lambda *_: seen.append((torch.is_autocast_enabled("cpu"),
                                                             torch.get_autocast_dtype("cpu"))))
    return seen


@pytest.mark.parametrize("mixed, want", [("bf16", (True, torch.bfloat16)), ("off", (False, None))])
def test_the_run_s_generator_samples_in_the_actor_s_precision(tiny_model, mixed, want):
    """``make_generator`` (the generator a run builds) hands the actor's precision to generation: under
    ``--ds.mixed_precision bf16`` every prefill and decode pass runs under bf16 autocast, as the actor's own
    forward passes do, not in fp32; with it off, none does."""
    import asyncio

    from progpo.run.settings import RolloutSettings
    from progpo.trainer.rollout_backend import make_generator

    actor = _actor(tiny_model, mixed)
    gen = make_generator(RolloutSettings(), actor)
    assert gen.precision is actor.precision
    seen = _autocast_seen(actor.model)
    out = asyncio.run(gen([5, 6, 7, 8], SamplingParams(temperature=1.0, max_new_tokens=4, seed=3)))
    assert len(seen) >= len(out.token_ids)  # one prefill, a decode pass per further token
    assert {(on, dtype if on else None) for on, dtype in seen} == {want}
