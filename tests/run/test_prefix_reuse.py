"""Prompts that share a token prefix (a task's system prompt and task text) prefill it once and continue
from copies of its KV cache: the samples and recorded log-probs equal those of one prefill per row, for
every batch shape (left padding, suffixes of different lengths, one row, nothing shared)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from progpo.agents.types import SamplingParams
from progpo.run.generation import HFGenerator, plan_cost, prefix_plan
from progpo.run.logprobs import sequence_logprobs
from progpo.trainer.actor import pack_samples


@pytest.fixture(scope="module")
def model_and_tok():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from progpo.run.tiny_model import tiny_model_path

    path = tiny_model_path()
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval(), AutoTokenizer.from_pretrained(path)


# --- the plan, on hand-computed values ---------------------------------------------------------------------

HEAD = list(range(100, 120))  # 20 tokens every prompt starts with


def test_plan_prefills_the_prefix_every_prompt_shares_once():
    prompts = [HEAD + [30, 31], HEAD + [40], HEAD + [50, 51, 52]]
    plan = prefix_plan(prompts)
    assert plan == [[20, 20, 20], [22, 21, 23]]
    # one pass of 20 shared tokens, one of 3 rows x 3 columns, 8 for the second pass; one pass alone: 3 x 23
    assert plan_cost(prompts, plan) == 20 + 9 + 8
    assert plan_cost(prompts, [[22, 21, 23]]) == 69


def test_plan_groups_the_rollouts_of_each_task():
    x, y = list(range(200, 210)), list(range(300, 310))  # two tasks' texts after a 2-token head
    prompts = [[1, 2] + x + [7], [1, 2] + x + [8, 9], [1, 2] + y + [5], [1, 2] + y + [6]]
    # groups after nothing: 2 x 12 + 4 rows x 2 + 8 = 40; after the head: 2 + 2 x 10 + 4 x 2 + 16 = 46;
    # the head alone: 2 + 4 x 12 + 8 = 58; one pass: 4 x 14 = 56
    assert prefix_plan(prompts) == [[12, 12, 12, 12], [13, 14, 13, 13]]


def test_plan_is_one_pass_when_nothing_worth_sharing():
    assert prefix_plan([[1, 2], [3, 4, 5]]) == [[2, 3]]
    assert prefix_plan([HEAD]) == [[20]]  # one prompt
    assert prefix_plan([[1, 2, 3, 4], [1, 2, 3, 9]]) == [[4, 4]]  # 3 shared tokens: 3 + 2 + 8 > 8


def test_plan_refuses_an_empty_prompt():
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        prefix_plan([[1], []])


prompt_sets = st.lists(st.lists(st.integers(3, 40), min_size=0, max_size=3), min_size=1, max_size=4).flatmap(
    lambda groups: st.tuples(st.lists(st.integers(3, 40), max_size=12), st.just(groups),
                             st.lists(st.tuples(st.integers(0, max(len(groups) - 1, 0)),
                                                st.lists(st.integers(3, 40), min_size=1, max_size=6)),
                                      min_size=1, max_size=7)))


def _build(spec) -> list[list[int]]:
    """A batch from (head, group texts, rows of (group, suffix)): rows of a group share head + group text."""
    head, groups, rows = spec
    return [head + (groups[g] * 4 if groups else []) + suffix for g, suffix in rows]


@settings(max_examples=200, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(prompt_sets)
def test_plan_cuts_every_prompt_at_its_end_and_never_costs_more(spec):
    prompts = _build(spec)
    plan = prefix_plan(prompts)
    assert plan[-1] == [len(p) for p in prompts]
    for k in range(len(prompts)):
        cuts = [0] + [level[k] for level in plan]
        assert all(a <= b for a, b in zip(cuts, cuts[1:]))
        assert cuts[-2] < cuts[-1]  # a row's last pass holds its last token (its logits start the decode)
    assert plan_cost(prompts, plan) <= plan_cost(prompts, [[len(p) for p in prompts]])


# --- the samples ---------------------------------------------------------------------------------------------


def _both(model, tok, prompts, max_new_tokens=8, seed0=500):
    sp = [SamplingParams(max_new_tokens=max_new_tokens, seed=seed0 + k) for k in range(len(prompts))]
    reuse = HFGenerator(model, tok)
    plain = HFGenerator(model, tok, share_prefill=False, reuse_prefix=False)
    got = reuse.generate_batch(prompts, sp, [s.seed for s in sp])
    want = plain.generate_batch(prompts, sp, [s.seed for s in sp])
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    for g, w in zip(got, want):
        torch.testing.assert_close(torch.tensor(g.logprobs), torch.tensor(w.logprobs), rtol=0, atol=1e-5)
    return reuse, plain, got


def _chat(tok, system, user):
    return tok.apply_chat_template([{"role": "system", "content": system}, {"role": "user", "content": user}],
                                   add_generation_prompt=True)["input_ids"]


SYSTEM = "you are an expert agent shopping in the webshop environment. your task is to find a red shirt for women"


@pytest.mark.parametrize("users", [
    ["step 1 search", "step 1 click back to search now", "step 2 buy now", "step 1 search"],  # suffixes differ
    ["observation: you see a cabinet"],  # one row
    ["a", "a a a a a a a a a a a a a a a a a a a a a a a a a a a"],  # suffix lengths far apart
])
def test_prompts_sharing_a_system_prompt_sample_what_one_prefill_per_row_samples(model_and_tok, users):
    model, tok = model_and_tok
    prompts = [_chat(tok, SYSTEM, u) for u in users]
    reuse, plain, got = _both(model, tok, prompts)
    distinct = {tuple(p) for p in prompts}
    if len(distinct) > 1:  # the shared prefix was prefilled once: fewer real tokens than the distinct prompts hold
        assert reuse.stats["prefill_passes"] == 2
        assert reuse.stats["prompt_tokens"] < sum(len(p) for p in distinct)
    assert plain.stats["prompt_tokens"] == sum(len(p) for p in prompts)
    for p, g in zip(prompts, got):  # and what was recorded is what the update recomputes
        t = pack_samples([(p, g.token_ids)], tok.pad_token_id)
        lp, _ = sequence_logprobs(model, t["input_ids"], t["attention_mask"], start=len(p))
        torch.testing.assert_close(lp[0, len(p):], torch.tensor(g.logprobs), rtol=0, atol=1e-4)


def test_two_tasks_and_nothing_shared_sample_the_same(model_and_tok):
    model, tok = model_and_tok
    a = [_chat(tok, SYSTEM, f"step {k} observation: page {k}") for k in range(3)]
    b = [_chat(tok, "buy organic coffee, a pack of two please, price lower than 30 dollars", f"step {k}")
         for k in range(2)]
    reuse, _, _ = _both(model, tok, [a[0], b[0], a[1], b[1], a[2], a[0]])
    assert reuse.stats["prefill_passes"] >= 2
    reuse, _, _ = _both(model, tok, [[5, 6, 7], [8, 9], [10, 11, 12, 13]])  # no shared prefix: one pass
    assert reuse.stats["prefill_passes"] == 1


@settings(max_examples=15, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(prompt_sets)
def test_random_prompt_sets_sample_the_same_with_and_without_reuse(model_and_tok, spec):
    model, tok = model_and_tok
    _both(model, tok, [[t * 50 for t in p] for p in _build(spec)], max_new_tokens=4)


def test_the_same_suffix_after_two_task_prefixes_continues_its_own_prefix(model_and_tok):
    """Two tasks' rollouts whose last turns end alike: ``[7]`` and ``[8, 9]`` follow both ``x`` and ``y``. The
    plan cuts every row after its task text (12 tokens) and then at its end, so the second pass holds the
    segment ``[7]`` twice, once after each prefix: each row must continue the cache of its own prefix.
    Each row's samples and log-probs equal those of its own full prefill, alone in its batch, within 1e-6
    (a row continuing the other task's cache is off by about 0.1)."""
    model, tok = model_and_tok
    x, y = list(range(200, 210)), list(range(300, 310))
    prompts = [[1, 2] + x + [7], [1, 2] + x + [8, 9], [1, 2] + y + [7], [1, 2] + y + [8, 9]]
    assert prefix_plan(prompts) == [[12] * 4, [13, 14, 13, 14]]
    sp = [SamplingParams(max_new_tokens=6, seed=700 + k) for k in range(4)]
    reuse = HFGenerator(model, tok)
    got = reuse.generate_batch(prompts, sp, [s.seed for s in sp])
    for p, s, g in zip(prompts, sp, got):
        (alone,) = HFGenerator(model, tok, share_prefill=False, reuse_prefix=False).generate_batch([p], [s], [s.seed])
        assert g.token_ids == alone.token_ids
        # 1e-6 relative: one float32 ulp of these ~-8.5 log-probs is 9.5e-7 (measured: 0 or 1 ulp apart)
        torch.testing.assert_close(torch.tensor(g.logprobs), torch.tensor(alone.logprobs), rtol=1e-6, atol=1e-6)
    # x and y once each (12 tokens), then [7] and [8, 9] once after each of them
    assert reuse.stats["prefill_passes"] == 2 and reuse.stats["prompt_tokens"] == 2 * 12 + 2 * (1 + 2)


def test_work_counters_count_a_shared_prefix_once(model_and_tok):
    model, tok = model_and_tok
    prompts = [HEAD + [30, 31], HEAD + [40], HEAD + [50, 51, 52]]
    reuse, plain, _ = _both(model, tok, prompts, max_new_tokens=2)
    s = reuse.stats
    assert (s["prompt_tokens"], s["prefill_passes"], s["prefill_logit_rows"]) == (26, 2, 4)
    # 20 shared tokens: 20 x 21; then 2, 1 and 3 tokens after 20 each: 2 x 20 x r + r (r + 1)
    assert s["prefill_causal_sq"] == 420 + (80 + 6) + (40 + 2) + (120 + 12)
    assert (s["prefill_rows"], s["prefill_tokens"]) == (4, 20 + 3 * 3)
    p = plain.stats  # one pass of 3 rows, 23 columns: 22 x 23 + 21 x 22 + 23 x 24
    assert (p["prompt_tokens"], p["prefill_causal_sq"], p["prefill_tokens"]) == (66, 506 + 462 + 552, 69)
