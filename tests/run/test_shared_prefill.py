"""Identical prompts in one generate batch (a task's N rollouts at step 0) are prefilled once and their KV
cache copied to each row: the samples and recorded log-probs equal those of a prefill per row."""

from __future__ import annotations

import pytest
import torch

from progpo.agents.types import SamplingParams
from progpo.run.generation import HFGenerator
from progpo.run.logprobs import sequence_logprobs
from progpo.trainer.actor import pack_samples


@pytest.fixture(scope="module")
def model_and_tok():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from progpo.run.tiny_model import tiny_model_path

    path = tiny_model_path()
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval(), AutoTokenizer.from_pretrained(path)


def _prompt(tok, text):
    return tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)["input_ids"]


def test_shared_prefill_gives_the_samples_of_one_prefill_per_row(model_and_tok):
    model, tok = model_and_tok
    a, b = _prompt(tok, "find a red shirt for women"), _prompt(tok, "buy organic coffee, a pack of two please")
    prompts = [a, a, b, a, b, b]  # two tasks, rows interleaved
    sp = [SamplingParams(max_new_tokens=12, seed=100 + k) for k in range(len(prompts))]
    shared = HFGenerator(model, tok, share_prefill=True)
    plain = HFGenerator(model, tok, share_prefill=False)
    got = shared.generate_batch(prompts, sp, [s.seed for s in sp])
    want = plain.generate_batch(prompts, sp, [s.seed for s in sp])
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    for g, w in zip(got, want):
        torch.testing.assert_close(torch.tensor(g.logprobs), torch.tensor(w.logprobs), rtol=0, atol=1e-5)
    assert len({tuple(g.token_ids) for g in got}) > 2  # rows of one prompt still sample apart (own seeds)
    assert (shared.stats["prefill_rows"], plain.stats["prefill_rows"]) == (2, 6)
    assert shared.stats["prompt_tokens"] == len(a) + len(b)
    for p, g in zip(prompts, got):  # and what was recorded is what the update recomputes
        t = pack_samples([(p, g.token_ids)], tok.pad_token_id)
        lp, _ = sequence_logprobs(model, t["input_ids"], t["attention_mask"], start=len(p))
        torch.testing.assert_close(lp[0, len(p):], torch.tensor(g.logprobs), rtol=0, atol=1e-4)
