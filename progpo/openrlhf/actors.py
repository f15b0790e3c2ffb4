"""OpenRLHF 0.11.2 model actors, as ProGPO runs them: padding-aware training metrics and run checks.

* :class:`StepActorPPOTrainer` -- OpenRLHF's ``ActorPPOTrainer`` (the policy's PPO step) whose
  training metrics leave out the padding rows of rank-equal step batches
  (``progpo.openrlhf.balance``): the loss and the gradients are OpenRLHF's, unchanged (padding rows
  have no action tokens, so they add nothing to either); a non-finite loss is backpropagated as NaN and the
  optimizer steps DeepSpeed skips for it are counted (``progpo.run.divergence``).
* :class:`ProGPOPolicyModelActor` -- OpenRLHF's ``PolicyModelActor`` with that trainer, plus the
  ``--debug.*`` aids (full weights for the sync check, replay-buffer dumps, per-rank counts of
  forward passes, micro-batches and optimizer steps).
* :class:`ProGPOReferenceModelActor` -- OpenRLHF's ``ReferenceModelActor`` counting its forward passes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ray
import torch
from openrlhf.trainer.ray.launcher import ReferenceModelActor
from openrlhf.trainer.ray.ppo_actor import ActorPPOTrainer, PolicyModelActor
from openrlhf.utils.distributed_util import torch_dist_barrier_and_cuda_sync

from progpo.openrlhf.balance import real_rows
from progpo.openrlhf.experience import _write_json
from progpo.openrlhf.launch import ray_run
from progpo.openrlhf.patching import patched
from progpo.openrlhf.version import OPENRLHF_VERSION
from progpo.run.divergence import SkipStreak, guard_optimizer, poison_nonfinite_loss
from progpo.run.metrics import SKIPPED_KEY
from progpo.run.models import disable_dropout

EMPTY_WEIGHT = 1e-30
"""Token / sample count reported for a micro-batch without real rows. OpenRLHF's ``ppo_train``
divides summed metrics by the counts summed over ranks; when every rank's micro-batch is padding
that sum would be 0 (a ``ZeroDivisionError``). The metric values of such a micro-batch are 0, so
this weight adds exactly 0 to every sum, and ``1e-30`` is lost against any real count (>= 1) even
in float32."""

SKIP_STREAK_KEY = "_progpo_skip_streak"
"""Key of the policy's ``fit`` status: optimizer steps skipped in a row (``SkipStreak.streak``); not a metric."""


def pad_free_status(status: dict[str, Any], real: torch.Tensor) -> dict[str, Any]:
    """One micro-batch's ``training_step`` status with its padding rows left out of the metrics.

    Args:
        status: what OpenRLHF's ``ActorPPOTrainer.training_step`` returned (``metrics``,
            ``weights``: ``"token"`` / ``"sample"`` / None, ``num_samples``, ``num_action_tokens``).
        real: ``[B]`` bool, the rows with action tokens.

    Returns:
        The status with sample-weighted metrics (``[B]`` tensors) restricted to the real rows,
        ``num_samples`` = real rows, and, for a micro-batch without real rows, every weighted metric
        0 (OpenRLHF's masked means are 0/0 there) and both counts :data:`EMPTY_WEIGHT`. Token-weighted
        metrics of other micro-batches are already masked means over action tokens (unchanged).
    """
    metrics, weights = dict(status["metrics"]), status["weights"]
    n_real = int(real.sum())
    for key, value in metrics.items():
        weight = weights.get(key)
        if weight is None or not isinstance(value, torch.Tensor):
            continue
        if n_real == 0:
            metrics[key] = torch.zeros(())
        elif weight == "sample" and value.dim() == 1 and value.shape[0] == real.shape[0]:
            metrics[key] = value[real]
    return {**status, "metrics": metrics, "num_samples": float(n_real) if n_real else EMPTY_WEIGHT,
            "num_action_tokens": status["num_action_tokens"] if n_real else EMPTY_WEIGHT}


