"""Local generation backend: a transformers causal LM behind the async ``GenerateFn`` contract.

``HFGenerator`` is awaited by the episode loop once per step and episode. Concurrent requests are
collected by a small batching queue and run as one left-padded decode in a worker thread, so that
many episodes share one forward pass while their environments step.

Sampling is the policy's own temperature / top-p distribution, drawn by Gumbel-max with one
``torch.Generator`` per request (seeded from the request's seed, or from the iteration seed, the
prompt and its occurrence count). A response therefore depends on its own seed and prompt, not on
which other requests happened to share its batch, which makes rollouts reproducible (``--ckpt.load_enable``).

The prefill computes what the prompts of a batch share once (vLLM's prefix caching, within a batch):
identical prompts are one row, and a token prefix that different prompts share (the system prompt and
task of a task's rollouts) is one forward pass whose ``DynamicCache`` rows are copied to the prompts that
continue it (:func:`prefix_plan`, :meth:`HFGenerator._prefill`).

The decode loop calls the model's forward pass directly (KV cache, no ``model.generate``):
``generate`` back-fills its ``GenerationConfig`` from the checkpoint's ``generation_config.json``
(``repetition_penalty``, ``no_repeat_ngram_size``, ``min_new_tokens``, ``bad_words_ids``,
``suppress_tokens``, ``sequence_bias``, forced EOS, stop strings, ...), and a field whose neutral
value is ``None`` cannot be pinned against that back-fill. Here nothing stands between the logits
and the sample but our ``SamplingParams``, so the recorded log-probs are exactly
those ``sequence_logprobs`` recomputes. Of the checkpoint's generation config only ``eos_token_id``
is read (as extra stop tokens); settings that would have changed sampling are logged once as ignored.

A response stops at the first token of the stop set (``progpo.agents.stop_tokens.stop_token_ids``: the
tokenizer's and the generation config's EOS, and the end-of-turn token the chat template writes, which can
differ from EOS) or of its request's ``SamplingParams.stop_token_ids``.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import torch

from progpo.agents.stop_tokens import stop_token_ids
from progpo.agents.templates import decode_response
from progpo.agents.types import Generation, SamplingParams
from progpo.run.precision import FP32, Precision

logger = logging.getLogger(__name__)

_STOP = threading.Event()


class GenerationStopped(RuntimeError):
    """A decode was abandoned because the process was asked to stop (:func:`request_stop`)."""


def request_stop() -> None:
    """Ask every running decode of this process to stop at its next token (signal handlers call this).

    A decode runs in a worker thread; without this, SIGTERM or Ctrl-C waited for the whole batch
    (minutes on CPU) before the process could unwind.
    """
    _STOP.set()


def clear_stop() -> None:
    """Undo :func:`request_stop` (tests; a process that keeps running)."""
    _STOP.clear()


@dataclass
class _Request:
    prompt_ids: list[int]
    sampling: SamplingParams
    seed: int
    future: asyncio.Future = field(repr=False)


# GenerationConfig fields that change what is sampled or where a response stops; the checkpoint's
# values are ignored here (logged once), because the sampler follows our SamplingParams only.
IGNORED_GENERATION_FIELDS = (
    "do_sample", "temperature", "top_k", "top_p", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff",
    "top_h", "repetition_penalty", "encoder_repetition_penalty", "no_repeat_ngram_size",
    "encoder_no_repeat_ngram_size", "bad_words_ids", "sequence_bias", "suppress_tokens",
    "begin_suppress_tokens", "forced_bos_token_id", "forced_eos_token_id", "min_length", "min_new_tokens",
    "exponential_decay_length_penalty", "guidance_scale", "renormalize_logits", "remove_invalid_values",
    "watermarking_config", "max_length", "max_new_tokens", "stop_strings", "num_beams",
)


def ignored_generation_settings(generation_config) -> dict:
    """The checkpoint's non-default ``IGNORED_GENERATION_FIELDS`` (what a user might expect to apply)."""
    if generation_config is None:
        return {}
    diff = generation_config.to_diff_dict()
    return {k: diff[k] for k in IGNORED_GENERATION_FIELDS if diff.get(k) is not None}


