"""The local generation backend: sampling semantics, logprobs, batching independence, EOS handling."""

from __future__ import annotations

import asyncio

import pytest
import torch

from progpo.agents.types import SamplingParams
from progpo.run.generation import HFGenerator, request_seed
from progpo.run.logprobs import sequence_logprobs
from progpo.trainer.actor import pack_samples


@pytest.fixture(scope="module")
def model_and_tok(tiny_model):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    return model, tok


def _prompt(tok, text):
    return tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)["input_ids"]


def test_tiny_model_and_tokenizer(model_and_tok):
    model, tok = model_and_tok
    assert 3500 <= len(tok) <= 4096
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert model.config.hidden_size == 64 and model.config.num_hidden_layers == 2


def test_logprobs_match_model_and_batch_does_not_change_samples(model_and_tok):
    model, tok = model_and_tok
    gen = HFGenerator(model, tok, max_batch_size=8)
    prompts = [_prompt(tok, f"go to cabinet {i}") for i in range(3)] + [_prompt(tok, "a much longer prompt " * 5)]
    sp = [SamplingParams(max_new_tokens=10, seed=100 + i) for i in range(4)]
    batched = gen.generate_batch(prompts, sp, [s.seed for s in sp])
    single = [gen.generate_batch([p], [s], [s.seed])[0] for p, s in zip(prompts, sp)]
    assert [b.token_ids for b in batched] == [s.token_ids for s in single]
    for p, g in zip(prompts, batched):
        assert len(g.token_ids) == len(g.logprobs) >= 1
        t = pack_samples([(p, g.token_ids)], tok.pad_token_id)
        lp, _ = sequence_logprobs(model, t["input_ids"], t["attention_mask"], start=len(p))
        assert torch.allclose(lp[0, len(p):], torch.tensor(g.logprobs), atol=1e-4)


def test_seeded_sampling_is_reproducible_and_varies(model_and_tok):
    model, tok = model_and_tok
    gen = HFGenerator(model, tok)
    p = _prompt(tok, "look")

    async def run(seeds):
        return await asyncio.gather(*(gen(p, SamplingParams(max_new_tokens=8, seed=s)) for s in seeds))

    a = asyncio.run(run([1, 2, 3, 4]))
    b = asyncio.run(run([1, 2, 3, 4]))
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    assert len({tuple(g.token_ids) for g in a}) > 1
    assert gen.stats["requests"] == 8 and gen.stats["calls"] <= 4  # concurrent requests were batched


def test_low_temperature_is_near_greedy(model_and_tok):
    model, tok = model_and_tok
    gen = HFGenerator(model, tok)
    p = _prompt(tok, "open drawer 1")
    cold = gen.generate_batch([p], [SamplingParams(temperature=0.01, max_new_tokens=6)], [5])[0]
    greedy = model.generate(torch.tensor([p]), do_sample=False, max_new_tokens=6, eos_token_id=gen.eos_ids,
                            pad_token_id=gen.pad_id)[0, len(p):].tolist()
    assert cold.token_ids == greedy[: len(cold.token_ids)]
    assert all(lp > -0.01 for lp in cold.logprobs)  # at T=0.01 the argmax holds almost all mass


def test_stops_at_first_eos_inclusive(model_and_tok):
    model, tok = model_and_tok
    gen = HFGenerator(model, tok)
    p = _prompt(tok, "take apple")
    sp = SamplingParams(max_new_tokens=12)
    free_gen = gen.generate_batch([p], [sp], [9])[0]
    free = free_gen.token_ids
    assert len(free) == 12 and free_gen.finish_reason == "length"  # no EOS: cut at max_new_tokens
    stop = free[3]
    gen.eos_ids = [stop]  # pretend the 4th sampled token is an end-of-sequence token
    cut = gen.generate_batch([p], [sp], [9])[0]
    k = free.index(stop)
    assert cut.token_ids == free[: k + 1] and len(cut.logprobs) == k + 1
    assert cut.finish_reason == "stop"


def test_a_request_s_stop_token_ids_stop_that_row_only(model_and_tok):
    """``SamplingParams.stop_token_ids`` (vLLM's; the CPU engine passes a request's on) join the generator's stop
    set for their own request: the other row of the batch, and the samples before the stop, are unchanged."""
    model, tok = model_and_tok
    gen = HFGenerator(model, tok)
    p = _prompt(tok, "take apple")
    free = gen.generate_batch([p], [SamplingParams(max_new_tokens=12)], [9])[0].token_ids
    assert len(free) == 12 and not set(free) & set(gen.eos_ids)
    stop = free[4]
    k = free.index(stop)
    cut, other = gen.generate_batch([p, p], [SamplingParams(max_new_tokens=12, stop_token_ids=(stop,)),
                                             SamplingParams(max_new_tokens=12)], [9, 9])
    assert (cut.token_ids, cut.finish_reason) == (free[: k + 1], "stop")
    assert (other.token_ids, other.finish_reason) == (free, "length")


def test_rows_stop_at_their_own_limit(model_and_tok):
    model, tok = model_and_tok
    gen = HFGenerator(model, tok)
    p = _prompt(tok, "take apple")
    sp = [SamplingParams(max_new_tokens=3), SamplingParams(max_new_tokens=9)]
    short, long = gen.generate_batch([p, p], sp, [9, 9])
    assert (len(short.token_ids), short.finish_reason) == (3, "length")
    assert short.token_ids == long.token_ids[:3] and len(long.token_ids) == 9


def test_request_seed_distinct():
    assert request_seed(1, [1, 2], 0) != request_seed(1, [1, 2], 1) != request_seed(2, [1, 2], 1)


def test_a_stop_request_ends_the_decode_at_its_next_token(model_and_tok, monkeypatch):
    # SIGTERM / Ctrl-C used to wait for the whole batch (minutes on CPU): the decode thread only
    # ended at max_new_tokens. Here the stop arrives during the prefill forward pass.
    from progpo.run.generation import GenerationStopped, clear_stop, request_stop

    model, tok = model_and_tok
    gen = HFGenerator(model, tok)
    calls = []
    forward = model.forward

    def forward_then_stop(*args, **kwargs):
        calls.append(1)
        request_stop()
        return forward(*args, **kwargs)

    monkeypatch.setattr(model, "forward", forward_then_stop)
    try:
        with pytest.raises(GenerationStopped, match="after 0 of up to 200 tokens"):
            gen.generate_batch([_prompt(tok, "look")], [SamplingParams(max_new_tokens=200)], [0])
        assert len(calls) == 1  # the prefill only, no decode step
    finally:
        clear_stop()
    monkeypatch.setattr(model, "forward", forward)
    assert len(gen.generate_batch([_prompt(tok, "look")], [SamplingParams(max_new_tokens=4)], [0])[0].token_ids) >= 1


def test_sigterm_handler_requests_the_stop_and_unwinds():
    import os
    import signal

    from progpo.run.process import unwind_on_sigterm
    from progpo.run import generation

    old = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    try:
        unwind_on_sigterm()
        with pytest.raises(SystemExit) as exc:
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1000):  # the handler runs in the main thread at the next bytecode
                pass
        assert exc.value.code == 128 + signal.SIGTERM
        assert generation._STOP.is_set()
    finally:
        signal.signal(signal.SIGTERM, old[0])
        signal.signal(signal.SIGINT, old[1])
        generation.clear_stop()
