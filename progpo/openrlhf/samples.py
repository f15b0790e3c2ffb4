"""OpenRLHF 0.11.2 samples generator that turns multi-turn episodes into per-step samples.

OpenRLHF's agent API concatenates all turns of an episode into ONE sample (``action_ranges``).
The GiGPO / verl-agent protocol this project follows trains on one sample per *step*: the step's
own prompt (template + K-step history window) followed by that step's response. Our agent
executor (``progpo.openrlhf.agent``) therefore returns, next to OpenRLHF's usual
response fields, the whole :class:`progpo.agents.types.Episode` under ``RESPONSE_EPISODE_KEY``.
:class:`StepSamplesGenerator` expands each episode into ``T_i`` single-row ``Experience``
objects and carries the per-step metadata the estimators need (uid, trajectory id, step index,
reward, flags, anchor observation, prefix key, action, extra state) through ``Experience.info``
(keys in :data:`STEP_INFO_KEYS`). :class:`progpo.openrlhf.experience.StepExperienceMaker`
reads and removes them before the actor's training step.

Seams used (private to OpenRLHF, hence the exact pin): ``SamplesGenerator.generate_samples``
returns the episode-level experiences of one rollout batch, consecutive blocks of
``n_samples_per_prompt`` per prompt; ``_process_response_into_experience(response)`` builds one.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterable
from typing import Any

import torch
from openrlhf.trainer.ppo_utils.experience import Experience
from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator, batch_vllm_engine_call

from progpo.advantages.batch import StepBatch
from progpo.agents.batching import cut_answer_warning, episodes_to_step_batch, rollout_metrics
from progpo.agents.types import Episode
from progpo.openrlhf.agent import RESPONSE_EPISODE_KEY
from progpo.openrlhf.balance import balance_for_ranks, data_parallel_ranks, rollout_multiple
from progpo.openrlhf.launch import ray_run
from progpo.run.dynamic_sampling import DynamicSamplingStats, has_signal, signal_discount
from progpo.run.failures import check_failures, failure_cause, failure_metrics

logger = logging.getLogger(__name__)

EPISODE_ATTR = "_progpo_episode"
"""Attribute holding the episode on an episode-level ``Experience`` until it is expanded."""

STEP_INFO_PREFIX = "progpo/"

POLICY_VERSION_KEY, POLICY_VERSION_END_KEY = "policy_version", "policy_version_end"
"""``Experience.info`` entries ``[B]`` (float): each step's ``StepRecord.policy_version`` / ``policy_version_end``
(-1: not recorded). Kept through training, so the actor logs their batch mean."""

STEP_INFO_KEYS: tuple[str, ...] = tuple(STEP_INFO_PREFIX + name for name in StepBatch.columns() if name != "reward")
"""Per-step ``Experience.info`` entries, one per ``StepBatch`` column but ``reward`` (which travels as
``Experience.rewards``): lists of str or ``[B]`` tensors; popped before training."""


class StepRollout(list):
    """The step samples of one rollout batch (a ``list[Experience]``, what OpenRLHF's trainer takes) with what the
    trainer needs of the batch besides them, so that it travels with the samples, through OpenRLHF's async queue
    too (``GenerateSamplesActor`` -> ``TrainingActor``: a list subclass pickles with its attributes).

    Attributes:
        episodes: the batch's ``[E]`` episodes, failed ones included (OpenRLHF's own estimators' groups).
        stats: the batch's rollout metrics (``env/*``, ``rollout/*``; :class:`StepSamplesGenerator`).
        generation_span: ``(start, end)`` wall-clock seconds (``time.time()``) of the batch's generation.
    """

    def __init__(self, samples: Iterable[Experience] = (), *, episodes: list[Episode] | None = None,
                 stats: dict[str, float] | None = None, generation_span: tuple[float, float] = (0.0, 0.0)) -> None:
        super().__init__(samples)
        self.episodes = list(episodes or [])
        self.stats = dict(stats or {})
        self.generation_span = generation_span


def _step_tensors(step: Any, max_len: int, with_logprobs: bool) -> tuple[torch.Tensor, torch.Tensor,
                                                                          torch.Tensor | None, int]:
    """``(sequences [1, P+R], action_mask [1, P+R-1], rollout_log_probs [1, P+R-1] or None, cut)`` of one step:
    prompt ids then response ids, the oldest ``cut`` prompt tokens dropped to fit ``max_len``.

    Raises:
        ValueError: the response alone does not fit ``max_len``.
    """
    resp = list(step.response_ids)
    if len(resp) >= max_len:
        raise ValueError(f"step response of {len(resp)} tokens does not fit --data.max_len={max_len}")
    prompt_ids = list(step.prompt_ids)
    cut = max(0, len(prompt_ids) + len(resp) - max_len)
    prompt_ids = prompt_ids[cut:]
    n_prompt, n_total = len(prompt_ids), len(prompt_ids) + len(resp)
    sequences = torch.tensor([prompt_ids + resp], dtype=torch.long)
    action_mask = torch.zeros(1, n_total - 1, dtype=torch.long)  # OpenRLHF's own dtype (0/1)
    action_mask[0, n_prompt - 1 :] = 1
    rollout_log_probs = None
    if with_logprobs:
        rollout_log_probs = torch.zeros(1, n_total - 1, dtype=torch.float32)
        rollout_log_probs[0, n_prompt - 1 :] = torch.tensor(step.logprobs, dtype=torch.float32)
    return sequences, action_mask, rollout_log_probs, cut


def step_experiences(
    episode: Episode,
    *,
    uid: str,
    traj_id: int,
    prompt: str,
    label: str,
    max_len: int,
    with_logprobs: bool,
) -> list[Experience]:
    """Expand one episode into one single-row ``Experience`` per step.

    Row ``t`` holds ``sequences = [x_{i,t} ; a_{i,t}]`` (prompt ids then response ids), an
    ``action_mask`` over the response tokens only (OpenRLHF's convention: ``[P+R-1]``, index ``j``
    is token ``j+1``), the behaviour log-probs at the same positions when ``with_logprobs``,
    ``rewards = r_{i,t}`` (invalid-action penalty included) and the step metadata in ``info``:
    the columns of :func:`progpo.agents.batching.episodes_to_step_batch` (the local loop's own
    episode-to-rows function, so ``final_obs`` of a truncated trajectory is recorded the same way).
    ``Experience.truncated`` and ``info['response_clip_ratio']`` flag a response cut at the token
    limit (``finish_reason == "length"``). ``info[POLICY_VERSION_KEY]`` / ``info[POLICY_VERSION_END_KEY]`` ``[1]``:
    the weight version the step's response was sampled under (:mod:`progpo.openrlhf.policy_clock`).

    Args:
        episode: a finished, non-failed episode with at least one step.
        uid: group id shared by the rollouts of the same task in this batch.
        traj_id: trajectory id, unique in the batch.
        prompt, label: the dataset row's prompt (task spec) and label, kept for logging.
        max_len: ``--data.max_len``; longer rows lose their OLDEST prompt tokens (counted in
            ``info['progpo/prompt_cut_tokens']``); a response longer than ``max_len - 1`` raises.
        with_logprobs: attach ``rollout_log_probs`` (needed by vLLM importance-sampling correction).

    Returns:
        ``T_i`` experiences, each with ``sequences`` ``[1, P+R]`` and step-level tensors ``[1, P+R-1]``.

    Raises:
        ValueError: empty episode, a step without response tokens, or a response that does not fit.
    """
    if not episode.steps:
        raise ValueError(f"episode {traj_id} (uid {uid!r}) has no steps")
    rows = episodes_to_step_batch([dataclasses.replace(episode, uid=uid, traj_id=traj_id, failed=False)]).to_rows()
    out = []
    for t, step in enumerate(episode.steps):
        if not step.response_ids:
            raise ValueError(f"episode {traj_id} step {t} has an empty response")
        sequences, action_mask, rollout_log_probs, cut = _step_tensors(step, max_len, with_logprobs)
        n_total, resp = sequences.shape[1], step.response_ids
        clipped = step.finish_reason == "length"
        info = {
            "response_clip_ratio": torch.tensor([clipped]),
            "reward": torch.tensor([float(step.reward)]),
            "score": torch.tensor([float(episode.won)]),
            "progpo/prompt_cut_tokens": torch.tensor([float(cut)]),
            POLICY_VERSION_KEY: torch.tensor([float(step.policy_version)]),
            POLICY_VERSION_END_KEY: torch.tensor([float(step.policy_version_end)]),
            **_step_columns(rows[t]),
        }
        out.append(
            Experience(
                sequences=sequences,
                attention_mask=torch.ones(1, n_total, dtype=torch.long),
                action_mask=action_mask,
                rollout_log_probs=rollout_log_probs,
                prompts=[prompt],
                labels=[label],
                images=[None],
                mm_train_inputs=[None],
                rewards=torch.tensor([float(step.reward)], dtype=torch.float64),  # r_{i,t} exactly as the local loop
                scores=torch.tensor([float(episode.won)]),
                response_length=torch.tensor([len(resp)]),
                truncated=torch.tensor([clipped]),
                total_length=torch.tensor([float(n_total)]),
                info=info,
            )
        )
    return out


def _step_columns(row: dict[str, Any]) -> dict[str, Any]:
    """One ``StepBatch`` row (``StepBatch.to_rows``) as the :data:`STEP_INFO_KEYS` entries of ``Experience.info``
    (str columns as one-element lists, ``""`` for an unrecorded optional column; numeric ones as ``[1]`` tensors)."""
    out: dict[str, Any] = {}
    for key in STEP_INFO_KEYS:
        name = key[len(STEP_INFO_PREFIX):]
        value, kind = row[name], StepBatch.kind(name)
        if kind == "str":
            out[key] = ["" if value is None else str(value)]
        else:
            out[key] = torch.tensor([value], dtype={"int": torch.long, "bool": torch.bool, "float": torch.float64}[kind])
    return out


class StepSamplesGenerator(SamplesGenerator):
    """OpenRLHF ``SamplesGenerator`` whose training batches hold one sample per episode step.

    Each episode-level experience is expanded with :func:`step_experiences`, whatever the
    estimator (OpenRLHF's own ones then get each episode's advantage on all its steps, see
    ``progpo.openrlhf.experience``); the ``n_samples_per_prompt`` consecutive episodes of one prompt
    share a ``uid``. Failed episodes are dropped and counted; a batch with too many of them stops
    the job (:func:`progpo.run.failures.check_failures`, ``--env.max_failed_frac``). The step
    samples are then padded and ordered for OpenRLHF's data-parallel ranks
    (:func:`progpo.openrlhf.balance.balance_for_ranks`). Evaluation is never expanded.

    After each expansion ``last_stats`` holds the local loop's rollout metrics of the batch
    (:func:`progpo.agents.batching.rollout_metrics`: ``env/*``, ``rollout/*``, including
    ``rollout/truncated_response_frac``) plus ``rollout/failed_episodes``, ``rollout/failed/<kind>``
    (counts) and ``rollout/pad_rows``; ``last_episodes`` holds the batch's ``[E]`` episodes.

    With ``--rollout.dynamic_sampling`` (``ray_run(args).dynamic_sampling_max_rounds`` set) the groups
    without a return signal are dropped before the expansion and up to that many extra rounds draw
    as many new prompts as groups are missing (:meth:`dynamic_sampling`, the local loop's criterion
    :func:`progpo.run.dynamic_sampling.has_signal`); ``last_stats`` then also holds the
    ``rollout/dynamic_*`` metrics. A batch left without any group is returned empty, which
    OpenRLHF's trainer answers with no update and a new draw. A non-empty batch is returned as a
    :class:`StepRollout` carrying ``last_episodes``, ``last_stats`` and the generation's wall-clock span.

    A group reaches the estimator whole, in sync and async mode alike: OpenRLHF's generator returns the
    ``n_samples_per_prompt`` rollouts of a prompt as consecutive experiences of one batch, :meth:`expand` refuses
    a block that mixes prompts, and the batch travels as one queue item.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._batch_counter = 0
        self.last_stats: dict[str, float] = {}
        self.last_episodes: list[Episode] = []
        self.max_failed_frac = ray_run(self.args).env.max_failed_frac

    def _process_response_into_experience(self, response: dict, **generate_kwargs: Any) -> Experience:
        experience = super()._process_response_into_experience(response, **generate_kwargs)
        episode = response.get(RESPONSE_EPISODE_KEY)
        if episode is not None:
            setattr(experience, EPISODE_ATTR, episode)
        return experience

    @torch.no_grad()
    def generate_samples(self, **generate_kwargs: Any):
        """OpenRLHF's ``generate_samples`` followed by the per-step expansion (see class doc)."""
        started = time.time()
        samples, pass_rate, consumed, exhausted = super().generate_samples(**generate_kwargs)
        if not samples:
            return samples, pass_rate, consumed, exhausted
        n = generate_kwargs.get("n_samples_per_prompt", self.args.rollout.n_samples_per_prompt)
        stats = None
        max_rounds = ray_run(self.args).dynamic_sampling_max_rounds
        if max_rounds is not None:
            # the failure threshold sees the whole draw: dropping the groups of failed episodes as
            # signal-free must not turn an all-failed batch into a silent skip
            drawn = [getattr(e, EPISODE_ATTR, None) for e in samples]
            check_failures([ep for ep in drawn if ep is not None], self.max_failed_frac, self._batch_counter + 1)
            samples, extra_consumed, stats = self.dynamic_sampling(samples, n, max_rounds, **generate_kwargs)
            consumed += extra_consumed
            exhausted = self._dataloader_iter is None and not self._sample_buffer
            if not samples:
                logger.warning("dynamic sampling: no group with a return signal after %d extra round(s); no update "
                               "for this batch", stats.rounds)
                return samples, pass_rate, consumed, exhausted
        steps = self.step_samples(samples, n_samples_per_prompt=n, max_len=generate_kwargs.get("max_len", 2048))
        if stats is not None:
            self.last_stats.update(stats.metrics())
        rollout = StepRollout(steps, episodes=self.last_episodes, stats=self.last_stats,
                              generation_span=(started, time.time()))
        return rollout, pass_rate, consumed, exhausted

    def step_samples(self, samples: list[Experience], *, n_samples_per_prompt: int, max_len: int) -> list[Experience]:
        """The training batch of episode-level ``samples``: :meth:`expand`, then padded and ordered for
        OpenRLHF's data-parallel ranks (:func:`~progpo.openrlhf.balance.balance_for_ranks`).

        Raises:
            ValueError, RolloutFailed: from :meth:`expand`; ValueError: from
                :func:`~progpo.openrlhf.balance.rollout_multiple` (batch sizes that cannot stay rank-equal).
        """
        steps = self.expand(samples, n_samples_per_prompt=n_samples_per_prompt, max_len=max_len)
        ranks, _ = data_parallel_ranks(self.args)
        balanced = balance_for_ranks(steps, multiple=rollout_multiple(self.args), ranks=ranks,
                                     pad_token_id=self.tokenizer.pad_token_id)
        self.last_stats["rollout/pad_rows"] = float(len(balanced) - len(steps))
        return balanced

    def dynamic_sampling(self, samples: list[Experience], n_samples_per_prompt: int, max_rounds: int,
                         **generate_kwargs: Any) -> tuple[list[Experience], int, DynamicSamplingStats]:
        """Keep the groups (blocks of ``n_samples_per_prompt`` episode experiences) with a return signal
        and draw new prompts for the missing ones, at most ``max_rounds`` times (fewer when the prompt
        dataloader runs out). Returns ``(kept experiences, extra prompts consumed, stats)``."""
        want = self.args.rollout.batch_size
        stats = DynamicSamplingStats()
        gamma = signal_discount(ray_run(self.args).advantage)  # the return the estimator judges signal on
        kept = self._signal_blocks(samples, n_samples_per_prompt, stats, gamma)
        consumed = 0
        while len(kept) < want * n_samples_per_prompt and stats.rounds < max_rounds and self._dataloader_iter is not None:
            stats.rounds += 1
            missing = want - len(kept) // n_samples_per_prompt
            if self.args.vllm.enable_sleep:
                batch_vllm_engine_call(self.vllm_engines, "wake_up")
            more, used, dl_exhausted = self._generate_vllm(
                dataloader_iter=self._dataloader_iter, num_prompts=missing,
                dynamic_filtering=self.args.algo.dynamic_filtering_enable, **generate_kwargs)
            if self.args.vllm.enable_sleep:
                batch_vllm_engine_call(self.vllm_engines, "sleep")
            consumed += used
            stats.extra_groups += used
            if dl_exhausted:
                self._dataloader_iter = None
            kept += self._signal_blocks(more, n_samples_per_prompt, stats, gamma)[: missing * n_samples_per_prompt]
        return kept, consumed, stats

    @staticmethod
    def _signal_blocks(samples: list[Experience], n: int, stats: DynamicSamplingStats,
                       gamma: float | None) -> list[Experience]:
        """The experiences of the groups with a return signal (judged on ``G_0`` with ``gamma``, else on ``R``:
        :func:`progpo.run.dynamic_sampling.signal_discount`); counts drawn and dropped groups into ``stats``."""
        if len(samples) % n:
            raise ValueError(f"{len(samples)} episodes is not a multiple of --rollout.n_samples_per_prompt={n}")
        kept: list[Experience] = []
        for g in range(0, len(samples), n):
            block = samples[g : g + n]
            episodes = [getattr(e, EPISODE_ATTR, None) for e in block]
            if any(ep is None for ep in episodes):
                raise ValueError("an experience carries no ProGPO episode: --train.agent_func_path must point to "
                                 "progpo/openrlhf/agent.py for per-step estimators")
            stats.drawn_groups += 1
            if has_signal([ep for ep in episodes if ep.steps], gamma):
                kept.extend(block)
            else:
                stats.dropped_groups += 1
        return kept

    def expand(self, samples: list[Experience], *, n_samples_per_prompt: int, max_len: int) -> list[Experience]:
        """Expand episode-level experiences (blocks of ``n_samples_per_prompt`` per prompt).

        Raises:
            ValueError: the batch is not made of whole prompt groups, a group mixes prompts, or
                an experience carries no episode (the agent executor is not ours).
            RolloutFailed: more than ``--env.max_failed_frac`` of the episodes failed, or all did.
        """
        if len(samples) % n_samples_per_prompt:
            raise ValueError(
                f"{len(samples)} episodes is not a multiple of --rollout.n_samples_per_prompt={n_samples_per_prompt}"
            )
        # behaviour log-probs: OpenRLHF's correction reads them; async mode keeps them whatever the correction
        with_logprobs = self.args.algo.advantage.is_correction_level != "off" or bool(self.args.train.async_enable)
        out: list[Experience] = []
        episodes: list[Episode] = []
        self._batch_counter += 1
        for g in range(0, len(samples), n_samples_per_prompt):
            group = samples[g : g + n_samples_per_prompt]
            prompts = {e.prompts[0] for e in group}
            if len(prompts) != 1:
                raise ValueError(f"rollout group {g // n_samples_per_prompt} mixes prompts: {sorted(prompts)[:2]}")
            uid = f"b{self._batch_counter}g{g // n_samples_per_prompt}:{group[0].labels[0]}"
            for k, exp in enumerate(group):
                episode = getattr(exp, EPISODE_ATTR, None)
                if episode is None:
                    raise ValueError(
                        "an experience carries no ProGPO episode: --train.agent_func_path must point to "
                        "progpo/openrlhf/agent.py for per-step estimators"
                    )
                episodes.append(episode)
                if episode.failed or not episode.steps:
                    continue
                out.extend(
                    step_experiences(
                        episode,
                        uid=uid,
                        traj_id=g + k,
                        prompt=exp.prompts[0],
                        label=exp.labels[0],
                        max_len=max_len,
                        with_logprobs=with_logprobs,
                    )
                )
        self.last_episodes = episodes
        self.last_stats = {**rollout_metrics(episodes), **failure_metrics(episodes)}
        check_failures(episodes, self.max_failed_frac, self._batch_counter)
        cut = cut_answer_warning(episodes)
        if cut:
            logger.warning("rollout batch %d: %s", self._batch_counter, cut)
        failed = sum(ep.failed for ep in episodes)
        if failed:
            logger.warning("dropped %d failed episodes of %d: %s", failed, len(samples), failure_cause(episodes))
        return out