class _GumbelSampler:
    """Samples one token per row (temperature, top-p) from raw logits and records its logprob.

    Recorded logprob: ``log softmax(logits / T)`` at the sampled token (the temperature-scaled policy
    before top-p truncation; with ``top_p = 1`` the quantity vLLM reports with ``processed_logprobs``).
    """

    def __init__(self, temperatures: list[float], top_ps: list[float], seeds: list[int]) -> None:
        self.t = torch.tensor(temperatures, dtype=torch.float32).unsqueeze(1)
        self.top_p = top_ps
        self.gens = [torch.Generator().manual_seed(int(s)) for s in seeds]
        self.logprobs: list[list[float]] = [[] for _ in seeds]

    def __call__(self, scores: torch.Tensor) -> torch.Tensor:
        """``scores [n, V]`` raw next-token logits -> ``[n]`` sampled token ids (logprobs appended)."""
        logp = torch.log_softmax(scores.float() / self.t.to(scores.device), dim=-1)
        sample_logp = logp.clone()
        for row, p in enumerate(self.top_p):
            if p < 1.0:
                sorted_lp, idx = torch.sort(logp[row], descending=True)
                cum = sorted_lp.exp().cumsum(0)
                drop = cum - sorted_lp.exp() >= p  # tokens whose preceding mass already reaches p
                sample_logp[row, idx[drop]] = float("-inf")
        vocab = scores.shape[-1]
        noise = torch.stack([torch.rand(vocab, generator=g) for g in self.gens]).to(scores.device)
        gumbel = -torch.log(-torch.log(noise.clamp_min(1e-20)))
        choice = torch.argmax(sample_logp + gumbel, dim=-1)
        for row, tok in enumerate(choice.tolist()):
            self.logprobs[row].append(float(logp[row, tok]))
        return choice


def request_seed(iteration_seed: int, prompt_ids: list[int], occurrence: int) -> int:
    """A 63-bit seed from (iteration seed, prompt tokens, how many times this prompt was seen before)."""
    h = hashlib.blake2b(digest_size=8)
    h.update(np.asarray([iteration_seed, occurrence], dtype=np.int64).tobytes())
    h.update(np.asarray(prompt_ids, dtype=np.int64).tobytes())
    return int.from_bytes(h.digest(), "little") >> 1


MIN_SHARED_PREFIX = 8
"""Fewest tokens a group of prompts must share (beyond what every prompt of the batch shares) to be
prefilled once as a group by :func:`prefix_plan`."""

LEVEL_COST_TOKENS = 8
"""What :func:`prefix_plan` charges for each forward pass beyond the first, in padded tokens per pass
(a pass's fixed cost: kernel launches and the per-layer overhead, roughly that of a few tokens on CPU)."""


def _common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common token prefix of ``a`` and ``b``."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def plan_cost(prompts: list[list[int]], plan: list[list[int]]) -> int:
    """Padded tokens the forwards of ``plan`` compute (see :func:`prefix_plan`), plus ``LEVEL_COST_TOKENS``
    per pass after the first: the sum over levels of (distinct segments) x (longest segment)."""
    cost = LEVEL_COST_TOKENS * (len(plan) - 1)
    for li, cuts in enumerate(plan):
        nodes = {(tuple(level[k] for level in plan[: li + 1]), tuple(p[: cuts[k]])) for k, p in enumerate(prompts)}
        start = plan[li - 1] if li else [0] * len(prompts)
        cost += len(nodes) * max(c - s for c, s in zip(cuts, start))
    return cost


