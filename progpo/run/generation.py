"""Local generation backend: a transformers causal LM behind the async ``GenerateFn`` contract.

``HFGenerator`` is awaited by the episode loop once per step and episode. Concurrent requests are
collected by a small batching queue and run as one left-padded decode in a worker thread, so that
many episodes share one forward pass while their environments step.

Sampling is the policy's own temperature / top-p distribution, drawn by Gumbel-max with one
``torch.Generator`` per request (seeded from the request's seed, or from the iteration seed, the
prompt and its occurrence count). A response therefore depends on its own seed and prompt, not on
which other requests happened to share its batch, which makes rollouts reproducible (``--ckpt.load_enable``).

The decode loop calls the model's forward pass directly (KV cache, no ``model.generate``):
``generate`` back-fills its ``GenerationConfig`` from the checkpoint's ``generation_config.json``
(``repetition_penalty``, ``no_repeat_ngram_size``, ``min_new_tokens``, ``bad_words_ids``,
``suppress_tokens``, ``sequence_bias``, forced EOS, stop strings, ...), and a field whose neutral
value is ``None`` cannot be pinned against that back-fill. Here nothing stands between the logits
and the sample but our ``SamplingParams``, so the recorded log-probs are exactly
those ``sequence_logprobs`` recomputes. Of the checkpoint's generation config only ``eos_token_id``
is read (as extra stop tokens); settings that would have changed sampling are logged once as ignored.
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


DECODE_STATS = ("prefill_s", "prefill_cpu_s", "decode_cpu_s", "prefill_rows", "prefill_tokens", "prefill_sq_tokens",
                "prompt_tokens", "decode_steps", "decode_rows", "decode_ctx_tokens")
"""Work counters of :meth:`HFGenerator._decode` in ``HFGenerator.stats`` (for ``bench roofline``): prefill
wall seconds; process CPU seconds (all threads) of the prefill and decode passes; rows, padded tokens
(``n * width``) and ``n * width**2`` of the prefill passes; real prompt tokens prefilled; decode forward
passes, their rows, and their rows times context length."""


def _cpu_s() -> float:
    return time.process_time()


class HFGenerator:
    """``GenerateFn`` over a transformers causal LM (CPU or one GPU).

    Args:
        model: a ``PreTrainedModel`` (the actor's module; read-only here).
        tokenizer: its tokenizer (pad and eos ids are taken from it).
        max_batch_size: most requests per ``generate`` call.
        seed: iteration seed used for requests that carry no ``sampling.seed`` (see ``set_seed``).
        share_prefill: prefill identical prompts of one batch once (the N rollouts of a task start from
            the same prompt) and copy the KV cache to their rows; False prefills every row.
        precision: the actor's ``progpo.run.precision.Precision``; each decode runs in its context (bf16
            matmuls under mixed precision, entered in the worker thread: autocast state is per thread).
            None: fp32.

    Call ``await gen(prompt_ids, sampling)`` from any number of concurrent coroutines.
    """

    def __init__(self, model, tokenizer, *, max_batch_size: int = 32, seed: int = 0, share_prefill: bool = True,
                 precision: Precision | None = None) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.share_prefill = share_prefill
        self.precision = FP32 if precision is None else precision
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        eos = model.generation_config.eos_token_id
        eos = list(eos) if isinstance(eos, (list, tuple)) else ([eos] if eos is not None else [])
        if tokenizer.eos_token_id is not None:
            eos.append(tokenizer.eos_token_id)
        self.eos_ids = sorted(set(eos))
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
            ``n`` ``Generation``s; each stops at its first EOS (kept; ``finish_reason`` "stop") or at
            its ``max_new_tokens`` (``finish_reason`` "length").
        """
        t0 = time.perf_counter()
        sampler = _GumbelSampler([s.temperature for s in samplings], [s.top_p for s in samplings], seeds)
        limits = [s.max_new_tokens for s in samplings]
        was_training = self.model.training
        self.model.eval()
        try:
            with self.precision.context():
                tokens = self._decode(prompts, sampler, limits)
        finally:
            self.model.train(was_training)
        results = []
        eos = set(self.eos_ids)
        for k, row in enumerate(tokens):
            toks, reason = row[: limits[k]], "length"
            for j, t in enumerate(toks):
                if t in eos:
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

    def _decode(self, prompts: list[list[int]], sampler: _GumbelSampler, limits: list[int]) -> list[list[int]]:
        """Token-by-token decode: the model's forward pass, our sampler, nothing else (``[n][<= max(limits)]``).

        Every row is sampled at every step (its generator advances the same however the batch is
        made up); rows past their EOS or limit are fed the pad token and later cut. Rows with the same
        prompt share one prefill (``share_prefill``): its KV cache and logits are copied to each row.

        Raises:
            GenerationStopped: :func:`request_stop` was called (checked before every token).
        """
        device = next(self.model.parameters()).device
        width = max(len(p) for p in prompts)
        n = len(prompts)
        ids = torch.full((n, width), self.pad_id, dtype=torch.long)
        attn = torch.zeros((n, width), dtype=torch.long)
        for k, p in enumerate(prompts):
            ids[k, width - len(p):] = torch.tensor(p, dtype=torch.long)
            attn[k, width - len(p):] = 1
        ids, attn = ids.to(device), attn.to(device)
        pos = (attn.cumsum(-1) - 1).clamp_min(0)  # left padding: positions count real tokens only
        # identical prompts (a task's N rollouts at step 0) are prefilled once, their KV cache copied per row
        owner = {}
        first = [owner.setdefault(tuple(p), k) for k, p in enumerate(prompts)]
        rows = sorted(set(first)) if self.share_prefill else list(range(n))
        t0, c0 = time.perf_counter(), _cpu_s()
        out = self.model(input_ids=ids[rows], attention_mask=attn[rows], position_ids=pos[rows], use_cache=True,
                         logits_to_keep=1)
        logits, cache = out.logits[:, -1, :], out.past_key_values
        if len(rows) < n:
            back = torch.tensor([rows.index(f) for f in first], device=device)
            cache.batch_select_indices(back)
            logits = logits[back]
        st = self.stats
        st["prefill_s"] += time.perf_counter() - t0
        c1 = _cpu_s()
        st["prefill_cpu_s"] += c1 - c0
        st["prefill_rows"] += len(rows)
        st["prefill_tokens"] += len(rows) * width
        st["prefill_sq_tokens"] += len(rows) * width * width
        st["prompt_tokens"] += sum(len(prompts[k]) for k in rows)
        eos = torch.tensor(self.eos_ids, dtype=torch.long, device=device)
        limit = torch.tensor(limits, device=device)
        done = torch.zeros(n, dtype=torch.bool, device=device)
        steps: list[torch.Tensor] = []
        for t in range(max(limits)):
            if _STOP.is_set():
                raise GenerationStopped(f"decode stopped after {t} of up to {max(limits)} tokens: stop requested")
            choice = sampler(logits)
            choice = torch.where(done, torch.full_like(choice, self.pad_id), choice)
            steps.append(choice)
            done = done | torch.isin(choice, eos) | (limit <= t + 1)
            if bool(done.all()):
                break
            attn = torch.cat([attn, torch.ones((n, 1), dtype=attn.dtype, device=device)], dim=1)
            pos = pos[:, -1:] + 1
            out = self.model(input_ids=choice[:, None], attention_mask=attn, position_ids=pos,
                             past_key_values=cache, use_cache=True)
            logits, cache = out.logits[:, -1, :], out.past_key_values
            st["decode_steps"] += 1
            st["decode_rows"] += n
            st["decode_ctx_tokens"] += n * attn.shape[1]
        st["decode_cpu_s"] += _cpu_s() - c1
        return torch.stack(steps, dim=1).cpu().tolist()
