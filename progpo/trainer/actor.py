"""The actor (trained through DeepSpeed) and its frozen reference, on CPU or one GPU.

Dimension names: ``B`` samples (steps) in a micro-batch, ``L`` padded token length
(prompt + response), ``V`` vocabulary.

A training sample is one step: ``prompt_ids + response_ids``; only response tokens are action
tokens (``action_mask`` = 1), prompt tokens (task, history, observation) are masked out.
Both models run without dropout (``progpo.run.models.disable_dropout``), so every pass that scores
log-probs (old, reference, update; the generator's too) gives the same values for the same weights.
DeepSpeed runs in this one process (world size 1; gloo on CPU). Its shared-memory allreduce op is
useless for one process and would compile C++ (docs/training.md, "DeepSpeed on one machine"), so it is switched off
before the engine starts (see ``init_single_process_distributed``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import tempfile
import time
from dataclasses import dataclass, field

import torch

from progpo.run.divergence import FiniteAdamW
from progpo.run.logprobs import sequence_logprobs
from progpo.run.models import disable_dropout
from progpo.run.precision import Precision, fp32_output_head, resolve_precision
from progpo.run.settings import TrainSettings
from progpo.trainer.settings import ActorSettings, DeepSpeedSettings

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ActorConfig:
    """Runtime settings of the actor: the run's settings objects, plus the two values a run derives.

    Attributes:
        actor: ``--actor.*`` (``model_name_or_path`` must be a model folder here: the caller resolves
            aliases and run folders with ``progpo.run.models.resolve_pretrain``); AdamW from ``adam``,
            gradient clipping from ``max_norm`` (0 = off), the lr schedule from ``lr_scheduler``,
            ``lr_warmup_ratio`` and ``min_lr_ratio``.
        ds: ``--ds.*``: ZeRO stage, weight dtype, mixed precision (:mod:`progpo.run.precision`) and the
            LoRA adapter (``lora.rank`` 0 = none; ``progpo.run.lora``).
        train: ``--train.*``: ``micro_batch_size`` (samples per forward/backward) and ``seed`` (the
            adapter's random start).
        use_ref: keep a frozen reference model (``--algo.kl.init_coef > 0`` on ``train``; False for the
            warm start); with LoRA the reference is the base model with the adapter disabled (no second copy), or
            with ``adapter`` a frozen copy of that adapter.
        scheduler_steps: length of the lr schedule in optimizer steps (the trainer passes the most a run
            can take; ``ceil(lr_warmup_ratio * scheduler_steps)`` warmup steps, as OpenRLHF); needed by
            every schedule but ``constant`` without warmup.
        adapter: with LoRA, a peft adapter folder the trained adapter starts from instead of a fresh one
            (``train`` after a warm start with ``--sft.lora true``); with ``use_ref`` the reference is then
            the model with a frozen copy of it (:func:`progpo.run.lora.load_lora`). None: a fresh adapter.

    Raises:
        ValueError: ``scheduler_steps`` < 1, or missing for a schedule that needs it (naming
            ``--actor.lr_scheduler``); the settings objects check their own fields.
    """

    actor: ActorSettings = field(default_factory=ActorSettings)
    ds: DeepSpeedSettings = field(default_factory=DeepSpeedSettings)
    train: TrainSettings = field(default_factory=TrainSettings)
    use_ref: bool = True
    scheduler_steps: int | None = None
    adapter: str | None = None

    def __post_init__(self) -> None:
        a = self.actor
        if self.adapter is not None and self.ds.lora.rank < 1:
            raise ValueError(f"an adapter to start from ({self.adapter}) needs --ds.lora.rank >= 1")
        if self.scheduler_steps is not None and self.scheduler_steps < 1:
            raise ValueError(f"scheduler_steps must be >= 1, got {self.scheduler_steps}")
        if self.scheduler_steps is None and (a.lr_scheduler != "constant" or a.lr_warmup_ratio > 0):
            raise ValueError(f"--actor.lr_scheduler {a.lr_scheduler} with --actor.lr_warmup_ratio "
                             f"{a.lr_warmup_ratio} needs the schedule's length (scheduler_steps)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_single_process_distributed() -> float:
    """Start torch.distributed (world size 1) for DeepSpeed, without compiling its shm op.

    Sets ``TORCH_EXTENSIONS_DIR`` to ``~/.cache/progpo/torch_extensions`` unless set, marks
    DeepSpeed's ``deepspeed_shm_comm`` op as unavailable (world size 1 never uses it; building it is a
    slow C++ compile, docs/training.md), picks gloo on CPU / nccl on CUDA. Idempotent.

    Returns:
        Seconds spent.
    """
    t0 = time.perf_counter()
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.expanduser("~/.cache/progpo/torch_extensions"))
    import deepspeed

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return time.perf_counter() - t0
    world = int(os.environ.get("WORLD_SIZE", "1"))
    init_method = None
    if world == 1:
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
        if "MASTER_PORT" not in os.environ:
            # A file rendezvous: a free port picked here can be taken by another process before the TCP store
            # binds it (EADDRINUSE, seen with Ray and other trainers starting beside this one).
            init_method = "file://" + os.path.join(tempfile.mkdtemp(prefix="progpo-dist-"), "store")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))  # DeepSpeed wants it set; unused with a file rendezvous
        os.environ.setdefault("RANK", "0")
        os.environ.setdefault("LOCAL_RANK", "0")
        os.environ.setdefault("WORLD_SIZE", "1")
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if init_method is None:
        deepspeed.init_distributed(dist_backend=backend)
    else:
        deepspeed.init_distributed(dist_backend=backend, init_method=init_method, rank=0, world_size=1)
    return time.perf_counter() - t0


def lr_scheduler(cfg: ActorConfig, optimizer: torch.optim.Optimizer):
    """The learning-rate schedule of ``optimizer``, built as OpenRLHF 0.11.2's DeepSpeed strategy builds it.

    ``transformers.get_scheduler(cfg.actor.lr_scheduler, num_warmup_steps=ceil(scheduler_steps *
    lr_warmup_ratio), num_training_steps=scheduler_steps)``, with ``min_lr_rate=min_lr_ratio`` for the
    two cosine-with-min-lr schedules. With warmup the lr of optimizer step ``k`` (0-based) is
    ``lr * k / warmup`` for ``k < warmup`` (so the first step has lr 0, as in OpenRLHF).

    Returns:
        A ``torch.optim.lr_scheduler.LambdaLR``, or None for ``constant`` without warmup (the
        optimizer's lr is then never changed).
    """
    import math

    from transformers import get_scheduler

    if cfg.actor.lr_scheduler == "constant" and cfg.actor.lr_warmup_ratio == 0:
        return None
    kwargs = {"min_lr_rate": cfg.actor.min_lr_ratio} if cfg.actor.lr_scheduler in {"cosine_with_min_lr",
                                                                         "cosine_warmup_with_min_lr"} else {}
    return get_scheduler(cfg.actor.lr_scheduler, optimizer,
                         num_warmup_steps=math.ceil(cfg.scheduler_steps * cfg.actor.lr_warmup_ratio),
                         num_training_steps=cfg.scheduler_steps, scheduler_specific_kwargs=kwargs)


def ds_config(cfg: ActorConfig) -> dict:
    """The DeepSpeed config dict for the actor (client AdamW optimizer, manual accumulation)."""
    zero = {"stage": cfg.ds.zero_stage}
    if cfg.ds.zero_stage == 3:
        zero.update({"stage3_param_persistence_threshold": 0, "stage3_max_live_parameters": 1e9})
    return {
        "train_micro_batch_size_per_gpu": cfg.train.micro_batch_size,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": cfg.actor.max_norm,
        "zero_optimization": zero,
        "bf16": {"enabled": cfg.ds.param_dtype == "bf16"},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def pack_samples(samples: list[tuple[list[int], list[int]]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad ``(prompt_ids, response_ids)`` pairs into ``input_ids``, ``attention_mask``, ``action_mask`` ``[B, L]``."""
    width = max(len(p) + len(r) for p, r in samples)
    b = len(samples)
    ids = torch.full((b, width), pad_id, dtype=torch.long)
    attn = torch.zeros((b, width), dtype=torch.long)
    act = torch.zeros((b, width), dtype=torch.float32)
    for k, (p, r) in enumerate(samples):
        n = len(p) + len(r)
        ids[k, :n] = torch.tensor(list(p) + list(r), dtype=torch.long)
        attn[k, :n] = 1
        act[k, len(p):n] = 1.0
    return {"input_ids": ids, "attention_mask": attn, "action_mask": act}


class Actor:
    """DeepSpeed-wrapped policy + frozen reference.

    Attributes:
        engine: the ``DeepSpeedEngine`` (``engine.module`` is the HF model, or its peft wrapper with LoRA).
        ref: the frozen reference model (eval mode, no grad), or None (no KL term, or LoRA: the
            reference is ``engine.module`` with its adapter disabled, or with ``cfg.adapter`` its frozen reference
            adapter active, see :attr:`has_reference`).
        scheduler: the learning-rate schedule DeepSpeed steps after each applied optimizer step, or None.
        optimizer: what DeepSpeed steps; its client optimizer is a :class:`~progpo.run.divergence.FiniteAdamW`
            (a step with non-finite gradients or lr is skipped and counted in ``engine.skipped_steps``).
        tokenizer: the model's tokenizer.
        precision: the resolved ``--ds.mixed_precision`` (logged once at start-up); every forward pass of
            the actor and reference (log-probs, training, warm start) runs in ``precision.context()``.
        init_seconds: wall time of ``deepspeed.initialize`` (incl. distributed init).
    """

    def __init__(self, cfg: ActorConfig) -> None:
        import deepspeed
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.cfg = cfg
        t0 = time.perf_counter()
        self.dist_seconds = init_single_process_distributed()
        dtype = torch.bfloat16 if cfg.ds.param_dtype == "bf16" else torch.float32
        self.precision: Precision = resolve_precision(cfg.ds.mixed_precision, param_dtype=cfg.ds.param_dtype,
                                                      device_type="cuda" if torch.cuda.is_available() else "cpu")
        logger.info("precision: %s (%s)", self.precision.name, self.precision.reason)
        self.tokenizer = AutoTokenizer.from_pretrained(cfg.actor.model_name_or_path)
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        model = AutoModelForCausalLM.from_pretrained(cfg.actor.model_name_or_path, dtype=dtype)
        disable_dropout(model)  # every pass that scores log-probs is deterministic, train mode included
        if self.precision.autocast:
            fp32_output_head(model, self.precision.device)  # fp32 logits: log-probs and ratios without bf16 rounding
        if cfg.actor.gradient_checkpointing_enable:
            model.gradient_checkpointing_enable()
        self.ref = None
        if cfg.ds.lora.rank > 0:
            from progpo.run.lora import add_lora

            if cfg.actor.gradient_checkpointing_enable:
                model.enable_input_require_grads()  # frozen embeddings: checkpointed blocks still need grads
            lora = cfg.ds.lora
            if cfg.adapter is not None:
                from progpo.run.lora import load_lora

                model = load_lora(model, cfg.adapter, rank=lora.rank, reference=cfg.use_ref)
            else:
                model = add_lora(model, rank=lora.rank, alpha=lora.alpha, target_modules=lora.target_modules,
                                 dropout=lora.dropout, seed=cfg.train.seed)
        elif cfg.use_ref:
            self.ref = AutoModelForCausalLM.from_pretrained(cfg.actor.model_name_or_path, dtype=dtype).eval()
            disable_dropout(self.ref)
            if self.precision.autocast:
                fp32_output_head(self.ref, self.precision.device)
            self.ref.requires_grad_(False)
        trainable = [p for p in model.parameters() if p.requires_grad]
        adam = cfg.actor.adam
        # AdamW that skips a step with non-finite gradients or lr, as DeepSpeed's ZeRO and bf16 optimizers do
        optim = FiniteAdamW(trainable, lr=adam.lr, betas=adam.betas, weight_decay=adam.weight_decay)
        self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=model, optimizer=optim, lr_scheduler=lr_scheduler(cfg, optim), config=ds_config(cfg))
        self.device = self.engine.device
        if self.ref is not None:
            self.ref.to(self.device)
        self.init_seconds = time.perf_counter() - t0

    @property
    def model(self):
        """The HF model inside the engine (its peft wrapper with LoRA)."""
        return self.engine.module

    @property
    def optimizer_client(self) -> FiniteAdamW:
        """The client AdamW: DeepSpeed's optimizer itself at ZeRO-0 fp32, else inside its ZeRO or bf16 wrapper."""
        return self.engine.basic_optimizer

    @property
    def has_reference(self) -> bool:
        """A KL reference exists: the frozen copy, or with LoRA the adapter-disabled model (with ``cfg.adapter``: the
        frozen reference adapter)."""
        return self.ref is not None or (self.cfg.ds.lora.rank > 0 and self.cfg.use_ref)

    def generation_context(self):
        """Context in which ``self.model`` holds full parameters (ZeRO-3 gathers them)."""
        if self.cfg.ds.zero_stage == 3:
            import deepspeed

            return deepspeed.zero.GatheredParameters(list(self.model.parameters()))
        return contextlib.nullcontext()

    @torch.no_grad()
    def logprobs(self, samples: list[tuple[list[int], list[int]]], temperature: float = 1.0,
                 *, reference: bool = False) -> list[torch.Tensor]:
        """Per-token log-probs of each sample's response tokens (``[R_k]`` each), in micro-batches.

        ``reference``: under the KL reference (the frozen copy, or with LoRA the adapter disabled or, with
        ``cfg.adapter``, the frozen reference adapter active: :func:`progpo.run.lora.reference_context`).

        Raises:
            ValueError: ``reference`` without a reference (built with ``use_ref=False``).
        """
        if reference and not self.has_reference:
            raise ValueError("no reference model: built with use_ref=False")
        from progpo.run.lora import reference_context

        model = self.ref if reference and self.ref is not None else self.engine
        with reference_context(self.model) if reference and self.ref is None else contextlib.nullcontext():
            return self._logprobs(model, samples, temperature)

    def _logprobs(self, model, samples: list[tuple[list[int], list[int]]], temperature: float) -> list[torch.Tensor]:
        out = []
        mb = self.cfg.train.micro_batch_size
        for start in range(0, len(samples), mb):
            chunk = samples[start:start + mb]
            t = pack_samples(chunk, self.tokenizer.pad_token_id)
            with self.precision.context():
                lp, _ = sequence_logprobs(model, t["input_ids"].to(self.device), t["attention_mask"].to(self.device),
                                          temperature, start=min(len(p) for p, _ in chunk))
            for k, (p, r) in enumerate(chunk):
                out.append(lp[k, len(p):len(p) + len(r)].float().cpu())
        return out