def _groups(prompts: list[list[int]], order: list[int], base: int, min_shared: int) -> list[tuple[list[int], int]]:
    """Contiguous groups of the sorted prompts ``order`` and each group's shared prefix length.

    A dynamic program over the lexicographic order (the prompts under one trie node are contiguous
    there) that maximises the prefill tokens saved, ``sum (|g| - 1) (cut_g - base)``; a group of two or
    more needs ``cut_g - base >= min_shared``, where ``cut_g`` is the group's common prefix, at most
    its shortest prompt minus one token (each row keeps a token whose logits start its decode).
    Singletons come back with ``cut = -1``.
    """
    m = len(order)
    adj = [_common_prefix(prompts[order[i]], prompts[order[i + 1]]) for i in range(m - 1)]
    best, choice = [0] * (m + 1), [0] * (m + 1)
    for i in range(1, m + 1):
        best[i], choice[i] = best[i - 1], i - 1  # order[i - 1] alone
        cut, shortest = None, len(prompts[order[i - 1]])
        for j in range(i - 2, -1, -1):  # group order[j:i]
            cut = adj[j] if cut is None else min(cut, adj[j])
            shortest = min(shortest, len(prompts[order[j]]))
            c = min(cut, shortest - 1)
            if c - base < min_shared:
                continue
            gain = best[j] + (i - j - 1) * (c - base)
            if gain > best[i]:
                best[i], choice[i] = gain, j
    out, i = [], m
    while i > 0:
        j = choice[i]
        members = order[j:i]
        c = -1
        if len(members) > 1:
            c = min(min(adj[j:i - 1]), min(len(prompts[k]) for k in members) - 1)
        out.append((members, c))
        i = j
    return out[::-1]


def prefix_plan(prompts: list[list[int]], *, min_shared: int = MIN_SHARED_PREFIX) -> list[list[int]]:
    """How to prefill ``m`` distinct prompts so that shared token prefixes are computed once.

    Returns ``plan[level][k]``: where prompt ``k``'s segment of each forward pass ends (strictly
    increasing over levels; the last level ends every prompt, ``len(prompts[k])``). Prompts with
    the same cuts and the same tokens up to a cut share that segment's computation. Candidates: one
    pass (no sharing); the prefix every prompt shares; groups of prompts sharing a longer prefix
    (:func:`_groups`), after that common prefix or not, with prompts in no group either finishing
    in the group pass (all but their last token) or waiting for the last one. The one with the
    fewest padded tokens (:func:`plan_cost`) wins, ties to fewer passes.

    Args:
        prompts: ``m`` non-empty token-id lists.
        min_shared: fewest tokens a group must share beyond the batch-wide prefix.

    Raises:
        ValueError: an empty prompt.
    """
    if any(not p for p in prompts):
        raise ValueError(f"prefix_plan: prompt {[len(p) for p in prompts].index(0)} is empty")
    m, lens = len(prompts), [len(p) for p in prompts]
    candidates = [[lens]]
    if m < 2:
        return candidates[0]
    order = sorted(range(m), key=lambda k: prompts[k])
    common = min(min(_common_prefix(prompts[order[i]], prompts[order[i + 1]]) for i in range(m - 1)), min(lens) - 1)
    bases = [0] + ([common] if common > 0 else [])
    for base in bases:
        head = [[base] * m] if base else []
        if base:
            candidates.append(head + [lens])
        groups = _groups(prompts, order, base, min_shared)
        if all(c < 0 for _, c in groups):
            continue
        for alone_waits in ((False, True) if base else (False,)):
            mid = [0] * m
            for members, c in groups:
                for k in members:
                    mid[k] = c if c >= 0 else (base if alone_waits else lens[k] - 1)
            candidates.append(head + [mid, lens])
    candidates = [[lv for li, lv in enumerate(p) if lv != (p[li - 1] if li else [0] * m)] for p in candidates]
    return min(candidates, key=lambda p: (plan_cost(prompts, p), len(p)))


DECODE_STATS = ("prefill_s", "prefill_cpu_s", "decode_cpu_s", "prefill_rows", "prefill_tokens", "prefill_sq_tokens",
                "prompt_tokens", "prefill_causal_sq", "prefill_logit_rows", "prefill_passes", "decode_steps",
                "decode_rows", "decode_ctx_tokens")
"""Work counters of :meth:`HFGenerator._decode` in ``HFGenerator.stats`` (for ``python -m benchmarks roofline``):
prefill wall seconds; process CPU seconds (all threads) of the prefill and decode passes; rows, padded tokens
(``rows * width``) and padded ``rows * width * context`` of the prefill passes; real prompt tokens
prefilled (a shared prefix counted once), the sum over them of twice the real tokens each attends to
(``n (n + 1)`` for one ``n``-token prompt), the rows whose logits were computed, and the prefill forward
passes; decode forward passes, their rows, and their rows times context length."""


