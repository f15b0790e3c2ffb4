"""The HF sampler samples from our ``SamplingParams`` only, whatever the checkpoint's generation_config says.

Issue 12, case 1: transformers back-fills a ``GenerationConfig`` from the model's
``generation_config.json`` (Qwen2.5-Instruct ships ``repetition_penalty`` 1.05-1.1), so every logits
processor the checkpoint names silently changed the sampling distribution while the recorded
log-probs claimed the policy's own. One test per processor kind: set it on the model's
``generation_config``, sample 48 tokens, and check that (a) the recorded log-probs equal
``sequence_logprobs`` on the same tokens (max abs diff <= 1e-4) and (b) the tokens are the ones a
clean config samples with the same seed.

The tiny model's ``lm_head`` is scaled x 8 (a peaked distribution, where penalties matter); for the
processors that act on EOS (min length, forced / length-decayed EOS) its EOS row is made as likely as
the favourite token, so that they have mass to move.
"""

from __future__ import annotations

import copy

import pytest
import torch

from progpo.agents.types import SamplingParams
from progpo.run.generation import HFGenerator
from progpo.run.logprobs import sequence_logprobs
from progpo.trainer.actor import pack_samples

N_TOKENS = 48
HALF_VOCAB = 2048  # the tiny vocabulary has ~4k tokens; banning the lower half moves a lot of mass


def _load(tiny_model, eos_likely: bool):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    prompt = tok.apply_chat_template([{"role": "user", "content": "go to cabinet 1 and take the apple"}],
                                     add_generation_prompt=True)["input_ids"]
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
        if eos_likely:  # EOS gets the logit of the first step's favourite token: p(EOS) ~ 0.4 per step
            top = int(model(torch.tensor([prompt])).logits[0, -1].argmax())
            model.lm_head.weight[tok.eos_token_id] = model.lm_head.weight[top]
    return model, tok, prompt


@pytest.fixture(scope="module")
def peaked(tiny_model):
    """(tiny model with lm_head x 8, tokenizer, prompt ids): the issue's reproducer model."""
    return _load(tiny_model, eos_likely=False)


@pytest.fixture(scope="module")
def eos_likely(tiny_model):
    """As ``peaked``, with EOS as likely as the favourite token (for processors that act on EOS)."""
    return _load(tiny_model, eos_likely=True)


# field -> value set on model.generation_config (the checkpoint's setting that must not reach the sampler)
PROCESSORS = {
    "repetition_penalty": lambda tok: 1.1,
    "no_repeat_ngram_size": lambda tok: 1,
    "min_new_tokens": lambda tok: N_TOKENS,
    "min_length": lambda tok: 10_000,
    "bad_words_ids": lambda tok: [[i] for i in range(3, HALF_VOCAB)],
    "suppress_tokens": lambda tok: list(range(3, HALF_VOCAB)),
    "begin_suppress_tokens": lambda tok: list(range(3, HALF_VOCAB)),
    "sequence_bias": lambda tok: {(i,): -5.0 for i in range(3, HALF_VOCAB)},
    "forced_eos_token_id": lambda tok: tok.eos_token_id,
    "exponential_decay_length_penalty": lambda tok: (1, 1.5),
    "top_k": lambda tok: 2,
    "top_p": lambda tok: 0.3,
    "min_p": lambda tok: 0.5,
    "typical_p": lambda tok: 0.2,
    "temperature": lambda tok: 0.3,
    "epsilon_cutoff": lambda tok: 0.05,
    "eta_cutoff": lambda tok: 0.05,
    # stopping settings: our responses stop at EOS or max_new_tokens only
    "stop_strings": lambda tok: ["a", "e", "o"],
    "max_length": lambda tok: 5,
}


def _sample(model, tok, prompt, seed=11):
    gen = HFGenerator(model, tok)
    sp = SamplingParams(max_new_tokens=N_TOKENS, seed=seed)
    return gen.generate_batch([prompt], [sp], [seed])[0]


def _max_logprob_gap(model, tok, prompt, g) -> float:
    t = pack_samples([(prompt, g.token_ids)], tok.pad_token_id)
    lp, _ = sequence_logprobs(model, t["input_ids"], t["attention_mask"], start=len(prompt))
    return float((lp[0, len(prompt):].detach() - torch.tensor(g.logprobs)).abs().max())


EOS_FIELDS = ("min_new_tokens", "min_length")  # act only while EOS is likely: the peaked model barely emits it
WARPERS = ("top_k", "top_p", "min_p", "typical_p", "temperature", "epsilon_cutoff", "eta_cutoff")


@pytest.mark.parametrize("field", sorted(PROCESSORS))
def test_checkpoint_generation_config_does_not_reach_the_sampler(request, field):
    model, tok, prompt = request.getfixturevalue("eos_likely" if field in EOS_FIELDS else "peaked")
    clean = _sample(model, tok, prompt)
    saved = copy.deepcopy(model.generation_config)
    try:
        setattr(model.generation_config, field, PROCESSORS[field](tok))
        if field in WARPERS:
            model.generation_config.do_sample = True  # warpers act only in sampling mode
        polluted = _sample(model, tok, prompt)
    finally:
        model.generation_config = saved
    assert len(polluted.token_ids) == len(polluted.logprobs) >= 1
    assert _max_logprob_gap(model, tok, prompt, polluted) <= 1e-4
    assert polluted.token_ids == clean.token_ids


def test_issue_reproducer_repetition_penalty_48_tokens(peaked):
    """The issue's exact reproducer: lm_head x 8, repetition_penalty 1.1, 48 tokens; was 0.988 off."""
    model, tok, prompt = peaked
    saved = copy.deepcopy(model.generation_config)
    try:
        model.generation_config.repetition_penalty = 1.1
        gen = HFGenerator(model, tok)
        gaps = []
        for seed in range(4):
            g = gen.generate_batch([prompt], [SamplingParams(max_new_tokens=N_TOKENS)], [seed])[0]
            gaps.append(_max_logprob_gap(model, tok, prompt, g))
    finally:
        model.generation_config = saved
    assert max(gaps) <= 1e-4, gaps


def test_ignored_checkpoint_settings_are_logged(peaked, caplog):
    model, tok, _ = peaked
    saved = copy.deepcopy(model.generation_config)
    try:
        model.generation_config.repetition_penalty = 1.05
        model.generation_config.top_k = 20
        with caplog.at_level("INFO", logger="progpo.run.generation"):
            HFGenerator(model, tok)
    finally:
        model.generation_config = saved
    assert "'repetition_penalty': 1.05" in caplog.text and "'top_k': 20" in caplog.text
    assert "ignored" in caplog.text
