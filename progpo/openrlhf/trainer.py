"""OpenRLHF 0.11.2 PPO trainer actor with our samples generator and experience maker, and its launcher.

``ProGPOPPOTrainer`` is ``@ray.remote class ProGPOPPOTrainer(PPOTrainer.__ray_actor_class__)``: it
runs OpenRLHF's own constructor (tokenizer, prompt dataloaders, KL controller, loggers) and then
replaces ``samples_generator`` and ``experience_maker`` with
:class:`~progpo.openrlhf.samples.StepSamplesGenerator` and
:class:`~progpo.openrlhf.experience.StepExperienceMaker`; every other stage (reference and
actor forward passes, DeepSpeed ZeRO update, weight sync to the engines, checkpoints,
TensorBoard/W&B) is OpenRLHF's. :class:`ProGPOPolicyModelActor` is OpenRLHF's policy actor plus
the ``--debug.*`` aids (weight-sync check, replay-buffer dump).

:func:`run_openrlhf_main` runs OpenRLHF's ``cli/train_ppo_ray.py`` ``__main__`` block (its argument
post-processing and checks, then its ``train``), with our classes in place of ``PPOTrainer`` and
``PolicyModelActor``, for exactly the pinned version (:data:`OPENRLHF_VERSION`). In CPU mode the
stand-ins of :mod:`progpo.openrlhf.cpu` apply as well.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import runpy
from pathlib import Path
from typing import Any

import ray
import torch
from openrlhf.trainer import ppo_trainer as _ppo_trainer_module
from openrlhf.trainer.ppo_trainer import PPOTrainer
from openrlhf.trainer.ray import ppo_actor as _ppo_actor_module
from openrlhf.trainer.ray.ppo_actor import PolicyModelActor
from openrlhf.utils.distributed_util import torch_dist_barrier_and_cuda_sync

from progpo.openrlhf.patching import patched
from progpo.openrlhf.version import OPENRLHF_VERSION, check_openrlhf_version
from progpo.openrlhf.experience import StepExperienceMaker, _write_json
from progpo.openrlhf.samples import StepSamplesGenerator

logger = logging.getLogger(__name__)

__all__ = ["OPENRLHF_VERSION", "ProGPOPPOTrainer", "ProGPOPolicyModelActor", "check_openrlhf_version",
           "openrlhf_parser", "run_openrlhf_main"]

_TRAIN_MODULE = "openrlhf.cli.train_ppo_ray"


def broadcast_merged_to_engines(trainer: Any) -> None:
    """OpenRLHF's ``ActorPPOTrainer.broadcast_to_vllm`` for an actor with a LoRA adapter (``--ds.lora.rank``).

    OpenRLHF 0.11.2 sends ``model.named_parameters()`` as they are: with peft that is
    ``base_model.model....q_proj.base_layer.weight`` and the adapter's ``lora_A`` / ``lora_B``, which an
    engine's model (no adapter) does not have. Here every engine receives instead the weights the
    adapter stands for, ``W + (alpha / r) B A`` (:func:`progpo.run.lora.iter_merged`), under the base
    model's own parameter names, one tensor at a time (ZeRO-3 gathers per tensor), over OpenRLHF's
    own transport: its weight-sync group (``--vllm.sync_backend``; Ray collective with
    ``--vllm.sync_with_ray``) or CUDA IPC when colocated, exactly as its ``_broadcast_param`` /
    ``_handle_cuda_ipc`` do.
    """
    import deepspeed

    from progpo.run.lora import iter_merged, merged_parameter_names

    args = trainer.strategy.args
    model = trainer.actor.model.module
    rank0 = torch.distributed.get_rank() == 0
    resets = []
    if getattr(args.vllm, "enable_prefix_caching", False) and rank0:
        resets = [engine.reset_prefix_cache.remote() for engine in trainer.vllm_engines]
    torch.cuda.empty_cache()
    zero3 = args.ds.zero_stage == 3

    def gather(params: Any) -> Any:
        return deepspeed.zero.GatheredParameters(list(params), enabled=zero3)

    total = len(merged_parameter_names(model))
    for count, (name, weight) in enumerate(iter_merged(model, parameters_only=True, gather=gather), start=1):
        weight = weight.to(torch.cuda.current_device())
        if trainer.use_cuda_ipc:
            _send_cuda_ipc(trainer, name, weight, count == total)
            continue
        if not rank0:
            continue
        refs = [engine.update_weight.remote(name, dtype=weight.dtype, shape=weight.shape, empty_cache=count == total)
                for engine in trainer.vllm_engines]
        if getattr(args.vllm, "sync_with_ray", False):
            import ray.util.collective as collective

            collective.broadcast(weight, 0, group_name=trainer._model_update_group)  # noqa: SLF001
        else:
            trainer._model_update_group.broadcast(weight, src=0, stream=torch.cuda.current_stream())  # noqa: SLF001
        ray.get(refs)
    if resets:
        ray.get(resets)
    torch.cuda.empty_cache()
    torch_dist_barrier_and_cuda_sync()


def _send_cuda_ipc(trainer: Any, name: str, weight: torch.Tensor, last: bool) -> None:
    """One merged tensor over CUDA IPC (OpenRLHF 0.11.2's ``_handle_cuda_ipc``, colocated engines)."""
    from openrlhf.trainer.ray.utils import get_physical_gpu_id
    from torch.multiprocessing.reductions import reduce_tensor

    handle = {get_physical_gpu_id(): reduce_tensor(weight.clone())}
    handles: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(handles, handle)
    if torch.distributed.get_rank() == 0:
        merged = {k: v for d in handles for k, v in d.items()}
        ray.get([engine.update_weight_cuda_ipc.remote(name, dtype=weight.dtype, shape=weight.shape, ipc_handles=merged,
                                                      empty_cache=last) for engine in trainer.vllm_engines])
    torch_dist_barrier_and_cuda_sync()


@ray.remote(num_gpus=1)
class ProGPOPolicyModelActor(PolicyModelActor.__ray_actor_class__):
    """OpenRLHF's policy actor (DeepSpeed model, PPO loss, weight sync) plus two debugging aids.

    * ``progpo_full_state()``: the actor's full parameters (ZeRO-3 gathered) on rank 0, for the
      ``--debug.check_weight_sync`` comparison with the engines (with LoRA: the merged weights
      under the base model's names, which is what the engines hold).
    * With ``--debug.dump_dir``: before each ``fit``, the replay buffer it is about to train on
      (per sample: rollout index, sequence, action mask, advantages) is written to
      ``iter<NNN>_actor_rank<R>.json`` (see :meth:`fit`).
    Training itself is OpenRLHF's, unchanged; with a LoRA adapter the weight sync sends merged
    weights (:func:`broadcast_merged_to_engines`).
    """

    def broadcast_to_vllm(self) -> None:
        """OpenRLHF's weight sync, or with a LoRA adapter :func:`broadcast_merged_to_engines`."""
        from progpo.run.lora import is_lora

        if is_lora(self.actor.model.module):
            return broadcast_merged_to_engines(self.trainer)
        return super().broadcast_to_vllm()

    def save_model(self) -> None:
        """OpenRLHF's final save (``--ckpt.output_dir``); with a LoRA adapter, which OpenRLHF saves alone,
        also the merged model as a Hugging Face folder in ``<ckpt.output_dir>/merged`` (what ``evaluate``
        and ``train --actor.model_name_or_path`` take)."""
        import deepspeed

        from progpo.run.lora import base_model, is_lora, iter_merged

        super().save_model()
        model = self.actor.model.module
        args = self.strategy.args
        if not is_lora(model) or args.train.enable_ema:
            return

        def gather(params: Any) -> Any:
            return deepspeed.zero.GatheredParameters(list(params), enabled=args.ds.zero_stage == 3)

        state = {name: t.cpu() for name, t in iter_merged(model, gather=gather)}
        if torch.distributed.get_rank() == 0:
            out = Path(args.ckpt.output_dir) / "merged"
            base_model(model).save_pretrained(out, state_dict=state)
            self.tokenizer.save_pretrained(out)
        torch_dist_barrier_and_cuda_sync()

    def append(self, experience: Any) -> None:
        """OpenRLHF's ``append``; records the rollout indices of the rows (lost in the buffer's split)."""
        if self._dump_dir() and experience.index is not None:
            self.__dict__.setdefault("_progpo_indices", []).extend(int(i) for i in experience.index)
        super().append(experience)

    def fit(self, kl_ctl: float = 0) -> dict:
        """OpenRLHF's ``fit``, after writing the replay buffer to ``--debug.dump_dir`` when set.

        Dump rows: ``index`` (position in the rollout batch = row of the step batch), ``sequences``
        ``[T]``, ``action_mask`` ``[A]``, ``advantages`` ``[A]`` (``A = T - 1``), ``response_length``.
        """
        if self._dump_dir():
            self._dump_replay_buffer()
        return super().fit(kl_ctl)

    def _dump_dir(self) -> str | None:
        return getattr(self.strategy.args, "progpo_debug_dump_dir", None)

    def _dump_replay_buffer(self) -> None:
        items = self.trainer.replay_buffer.items
        indices = self.__dict__.pop("_progpo_indices", [])
        if len(indices) != len(items):
            raise RuntimeError(f"replay buffer holds {len(items)} rows but {len(indices)} rollout indices were seen")
        n = self.__dict__["_progpo_fits"] = self.__dict__.get("_progpo_fits", 0) + 1
        rows = [{"index": i, "sequences": e.sequences.tolist(), "action_mask": e.action_mask.int().tolist(),
                 "advantages": e.advantages.float().tolist(), "response_length": float(e.response_length)}
                for i, e in zip(indices, items)]
        rank = torch.distributed.get_rank()
        _write_json(Path(self._dump_dir()) / f"iter{n:03d}_actor_rank{rank}.json", {"iteration": n, "rows": rows})

    def progpo_full_state(self) -> dict[str, torch.Tensor] | None:
        """Copies of every trainable parameter (name -> CPU tensor) on rank 0; None on other ranks."""
        import deepspeed

        from progpo.run.lora import iter_merged

        model = self.actor.model.module
        params = list(model.parameters())
        with deepspeed.zero.GatheredParameters(params, enabled=self.strategy.args.ds.zero_stage == 3):
            state = {name: p.cpu() for name, p in iter_merged(model, parameters_only=True)}
        return state if torch.distributed.get_rank() == 0 else None


def max_weight_diff(actor_state: dict[str, torch.Tensor], engine_state: dict[str, torch.Tensor]) -> float:
    """``max |actor - engine|`` over every actor parameter (float64).

    Raises:
        KeyError: the engine lacks a parameter of the actor (names must match: same HF model class).
    """
    missing = sorted(set(actor_state) - set(engine_state))
    if missing:
        raise KeyError(f"the engine has no parameters {missing[:3]} (of {len(missing)} missing)")
    return max(float((a.double() - engine_state[n].double()).abs().max()) for n, a in actor_state.items())


class _ProGPOTrainerMixin:
    """What :class:`ProGPOPPOTrainer` adds to OpenRLHF's trainer (kept apart for CPU tests)."""

    def _install_progpo_stages(self, strategy: Any, vllm_engines: Any, advantage_config: Any) -> None:
        self.samples_generator = StepSamplesGenerator(
            strategy=strategy,
            prompts_dataloader=self.prompts_dataloader,
            eval_dataloader=self.eval_dataloader,
            tokenizer=self.tokenizer,
            vllm_engines=vllm_engines,
        )
        encoder = None
        if advantage_config is not None and getattr(advantage_config, "semantic_expansion", False):
            from progpo.advantages.embeddings import default_encoder

            encoder = default_encoder()
        self.experience_maker = StepExperienceMaker(
            self.actor_model_group,
            self.critic_model_group,
            self.reward_model_group,
            self.reference_model_group,
            self.kl_ctl,
            strategy,
            self.tokenizer,
            advantage_config=advantage_config,
            encoder=encoder,
        )

    def train_step(self, rollout_samples: Any, global_step: int) -> tuple[dict, int]:
        """OpenRLHF's train step, plus episode (``env/``, ``rollout/``), estimator (``adv/``) and,
        with ``--debug.check_weight_sync``, weight-sync (``sync/``) metrics."""
        status, global_step = super().train_step(rollout_samples, global_step)
        status.update(self.samples_generator.last_stats)
        status.update(self.experience_maker.last_diagnostics)
        status.update(getattr(self, "_sync_stats", {}))
        return status, global_step

    def broadcast_to_vllm(self) -> None:
        """OpenRLHF's weight sync; with ``--debug.check_weight_sync`` the largest actor-engine weight
        difference is measured before (``sync/max_abs_diff_before``) and after it (``sync/max_abs_diff``)."""
        if not getattr(self.strategy.args, "progpo_debug_check_weight_sync", False):
            return super().broadcast_to_vllm()
        before = self._weight_sync_diff()
        super().broadcast_to_vllm()
        after = self._weight_sync_diff()
        self._sync_stats = {"sync/max_abs_diff_before": before, "sync/max_abs_diff": after}
        logger.info("weight sync: max |actor - engine| %.3g before, %.3g after", before, after)

    def _weight_sync_diff(self) -> float:
        states = ray.get(self.actor_model_group.async_run_method(method_name="progpo_full_state"))
        actor_state = next(s for s in states if s is not None)
        return max(max_weight_diff(actor_state, ray.get(e.progpo_full_state.remote())) for e in self.vllm_engines)


@ray.remote
class ProGPOPPOTrainer(_ProGPOTrainerMixin, PPOTrainer.__ray_actor_class__):
    """OpenRLHF's single-controller PPO trainer with per-step samples and our estimators.

    Same constructor as OpenRLHF's ``PPOTrainer``; the ``AdvantageConfig`` is read from
    ``strategy.args.progpo_advantage_config`` (set by ``python -m progpo.cli.train_ray``).
    """

    def __init__(self, pretrain: str, strategy: Any, actor_model_group: Any, critic_model_group: Any,
                 reward_model_group: Any, reference_model_group: Any, vllm_engines: Any,
                 **generate_kwargs: Any) -> None:
        super().__init__(pretrain, strategy, actor_model_group, critic_model_group, reward_model_group,
                         reference_model_group, vllm_engines, **generate_kwargs)
        cfg = getattr(strategy.args, "progpo_advantage_config", None)
        self._install_progpo_stages(strategy, vllm_engines, cfg)


class _ParserCaptured(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__("parser captured")
        self.parser = parser


def openrlhf_parser() -> argparse.ArgumentParser:
    """OpenRLHF's own ``train_ppo_ray`` argument parser (all its flags, defaults and help).

    Its parser is built inside ``if __name__ == "__main__"``; the block is run with
    ``parse_args`` replaced by a function that hands the parser back before anything is parsed.
    """
    check_openrlhf_version()

    def capture(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        raise _ParserCaptured(self)

    with patched(argparse.ArgumentParser, "parse_args", capture):
        try:
            runpy.run_module(_TRAIN_MODULE, run_name="__main__")
        except _ParserCaptured as captured:
            return captured.parser
    raise RuntimeError(f"{_TRAIN_MODULE} did not build an argument parser")


def run_openrlhf_main(namespace: argparse.Namespace) -> None:
    """Run OpenRLHF's ``train_ppo_ray`` main block on an already-parsed flat ``namespace``.

    Its post-processing and checks apply unchanged; its ``train`` then builds the Ray actor
    groups and engines and starts :class:`ProGPOPPOTrainer` in place of ``PPOTrainer`` and
    :class:`ProGPOPolicyModelActor` in place of ``PolicyModelActor`` (synchronous mode only;
    ``--train.async_enable`` is refused earlier by ``train_ray``). With ``progpo_device == "cpu"``
    the driver-side CPU stand-ins of :func:`progpo.openrlhf.cpu.launch.launch_patches` apply too.
    """
    check_openrlhf_version()

    def given(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> argparse.Namespace:
        return namespace

    with contextlib.ExitStack() as stack:
        stack.enter_context(patched(argparse.ArgumentParser, "parse_args", given))
        stack.enter_context(patched(_ppo_trainer_module, "PPOTrainer", ProGPOPPOTrainer))
        stack.enter_context(patched(_ppo_actor_module, "PolicyModelActor", ProGPOPolicyModelActor))
        if getattr(namespace, "progpo_device", "cuda") == "cpu":
            from progpo.openrlhf.cpu.launch import launch_patches

            stack.enter_context(launch_patches(ProGPOPolicyModelActor, getattr(namespace, "progpo_engine_kwargs", {})))
        runpy.run_module(_TRAIN_MODULE, run_name="__main__")