def _cpu_s() -> float:
    return time.process_time()


class HFGenerator:
    """``GenerateFn`` over a transformers causal LM (CPU or one GPU).

    Args:
        model: a ``PreTrainedModel`` (the actor's module; read-only here).
        tokenizer: its tokenizer (pad id and the stop set, ``eos_ids``: its EOS, the model's
            ``generation_config.eos_token_id`` and its chat template's turn end, are taken from it).
        max_batch_size: most requests per ``generate`` call.
        seed: iteration seed used for requests that carry no ``sampling.seed`` (see ``set_seed``).
        share_prefill: prefill identical prompts of one batch once (the N rollouts of a task start from
            the same prompt) and copy the KV cache to their rows; False prefills every row.
        precision: the actor's ``progpo.run.precision.Precision``; each decode runs in its context (bf16
            matmuls under mixed precision, entered in the worker thread: autocast state is per thread).
            None: fp32.
        reuse_prefix: prefill the token prefix that different prompts of one batch share once (the
            system prompt and task of a task's rollouts at later steps; see :func:`prefix_plan`) and
            continue each prompt from a copy of its KV cache; False prefills each prompt whole.

    Both settings change the work, not the samples: every token attends to the same tokens at the same
    positions (up to float rounding of the differently shaped matmuls).

    Call ``await gen(prompt_ids, sampling)`` from any number of concurrent coroutines.

    Raises:
        ValueError: ``max_batch_size`` < 1, or the chat template's turn end cannot be derived
            (``progpo.agents.stop_tokens.turn_end_id``; one line saying what to change).
    """

    def __init__(self, model, tokenizer, *, max_batch_size: int = 32, seed: int = 0, share_prefill: bool = True,
                 precision: Precision | None = None, reuse_prefix: bool = True) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.share_prefill = share_prefill
        self.precision = FP32 if precision is None else precision
        self.reuse_prefix = reuse_prefix
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.eos_ids = stop_token_ids(tokenizer, getattr(model, "generation_config", None))
        ignored = ignored_generation_settings(getattr(model, "generation_config", None))
        if ignored:
            logger.info("sampling follows SamplingParams only; the checkpoint's generation settings %s are "
                        "ignored (rollouts and evaluation)", ignored)
        self._pending: list[_Request] = []
        self._worker: asyncio.Task | None = None
        self._seen: dict[bytes, int] = defaultdict(int)
        self.iteration_seed = seed
        self.stats = {"calls": 0, "requests": 0, "tokens": 0, "seconds": 0.0, **{k: 0.0 for k in DECODE_STATS}}

    def set_seed(self, seed: int) -> None:
        """Start a new rollout: seeds of unseeded requests derive from ``seed`` from now on."""
        self.iteration_seed = int(seed)
        self._seen.clear()

    async def __call__(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        if not prompt_ids:
            raise ValueError("prompt_ids is empty")
        key = np.asarray(prompt_ids, dtype=np.int64).tobytes()
        seed = sampling.seed
        if seed is None:
            seed = request_seed(self.iteration_seed, prompt_ids, self._seen[key])
            self._seen[key] += 1
        loop = asyncio.get_running_loop()
        req = _Request(list(prompt_ids), sampling, int(seed), loop.create_future())
        self._pending.append(req)
        if self._worker is None or self._worker.done():
            self._worker = loop.create_task(self._drain())
        return await req.future

    async def _drain(self) -> None:
        while self._pending:
            await asyncio.sleep(0)  # yield once so that episodes ready at the same time join the batch
            batch, self._pending = self._pending[: self.max_batch_size], self._pending[self.max_batch_size:]
            try:
                results = await asyncio.to_thread(self.generate_batch, [r.prompt_ids for r in batch],
                                                  [r.sampling for r in batch], [r.seed for r in batch])
            except Exception as exc:  # noqa: BLE001 - handed to every waiting caller
                for r in batch:
                    if not r.future.done():
                        r.future.set_exception(exc)
                continue
            for r, g in zip(batch, results):
                if not r.future.done():
                    r.future.set_result(g)

    @torch.no_grad()
    def generate_batch(self, prompts: list[list[int]], samplings: list[SamplingParams],
                       seeds: list[int]) -> list[Generation]:
        """Generate one response per prompt in one left-padded, KV-cached decode (blocking).

        Args:
            prompts: ``n`` token-id lists (``[P_k]`` each). samplings, seeds: one per prompt.

        Returns:
            ``n`` ``Generation``s; each stops at its first stop token (``eos_ids`` or its sampling's
            ``stop_token_ids``; kept, ``finish_reason`` "stop") or at its ``max_new_tokens`` (``finish_reason``
            "length").
        """
        t0 = time.perf_counter()
        sampler = _GumbelSampler([s.temperature for s in samplings], [s.top_p for s in samplings], seeds)
        limits = [s.max_new_tokens for s in samplings]
        stops = [set(self.eos_ids) | set(s.stop_token_ids) for s in samplings]
        was_training = self.model.training
        self.model.eval()
        try:
            with self.precision.context():
                tokens = self._decode(prompts, sampler, limits, stops)
        finally:
            self.model.train(was_training)
        results = []
        for k, row in enumerate(tokens):
            toks, reason = row[: limits[k]], "length"
            for j, t in enumerate(toks):
                if t in stops[k]:
                    toks, reason = toks[: j + 1], "stop"
                    break
            text = decode_response(self.tokenizer, toks)
            results.append(Generation(token_ids=toks, logprobs=sampler.logprobs[k][: len(toks)], text=text,
                                      finish_reason=reason))
        self.stats["calls"] += 1
        self.stats["requests"] += len(prompts)
        self.stats["tokens"] += sum(len(r.token_ids) for r in results)
        self.stats["seconds"] += time.perf_counter() - t0
        return results

    def _prefill(self, prompts: list[list[int]], device) -> tuple[torch.Tensor, object, torch.Tensor]:
        """Prefill every prompt, sharing what prompts share, and return the decode's starting state.

        The plan (:func:`prefix_plan`) cuts each prompt into segments; level ``l`` is one batched
        forward of the distinct segments ending at that level's cuts, each node continuing the KV cache
        of its parent (rows copied by ``Cache.batch_select_indices``). Segments are left-padded, so a
        row of the cache reads ``[pad | segment 0 | pad | segment 1 | ...]``; the 2-D attention mask
        masks every pad and the position ids count real tokens only, so each token sees exactly the
        tokens and positions of a one-pass left-padded prefill. Rows with the same prompt are one node
        at the last level when ``share_prefill`` (their cache and logits are copied per row).

        Returns:
            ``logits [n, V]`` of each prompt's last token, the cache (``n`` rows, ``T`` columns) and the
            attention mask ``attn [n, T]``.
        """
        n = len(prompts)
        firsts = list(range(n))
        if self.share_prefill:
            owner: dict[tuple[int, ...], int] = {}
            firsts = [owner.setdefault(tuple(p), k) for k, p in enumerate(prompts)]
        distinct = sorted(set(firsts))
        plan = prefix_plan([prompts[k] for k in distinct]) if self.reuse_prefix else [[len(prompts[k]) for k in distinct]]
        cuts = {k: [level[j] for level in plan] for j, k in enumerate(distinct)}
        cache, attn, row_node = None, None, [0] * n
        for li in range(len(plan)):
            node_of: dict[tuple, int] = {}
            reps, nodes = [], []
            for k in range(n):
                c = cuts[firsts[k]]
                key = (tuple(c[: li + 1]), tuple(prompts[k][: c[li]]))
                if not self.share_prefill and li == len(plan) - 1:
                    key = (key, k)  # a prefill per row
                if key not in node_of:
                    node_of[key] = len(reps)
                    reps.append(k)
                nodes.append(node_of[key])
            if cache is not None:
                parents = torch.tensor([row_node[k] for k in reps], device=device)
                cache.batch_select_indices(parents)
                attn = attn[parents]
            segs = [prompts[k][(cuts[firsts[k]][li - 1] if li else 0): cuts[firsts[k]][li]] for k in reps]
            logits, cache, attn = self._prefill_level(segs, cache, attn, device)
            row_node = nodes
        back = torch.tensor(row_node, device=device)
        if row_node != list(range(n)):
            cache.batch_select_indices(back)
            attn = attn[back]
            logits = logits[back]
        return logits, cache, attn

    def _prefill_level(self, segs: list[list[int]], cache, attn: torch.Tensor | None, device):
        """One forward of ``N`` left-padded segments (``[N, S]``) after ``cache`` (``N`` rows, mask ``attn [N, T]``).

        Returns ``(logits [N, V] of each last column, cache, attn [N, T + S])``; counts its work in ``stats``.
        """
        width = max(len(s) for s in segs)
        ids = torch.full((len(segs), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(segs), width), dtype=torch.long)
        for k, s in enumerate(segs):
            if s:
                ids[k, width - len(s):] = torch.tensor(s, dtype=torch.long)
                mask[k, width - len(s):] = 1
        ids, mask = ids.to(device), mask.to(device)
        before = attn.sum(-1) if attn is not None else torch.zeros(len(segs), dtype=torch.long, device=device)
        attn = mask if attn is None else torch.cat([attn, mask], dim=1)
        pos = (attn.cumsum(-1) - 1).clamp_min(0)[:, -width:]  # positions count real tokens only
        out = self.model(input_ids=ids, attention_mask=attn, position_ids=pos, past_key_values=cache,
                         use_cache=True, logits_to_keep=1)
        st, real = self.stats, mask.sum(-1)
        ctx = attn.shape[1]
        st["prefill_rows"] += len(segs)
        st["prefill_tokens"] += len(segs) * width
        st["prefill_sq_tokens"] += len(segs) * width * ctx
        st["prompt_tokens"] += int(real.sum())
        st["prefill_causal_sq"] += int((2 * before * real + real * (real + 1)).sum())  # sum of 2 x keys seen
        st["prefill_logit_rows"] += len(segs)
        st["prefill_passes"] += 1
        return out.logits[:, -1, :], out.past_key_values, attn

    def _decode(self, prompts: list[list[int]], sampler: _GumbelSampler, limits: list[int],
                stops: list[set[int]]) -> list[list[int]]:
        """Token-by-token decode: the model's forward pass, our sampler, nothing else (``[n][<= max(limits)]``).

        Every row is sampled at every step (its generator advances the same however the batch is
        made up); rows past one of their ``stops`` (token ids per row) or their limit are fed the pad
        token and later cut. The prefill
        (:meth:`_prefill`) computes what prompts share once.

        Raises:
            GenerationStopped: :func:`request_stop` was called (checked before every token).
        """
        device = next(self.model.parameters()).device
        n = len(prompts)
        t0, c0 = time.perf_counter(), _cpu_s()
        logits, cache, attn = self._prefill(prompts, device)
        st = self.stats
        st["prefill_s"] += time.perf_counter() - t0
        c1 = _cpu_s()
        st["prefill_cpu_s"] += c1 - c0
        pos = attn.sum(-1, keepdim=True) - 1  # position of each row's last prompt token
        width = max(len(s) for s in stops)
        stop = torch.tensor([sorted(s) + [-1] * (width - len(s)) for s in stops], dtype=torch.long, device=device)
        limit = torch.tensor(limits, device=device)
        done = torch.zeros(n, dtype=torch.bool, device=device)
        steps: list[torch.Tensor] = []
        for t in range(max(limits)):
            if _STOP.is_set():
                raise GenerationStopped(f"decode stopped after {t} of up to {max(limits)} tokens: stop requested")
            choice = sampler(logits)
            choice = torch.where(done, torch.full_like(choice, self.pad_id), choice)
            steps.append(choice)
            done = done | (choice[:, None] == stop).any(-1) | (limit <= t + 1)
            if bool(done.all()):
                break
            attn = torch.cat([attn, torch.ones((n, 1), dtype=attn.dtype, device=device)], dim=1)
            pos = pos + 1
            out = self.model(input_ids=choice[:, None], attention_mask=attn, position_ids=pos,
                             past_key_values=cache, use_cache=True)
            logits, cache = out.logits[:, -1, :], out.past_key_values
            st["decode_steps"] += 1
            st["decode_rows"] += n
            st["decode_ctx_tokens"] += n * attn.shape[1]
        st["decode_cpu_s"] += _cpu_s() - c1
        return torch.stack(steps, dim=1).cpu().tolist()