class StepActorPPOTrainer(ActorPPOTrainer):
    """OpenRLHF's policy PPO trainer; metrics without padding rows, and counts for run checks.

    Attributes:
        progpo_micro_batches: ``training_step`` calls since the last :meth:`progpo_take_counts`.
        progpo_skips: the optimizer steps DeepSpeed skipped for a non-finite gradient norm (its ZeRO and bf16
            optimizers' overflow check; ``engine.skipped_steps``), as a :class:`~progpo.run.divergence.SkipStreak`
            (``limit``: ``--train.max_nonfinite_skips``); None until the first :meth:`training_step`.
    """

    progpo_micro_batches = 0
    progpo_skips: SkipStreak | None = None

    def training_step(self, experience: Any, kl_ctl: float, step: int, loss_batch_info: dict | None = None) -> dict:
        """OpenRLHF's ``training_step`` (loss, backward, optimizer step) with a non-finite loss backpropagated as
        NaN (:func:`~progpo.run.divergence.poison_nonfinite_loss`: DeepSpeed then skips the step), each optimizer
        step counted as applied or skipped in :attr:`progpo_skips`, then :func:`pad_free_status`."""
        engine = self.actor.model  # the DeepSpeed engine
        before = (getattr(engine, "global_steps", None), getattr(engine, "skipped_steps", None))
        client = getattr(engine, "basic_optimizer", None)  # inside a ZeRO/bf16 wrapper: its lr check is ours
        if getattr(client, "overflow", None) is not None:
            client.overflow = False  # a wrapper that skips the step itself never calls the client's step
        backward = self.strategy.backward
        with patched(self.strategy, "backward", lambda loss, *a, **k: backward(poison_nonfinite_loss(loss), *a, **k)):
            status = super().training_step(experience, kl_ctl, step, loss_batch_info)
        if self.progpo_skips is None:
            self.progpo_skips = SkipStreak(ray_run(self.strategy.args).settings.train.max_nonfinite_skips)
        if before[0] is not None and engine.global_steps != before[0]:  # an optimizer step, applied or skipped
            applied = engine.skipped_steps == before[1] and not getattr(client, "overflow", False)
            self.progpo_skips.record(applied=applied)
        self.progpo_micro_batches += 1
        real = real_rows(experience)
        return status if bool(real.all()) else pad_free_status(status, real)


