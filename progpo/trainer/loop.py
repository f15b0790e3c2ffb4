"""The local trainer: rollout -> advantages -> update -> log -> checkpoint, once per iteration.

Each stage is one method. The advantage stage calls the estimator registry
(``progpo.advantages.compute_advantages``) with the run's ``AdvantageConfig``; nothing here knows
which estimator runs. Generation runs on the actor's own weights (transformers ``generate``; see
``progpo.run.generation``), so the rollout is always on-policy.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from transformers import AutoConfig

from progpo.advantages import compute_advantages
from progpo.agents.batching import cut_answer_warning, episodes_to_step_batch, rollout_metrics, training_steps
from progpo.agents.episode import EpisodeConfig, TaskSpec, run_episodes
from progpo.agents.types import Episode, SamplingParams
from progpo.run.answer_format import check_model_answer_format
from progpo.run.checkpoint import CheckpointManager, check_run_dir
from progpo.run.divergence import NonFiniteUpdate, SkipStreak
from progpo.run.dynamic_sampling import (DynamicSamplingStats, equal_returns, group_returns, keep_signal_groups,
                                         signal_discount)
from progpo.trainer.config import TrainConfig
from progpo.run.encoder import LazyEncoder
from progpo.run.env_setup import open_env_pool
from progpo.run.failures import check_failures, failure_metrics
from progpo.run.metrics import SKIPPED_KEY, MetricsLogger
from progpo.run.models import resolve_pretrain
from progpo.run.settings import check_prompt_budget
from progpo.run.task_sampler import TaskSampler  # noqa: F401 - also this module's API (tests, benches)
from progpo.trainer.progress import RunProgress, TqdmWriter
from progpo.trainer.rollout_backend import VLLM_MAX_MODEL_LEN, actor_computes_in_bf16, rollout_engine_dtype
from progpo.trainer.update import TrainSample, num_micro_batches, ppo_update, prepare, rollout_mismatch
from progpo.trainer.warm_start import adapter_dir, warm_start

logger = logging.getLogger(__name__)

_SEED_MIX = 1_000_003


def iteration_seed(seed: int, iteration: int) -> int:
    """Sampling seed of one iteration (pure function of the run seed and the iteration number)."""
    return (seed * _SEED_MIX + iteration) % (2**31 - 1)


def check_model_context(cfg: TrainConfig) -> None:
    """The local backend's prompt budget check: ``--rollout.max_prompt_tokens`` + ``--rollout.max_new_tokens``
    must fit the policy's context (its ``max_position_embeddings``; with ``--rollout.backend vllm`` at most the
    engine's ``max_model_len``), the local counterpart of train_ray's ``--data.max_len``
    (:func:`progpo.run.settings.check_prompt_budget`). Reads only the model's config.

    Raises:
        FlagError: the budget does not fit (both flags, their sum and the context named).
        FileNotFoundError: ``--actor.model_name_or_path`` is no model (:func:`progpo.run.models.resolve_pretrain`).
    """
    name = cfg.actor.model_name_or_path
    context = getattr(AutoConfig.from_pretrained(resolve_pretrain(name)), "max_position_embeddings", None)
    if not context:
        return
    limit = f"the {context}-token context of --actor.model_name_or_path {name} (max_position_embeddings)"
    if cfg.rollout.backend == "vllm" and context > VLLM_MAX_MODEL_LEN:
        context, limit = VLLM_MAX_MODEL_LEN, f"the {VLLM_MAX_MODEL_LEN}-token max_model_len of --rollout.backend vllm"
    check_prompt_budget(cfg.rollout.max_prompt_tokens, cfg.rollout.max_new_tokens, context, limit)


def check_vllm_backend(cfg: TrainConfig) -> None:
    """``--rollout.backend vllm``, checked before anything starts: vLLM installed (on a machine without CUDA
    vllm-cpu :data:`~progpo.run.vllm_cpu.VLLM_CPU_VERSION`, and a model whose head size its attention
    takes). Reads the package metadata and the model's config (and, on CPU, vLLM's list of head sizes).

    Raises:
        ValueError: one line: how to install vLLM, or the model and its head size.
    """
    if cfg.rollout.backend != "vllm":
        return
    import importlib.util

    if torch.cuda.is_available():
        if importlib.util.find_spec("vllm") is None:
            raise ValueError("--rollout.backend vllm needs vllm: pip install -e '.[gpu]' (docs/distributed.md, "
                             "\"Install\"); or run without it: --rollout.backend hf")
    else:
        from progpo.run.vllm_cpu import check_head_dim, check_vllm_cpu

        check_vllm_cpu("--rollout.backend vllm", "--rollout.backend hf")
        check_head_dim(resolve_pretrain(cfg.actor.model_name_or_path), "--rollout.backend vllm", "--rollout.backend hf")
    dtype, why = rollout_engine_dtype(cfg.rollout.engine_dtype, actor_computes_in_bf16(cfg.ds))
    logger.info("rollout engine: vLLM, dtype %s (%s)", dtype, why)


def signal_metrics(episodes: list[Episode]) -> dict[str, float]:
    """Whether a rollout can teach anything, and the WebShop score.

    Returns:
        ``rollout/flat_group_frac``: share of groups (tasks, by ``uid``, with >= 1 finished episode)
        whose episode returns ``R_i`` are all equal (:func:`progpo.run.dynamic_sampling.equal_returns`;
        dynamic sampling drops such groups unless the estimator judges on ``G_0``, ProGPO's default): such
        a group has no episode-level signal, and
        when every group is flat the batch carries none at all. A group left with one finished
        episode (the others failed) is flat: there is nothing to compare its return with.
        ``env/score_mean``: mean of the episodes' ``info["score"]`` (WebShop's [0, 1] score), when the
        env reports one.
    """
    done = [ep for ep in episodes if not ep.failed]
    groups = [r for r in group_returns(done).values() if r]
    out: dict[str, float] = {}
    if groups:
        out["rollout/flat_group_frac"] = float(np.mean([equal_returns(r) for r in groups]))
    scores = [float(ep.info["score"]) for ep in done if "score" in ep.info]
    if scores:
        out["env/score_mean"] = float(np.mean(scores))
    return out


class _CountingGenerate:
    """Forwards ``await generate(prompt_ids, sampling)`` and calls ``on_step(1)`` after each answer."""

    def __init__(self, generate, on_step: Callable[[float], None]) -> None:
        self.generate, self.on_step = generate, on_step

    async def __call__(self, prompt_ids, sampling):
        out = await self.generate(prompt_ids, sampling)
        self.on_step(1)
        return out


@dataclass
class RolloutResult:
    """What the rollout stage hands on.

    Attributes:
        episodes: every episode played this iteration (the metrics describe these).
        metrics: rollout, env and ``perf/generate_s`` / ``perf/gen_tokens`` metrics.
        train_episodes: the episodes the update trains on: all of ``episodes``, or under
            ``--rollout.dynamic_sampling`` only the groups with a return signal (None: all).
    """

    episodes: list[Episode]
    metrics: dict[str, float] = field(default_factory=dict)
    train_episodes: list[Episode] | None = None

    @property
    def training(self) -> list[Episode]:
        """The episodes the update trains on."""
        return self.episodes if self.train_episodes is None else self.train_episodes


class Trainer:
    """Runs ``cfg.train.num_iterations`` iterations of the local backend (unset: one pass over the training tasks).

    Args:
        cfg: the run configuration (``progpo.trainer.config``).
        on_iteration: called with ``(iteration, metrics)`` after each iteration is logged.

    Attributes (after ``fit``): ``history`` (metrics per iteration), ``last_samples`` (the last
    update's ``TrainSample``s, for inspection), ``actor``, ``policy_is_reference`` (no optimizer
    step has changed the policy since it was loaded: it still equals the KL reference).
    """

    def __init__(self, cfg: TrainConfig, on_iteration: Callable[[int, dict[str, float]], None] | None = None) -> None:
        self.cfg = cfg
        self.on_iteration = on_iteration
        self.save_path = Path(cfg.save_path)
        self.ckpt = CheckpointManager(self.save_path, cfg.ckpt.max_num)
        self.rng = np.random.default_rng(cfg.train.seed)
        self.encoder = LazyEncoder()
        self.history: list[dict[str, float]] = []
        self.last_samples: list[TrainSample] = []
        self.actor = None
        self.update_cfg = cfg.update_config()
        self.num_iterations = cfg.train.num_iterations or 1  # until _build counts the tasks (one pass: None)
        self.progress = RunProgress(self.num_iterations, enabled=False)
        self.policy_is_reference = True
        self.skips = SkipStreak(cfg.train.max_nonfinite_skips)

    # ---- setup -------------------------------------------------------------------------------
    def _build(self, envs) -> int:
        """Actor, generator, sampler, logger; resume if asked. Returns the last finished iteration."""
        import dataclasses

        from progpo.trainer.actor import Actor
        from progpo.trainer.rollout_backend import make_generator

        cfg = self.cfg
        latest = self.ckpt.latest()
        if not cfg.ckpt.load_enable and latest is not None:
            raise ValueError(f"--ckpt.path {self.save_path} already holds checkpoints: pass --ckpt.load_enable to "
                             "continue that run, or choose another --ckpt.path")
        if not cfg.ckpt.load_enable and (self.save_path / "metrics.jsonl").is_file():
            # a run stopped before its first checkpoint: appending would mix its records with ours
            raise ValueError(f"--ckpt.path {self.save_path} holds metrics.jsonl of an earlier run (no checkpoint): "
                             "pass --ckpt.load_enable to start that run over (its records are replaced), or choose "
                             "another --ckpt.path")
        check_run_dir(self.save_path)
        pretrain, adapter = cfg.actor.model_name_or_path, None
        if cfg.sft.num_tasks > 0:  # behaviour cloning first (cached), RL from the cloned model
            pretrain = str(warm_start(cfg, envs, out=TqdmWriter()))
            self.warm_start_path = pretrain
            if cfg.sft.lora:  # the clone is an adapter on the untouched base: RL goes on training it
                pretrain, adapter = cfg.actor.model_name_or_path, adapter_dir(pretrain)
        self.sampler = TaskSampler(envs.num_tasks(cfg.env.train_split), cfg.train.seed, offset=cfg.env.task_offset,
                                   count=cfg.env.num_tasks)
        self.num_iterations = cfg.train.iterations(self.sampler.count, cfg.rollout.batch_size)
        if cfg.train.num_iterations is None:
            logger.info("run length: %d iterations, one pass over %d training tasks at --rollout.batch_size %d "
                        "(--train.num_iterations unset)", self.num_iterations, self.sampler.count, cfg.rollout.batch_size)
        actor = dataclasses.replace(cfg.actor, model_name_or_path=resolve_pretrain(pretrain))  # a model folder
        actor_cfg = dataclasses.replace(cfg.actor_config(self.num_iterations), actor=actor, adapter=adapter)
        self.actor = Actor(actor_cfg)
        self.generator = make_generator(cfg.rollout, self.actor, seed=cfg.train.seed)
        self.metrics = MetricsLogger(self.save_path, tensorboard=cfg.logger.tensorboard_dir)
        (self.save_path / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2, default=str))
        start = 0
        if cfg.ckpt.load_enable:
            if latest is not None:
                state = self.ckpt.load(self.actor, latest, self.rng)
                self.sampler.load_state_dict(state["sampler"])
                start = int(state["iteration"])
                self.policy_is_reference = bool(state.get("policy_is_reference", False))
                logger.info("resumed from %s (iteration %d)", latest, start)
                self.ckpt.tidy()  # a run killed during a save may have left leftovers or one checkpoint too many
            else:
                logger.warning("--ckpt.load_enable: no checkpoint in %s, starting from scratch", self.save_path)
            self.metrics.truncate_after(start)  # records after the checkpoint: those iterations are played again
        self._sync_generator()  # the engine samples from the actor's weights from the first rollout on
        return start

    def fit(self) -> list[dict[str, float]]:
        """Run the iterations (from the last checkpoint with ``--ckpt.load_enable``); returns the metrics history.

        Raises:
            NonFiniteUpdate: ``--train.max_nonfinite_skips`` consecutive optimizer steps were skipped for a
                non-finite loss or gradient norm (after that iteration's metrics are logged, before any checkpoint),
                or the weights to checkpoint are not finite (:mod:`progpo.run.divergence`).
        """
        cfg = self.cfg
        max_envs = cfg.rollout.batch_size * cfg.rollout.n_samples_per_prompt
        # before any env, service or model starts: the policy's tokenizer must carry the answer format, and the
        # prompt budget with the answer must fit its context
        given = cfg.actor.model_name_or_path
        check_model_answer_format(resolve_pretrain(given), cfg.env.name, given=given)
        check_model_context(cfg)
        check_vllm_backend(cfg)
        loop = asyncio.new_event_loop()
        try:
            with open_env_pool(cfg.env, max_envs) as envs:
                self.envs = envs
                start = self._build(envs)
                self.progress = RunProgress(self.num_iterations, start, enabled=cfg.logger.progress_bar)
                for it in range(start + 1, self.num_iterations + 1):
                    self.progress.begin_iteration(it)
                    metrics = self.iteration(it, loop)
                    self.progress.end_iteration(
                        {"rollout": metrics["perf/rollout_s"], "advantages": metrics["perf/advantages_s"],
                         "update": metrics["perf/update_s"], "checkpoint": metrics["perf/checkpoint_s"]},
                        postfix={"success": f"{metrics.get('env/success_rate', float('nan')):.2f}"})
        finally:
            self.progress.close()
            loop.close()
            if getattr(self, "metrics", None) is not None:
                self.metrics.close()
        return self.history

    # ---- one iteration -----------------------------------------------------------------------
    def iteration(self, it: int, loop: asyncio.AbstractEventLoop) -> dict[str, float]:
        """rollout -> advantages -> update -> log -> checkpoint."""
        cfg = self.cfg
        t0 = time.perf_counter()
        self.progress.stage("rollout", cfg.rollout.batch_size * cfg.rollout.n_samples_per_prompt * cfg.env.max_steps)
        roll = self.rollout(it, loop)
        t1 = time.perf_counter()
        self.progress.stage("advantages")
        samples, adv_metrics = self.advantages(roll.training) if roll.training else ([], {})
        t2 = time.perf_counter()
        micro = self.actor.cfg.train.micro_batch_size
        self.progress.stage("update", num_micro_batches(len(samples), self.update_cfg, micro))
        upd_metrics = self.update(samples)
        t3 = time.perf_counter()
        n_steps = roll.metrics.get("rollout/num_steps", 0.0)
        perf = {
            "perf/rollout_s": t1 - t0,
            "perf/generate_s": roll.metrics.pop("perf/generate_s"),
            "perf/advantages_s": t2 - t1,
            "perf/update_s": t3 - t2,
            "perf/iteration_s": t3 - t0,
            "perf/steps_per_s": n_steps / max(t3 - t0, 1e-9),
            "perf/gen_tokens_per_s": roll.metrics.pop("perf/gen_tokens") / max(t1 - t0, 1e-9),
        }
        perf["perf/env_s"] = max(perf["perf/rollout_s"] - perf["perf/generate_s"], 0.0)
        perf["perf/advantages_frac"] = perf["perf/advantages_s"] / max(perf["perf/iteration_s"], 1e-9)
        metrics = {**roll.metrics, **adv_metrics, **upd_metrics, **perf}
        self.log(it, metrics)
        if self.skips.tripped:  # logged first: the metrics say which steps were skipped
            latest = self.ckpt.latest()
            raise NonFiniteUpdate(self.skips.message(it, cfg.actor.adam.lr, latest.name if latest else None))
        t4 = time.perf_counter()
        self.progress.stage("checkpoint")
        self.checkpoint(it, diverged=metrics[SKIPPED_KEY] > 0)
        metrics["perf/checkpoint_s"] = time.perf_counter() - t4
        return metrics

    def rollout(self, it: int, loop: asyncio.AbstractEventLoop) -> RolloutResult:
        """Stage 1: play ``rollout.batch_size`` tasks x ``n_samples_per_prompt`` episodes with the current policy.

        Under ``--rollout.dynamic_sampling`` the groups without a return signal are set aside and up
        to ``--rollout.dynamic_sampling_max_rounds`` extra rounds draw as many new tasks as groups are
        missing (``progpo.run.dynamic_sampling``); ``RolloutResult.train_episodes`` then holds the kept
        groups only, and ``rollout/dynamic_*`` metrics say what was dropped and drawn.
        """
        cfg = self.cfg
        seed = iteration_seed(cfg.train.seed, it)
        sampling = SamplingParams(temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
                                  max_new_tokens=cfg.rollout.max_new_tokens, seed=seed)
        self.generator.set_seed(seed)
        g0 = dict(self.generator.stats)
        tasks = [TaskSpec(cfg.env.train_split, i) for i in self.sampler.next(cfg.rollout.batch_size)]
        episodes = self._play(tasks, sampling, 0, loop)
        kept = None
        stats = None
        if cfg.rollout.dynamic_sampling:
            stats = DynamicSamplingStats()
            kept = self._keep_signal(episodes, stats)
            while len({ep.uid for ep in kept}) < cfg.rollout.batch_size and stats.rounds < cfg.rollout.dynamic_sampling_max_rounds:
                stats.rounds += 1
                missing = cfg.rollout.batch_size - len({ep.uid for ep in kept})
                extra = [TaskSpec(cfg.env.train_split, i, uid=f"{cfg.env.train_split}:{i}@{stats.rounds}")
                         for i in self.sampler.next(missing)]
                stats.extra_groups += len(extra)
                more = self._play(extra, sampling, len(episodes), loop)
                episodes += more
                kept += self._keep_signal(more, stats, want=missing)
        sample = next((ep.steps[0] for ep in episodes if ep.steps), None)
        if sample is not None:
            logger.info("iteration %d sample response: %r -> action %r", it, sample.response_text[:300], sample.action[:80])
        check_failures(episodes, cfg.env.max_failed_frac, it)
        cut = cut_answer_warning(episodes)
        if cut:
            logger.warning("iteration %d: %s", it, cut)
        metrics = rollout_metrics(episodes)
        metrics.update(signal_metrics(episodes))
        metrics.update(failure_metrics(episodes))
        if stats is not None:
            metrics.update(stats.metrics())
        metrics["perf/generate_s"] = self.generator.stats["seconds"] - g0["seconds"]
        metrics["perf/gen_tokens"] = float(self.generator.stats["tokens"] - g0["tokens"])
        return RolloutResult(episodes, metrics, train_episodes=kept)

    def _play(self, tasks: list[TaskSpec], sampling: SamplingParams, traj_id_start: int,
              loop: asyncio.AbstractEventLoop) -> list[Episode]:
        """``n_samples_per_prompt`` episodes of every task (trajectory ids from ``traj_id_start``)."""
        cfg = self.cfg
        with self.actor.generation_context():
            return loop.run_until_complete(run_episodes(
                tasks, EpisodeConfig(env=cfg.env, rollout=cfg.rollout, sampling=sampling,
                                     n_samples_per_task=cfg.rollout.n_samples_per_prompt),
                env_pool=self.envs.pool, generate=_CountingGenerate(self.generator, self.progress.advance),
                tokenizer=self.actor.tokenizer, traj_id_start=traj_id_start,
                on_episode_end=lambda ep: self.progress.advance(cfg.env.max_steps - len(ep.steps)),
            ))

    def _keep_signal(self, episodes: list[Episode], stats: DynamicSamplingStats, want: int | None = None) -> list[Episode]:
        """The groups of ``episodes`` with a return signal (at most ``want``); counts drawn and dropped groups."""
        kept, kept_uids, no_signal = keep_signal_groups(episodes, self.cfg.rollout.batch_size if want is None else want,
                                                        signal_discount(self.cfg.progpo))
        stats.drawn_groups += len({ep.uid for ep in episodes})
        stats.dropped_groups += no_signal
        return kept

    def advantages(self, episodes: list[Episode]) -> tuple[list[TrainSample], dict[str, float]]:
        """Stage 2: one ``StepBatch`` row per step -> the configured estimator -> one sample per step."""
        batch = episodes_to_step_batch(episodes)
        enc0 = self.encoder.seconds
        result = compute_advantages(batch, self.cfg.progpo, encoder=self.encoder)
        adv = np.asarray(result.advantages, dtype=np.float64)
        if adv.shape != (batch.num_steps,) or not np.all(np.isfinite(adv)):
            raise ValueError(f"estimator {self.cfg.algo.advantage.estimator!r} returned advantages of shape {adv.shape} "
                             f"(finite: {bool(np.all(np.isfinite(adv)))}), expected ({batch.num_steps},) finite")
        steps = training_steps(episodes)
        samples = [TrainSample(s.prompt_ids, s.response_ids, float(a),
                               rollout_logprobs=torch.tensor(s.logprobs, dtype=torch.float32) if s.logprobs else None)
                   for s, a in zip(steps, adv) if s.response_ids]
        metrics = {k if k.startswith("adv/") else f"adv/{k}": float(v) for k, v in result.diagnostics.items()}
        for name, value in (("adv/mean", adv.mean()), ("adv/std", adv.std()), ("adv/frac_zero", np.mean(adv == 0.0))):
            metrics.setdefault(name, float(value))
        metrics["adv/abs_mean"] = float(np.abs(adv).mean())
        metrics["perf/encoder_s"] = self.encoder.seconds - enc0
        return samples, metrics

    def skip_reason(self, samples: list[TrainSample]) -> str | None:
        """Why the update of ``samples`` would change nothing (so it is skipped), or None.

        An update moves the policy only through a non-zero loss gradient or the optimizer's own
        terms. With every advantage exactly 0 the policy-gradient term is exactly 0; the KL term is
        0 with its gradient when the KL is off or the policy still equals the reference; the entropy
        bonus and AdamW's weight decay would still move it, so with either on nothing is skipped.
        (A skipped update also skips AdamW's momentum step: zero gradients would still move the
        weights by the moments of earlier steps.)
        """
        if not samples:
            return "no training samples"
        u = self.update_cfg
        decay = self.actor.cfg.actor.adam.weight_decay
        if any(s.advantage != 0.0 for s in samples) or u.actor.entropy_coef > 0 or decay > 0:
            return None
        if u.kl.init_coef == 0:
            return "every advantage is 0 and the KL term is off"
        if self.policy_is_reference:
            return "every advantage is 0 and the policy equals the reference"
        return None

    def update(self, samples: list[TrainSample]) -> dict[str, float]:
        """Stage 3: recompute behaviour/reference log-probs, then PPO epochs through DeepSpeed.

        Skipped (``loss/update_skipped`` = 1, no forward pass at all) when :meth:`skip_reason` finds
        that it could not change the policy.
        """
        reason = self.skip_reason(samples)
        if reason is not None:
            logger.info("update skipped: %s", reason)
            self.last_samples = samples
            return {"loss/update_skipped": 1.0, "loss/optimizer_steps": 0.0, SKIPPED_KEY: 0.0, "perf/logprobs_s": 0.0}
        t0 = time.perf_counter()
        samples = prepare(self.actor, samples, self.update_cfg, policy_is_reference=self.policy_is_reference)
        t1 = time.perf_counter()
        metrics = ppo_update(self.actor, samples, self.update_cfg, self.rng, on_micro_batch=self.progress.advance,
                             ref_follows_old=self.policy_is_reference, on_optimizer_step=self.skips.record)
        metrics["perf/logprobs_s"] += t1 - t0
        metrics["loss/update_skipped"] = 0.0
        metrics.update(rollout_mismatch(samples))  # generator vs trainer log-probs of the same tokens
        if metrics.get("loss/optimizer_steps", 0.0) > 0:
            self.policy_is_reference = False
        self.last_samples = samples
        self._sync_generator()
        return metrics

    def _sync_generator(self) -> None:
        """Load the actor's weights into a generator that holds its own copy (vLLM's engine: ``load_weights``), the
        adapter merged in (an engine's model has none). After every update, and once before the first rollout: the
        engine starts from ``--actor.model_name_or_path``, while the actor may already differ from it (an adapter
        warm start, ``--sft.lora``, on the untouched base; a resumed checkpoint), and an iteration without an update
        would not sync it."""
        sync = getattr(self.generator, "load_weights", None)
        if sync is not None:
            from progpo.run.lora import iter_merged

            with self.actor.generation_context():
                sync(list(iter_merged(self.actor.model, parameters_only=True)))

    def log(self, it: int, metrics: dict[str, float]) -> None:
        """Stage 4: JSONL + TensorBoard + callback."""
        self.metrics.log(it, metrics)
        self.history.append({"iteration": it, **metrics})
        if self.on_iteration is not None:
            self.on_iteration(it, metrics)

    def checkpoint(self, it: int, diverged: bool = False) -> Path | None:
        """Stage 5: every ``--ckpt.save_steps`` iterations and after the last one; never after an iteration
        whose update skipped a step for non-finite numbers (``diverged``): the newest checkpoint stays the
        last good one, and rotation (``--ckpt.max_num``) cannot drop it for a diverging one."""
        cfg = self.cfg
        if it % cfg.ckpt.save_steps and it != self.num_iterations:
            return None
        if diverged:
            logger.warning("iteration %d: no checkpoint (its update skipped optimizer steps for a non-finite loss "
                           "or gradient norm, %s)", it, SKIPPED_KEY)
            return None
        state = {"sampler": self.sampler.state_dict(), "seed": cfg.train.seed,
                 "policy_is_reference": self.policy_is_reference}
        return self.ckpt.save(self.actor, it, state, self.rng)