def guard_engine(engine: Any) -> list[str]:
    """:func:`~progpo.run.divergence.guard_optimizer` on a DeepSpeed engine's ``optimizer`` (on ZeRO-0 fp32 the bare
    optimizer, stepped unchecked) and ``basic_optimizer`` (inside a ZeRO/bf16 wrapper, which checks the gradient norm
    but not the lr). Returns the attributes guarded."""
    return [name for name in ("optimizer", "basic_optimizer")
            if getattr(engine, name, None) is not None and guard_optimizer(getattr(engine, name))]


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
    """OpenRLHF's policy actor (DeepSpeed model, PPO loss, weight sync) with :class:`StepActorPPOTrainer`
    and dropout off.

    :meth:`init_model_from_pretrained` switches every dropout of the model off
    (:func:`progpo.run.models.disable_dropout`, the local backend's rule): OpenRLHF 0.11.2 scores the
    old log-probs in eval mode but runs the update's forward in train mode, so a checkpoint with
    ``attention_dropout > 0`` gave ratios != 1 and a KL > 0 to an equal reference. (Its reference
    actor and the vLLM engines run in eval mode.)

    Debugging aids:

    * ``progpo_full_state()``: the actor's full parameters (ZeRO-3 gathered) on rank 0, for the
      ``--debug.check_weight_sync`` comparison with the engines (with LoRA: the merged weights
      under the base model's names, which is what the engines hold).
    * With ``--debug.dump_dir``: before each ``fit``, the replay buffer it is about to train on
      (per sample: rollout index, sequence, action mask, advantages) is written to
      ``iter<NNN>_actor_rank<R>.json`` (see :meth:`fit`).
    * ``progpo_counts()``: this rank's forward passes, training micro-batches and optimizer steps
      since the last call (read by the trainer with ``--debug.dump_dir``).
    Training itself is OpenRLHF's, unchanged; with a LoRA adapter the weight sync sends merged
    weights (:func:`broadcast_merged_to_engines`) and the final save adds the merged model.
    """

    def init_model_from_pretrained(self, *args: Any, **kwargs: Any) -> None:
        """OpenRLHF's; then every dropout of the trained model (and of its EMA copy) is off, its
        ``ActorPPOTrainer`` becomes a :class:`StepActorPPOTrainer`, and the bare optimizer (DeepSpeed's on ZeRO-0
        fp32, which it steps unchecked, or the one inside its ZeRO/bf16 wrapper, whose lr it does not check) skips
        non-finite steps (:func:`~progpo.run.divergence.guard_optimizer`).

        The trainer is built by OpenRLHF's own constructor; only its class is switched to the
        subclass (which adds methods, no state). Patching the name ``ActorPPOTrainer`` in OpenRLHF's
        module would not reach it: Ray ships this actor class to the worker by value, with its own
        copy of the method's globals.

        Raises:
            RuntimeError: OpenRLHF built something other than ``ActorPPOTrainer`` (another version).
        """
        super().init_model_from_pretrained(*args, **kwargs)
        for model in (self.actor, getattr(self, "ema_model", None)):
            if model is not None:
                disable_dropout(model)
        if type(self.trainer) is not ActorPPOTrainer:
            raise RuntimeError(f"OpenRLHF built a {type(self.trainer).__name__} as the policy trainer, not "
                               f"ActorPPOTrainer (openrlhf {OPENRLHF_VERSION} is the supported version)")
        self.trainer.__class__ = StepActorPPOTrainer
        guard_engine(self.actor.model)

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        """OpenRLHF's forward (log-probs of a rollout chunk), counted."""
        self.__dict__["_progpo_forwards"] = self.__dict__.get("_progpo_forwards", 0) + 1
        return super().forward(*args, **kwargs)

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
        """OpenRLHF's ``fit``, after writing the replay buffer to ``--debug.dump_dir`` when set; its status gains
        ``loss/update_skipped_nonfinite`` (optimizer steps of this fit DeepSpeed skipped for a non-finite gradient
        norm) and :data:`SKIP_STREAK_KEY` (consecutive skipped steps, read and removed by the trainer actor).

        Dump rows: ``index`` (position in the rollout batch), ``sequences`` ``[T]``, ``action_mask``
        ``[A]``, ``advantages`` ``[A]`` (``A = T - 1``), ``response_length``.
        """
        if self._dump_dir():
            self._dump_replay_buffer()
        engine = self.actor.model
        before = (engine.global_steps, engine.micro_steps)
        status = super().fit(kl_ctl)
        counts = self.__dict__.setdefault("_progpo_fit_counts", {"optimizer_steps": 0, "micro_steps": 0})
        counts["optimizer_steps"] += engine.global_steps - before[0]
        counts["micro_steps"] += engine.micro_steps - before[1]
        skips = self.trainer.progpo_skips  # None: no training_step ran
        if skips is not None:
            status[SKIPPED_KEY] = float(skips.take_skipped())
            status[SKIP_STREAK_KEY] = float(skips.streak)
        return status

    def progpo_counts(self) -> dict[str, int]:
        """This rank's counts since the last call, then reset.

        Returns:
            ``rank``; ``node_id`` (the Ray node); ``forward`` (experience-making forward passes); ``micro_batches``
            (``training_step`` calls); ``optimizer_steps`` (DeepSpeed ``global_steps`` advanced);
            ``micro_steps`` (DeepSpeed micro-steps); ``pending_micro_steps`` (DeepSpeed micro-steps
            since the last optimizer step: gradient that would be carried into the next iteration);
            ``gas`` (gradient accumulation steps).
        """
        engine = self.actor.model
        fit = self.__dict__.pop("_progpo_fit_counts", {"optimizer_steps": 0, "micro_steps": 0})
        gas = int(engine.gradient_accumulation_steps())
        out = {"rank": torch.distributed.get_rank(), "node_id": ray.get_runtime_context().get_node_id(),
               "forward": self.__dict__.pop("_progpo_forwards", 0),
               "micro_batches": self.trainer.progpo_micro_batches, **fit,
               "pending_micro_steps": int(engine.micro_steps) % gas, "gas": gas}
        self.trainer.progpo_micro_batches = 0
        return out

    def _dump_dir(self) -> str | None:
        return ray_run(self.strategy.args).dump_dir

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


@ray.remote(num_gpus=1)
class ProGPOReferenceModelActor(ReferenceModelActor.__ray_actor_class__):
    """OpenRLHF's reference actor (ZeRO-3 eval forward), with its forward passes counted."""

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        """OpenRLHF's forward, counted."""
        self.__dict__["_progpo_forwards"] = self.__dict__.get("_progpo_forwards", 0) + 1
        return super().forward(*args, **kwargs)

    def progpo_counts(self) -> dict[str, int]:
        """``rank``, ``node_id`` and ``forward`` passes since the last call, then reset."""
        return {"rank": torch.distributed.get_rank(), "node_id": ray.get_runtime_context().get_node_id(),
                "forward": self.__dict__.pop("_progpo_forwards", 0)}
