"""The backend-agnostic async episode loop (per-step samples, verl-agent / GiGPO protocol).

``run_episodes`` plays ``N`` rollouts of every task concurrently. It only *awaits* two things:
``generate(prompt_ids, sampling) -> Generation`` (any backend: transformers, vLLM, a script) and an
``EnvPool`` (in-process threads or Ray actors). Each decision becomes one :class:`StepRecord`
(= one training sample): its prompt is the env template with the last ``K`` (observation, action)
pairs, so steps of one trajectory are separate samples, as in verl-agent.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from progpo.agents.parsing import parse_actions
from progpo.agents.templates import HistoryTurn, PromptTemplate, build_prompt, decode_response, get_template
from progpo.agents.types import Episode, GenerateFn, SamplingParams, StepRecord
from progpo.envs.base import EnvFailure, EnvPool, StepResult
from progpo.envs.spec import spec

logger = logging.getLogger(__name__)

_SEED_MIX = 1_000_003
_INFO_DROP = ("admissible_actions", "anchor_observation")
FINISH_REASONS = ("stop", "length")


@dataclass(frozen=True)
class TaskSpec:
    """One task to play ``n_samples_per_task`` times.

    Attributes:
        split: the env split (``"train"``, ``"test"``, ``"valid_seen"``, ...).
        index: the task index inside the split (same index = same initial state).
        uid: group id shared by its rollouts; ``""`` = ``"{split}:{index}"``.
    """

    split: str
    index: int
    uid: str = ""

    def __post_init__(self) -> None:
        if not self.split:
            raise ValueError("TaskSpec.split must be a non-empty string")
        if self.index < 0:
            raise ValueError(f"TaskSpec.index must be >= 0, got {self.index}")

    @property
    def group_uid(self) -> str:
        """The uid the task's rollouts share."""
        return self.uid or f"{self.split}:{self.index}"


class EpisodeEnv(Protocol):
    """The ``--env.*`` settings an episode reads: ``progpo.run.settings.EnvSettings``, resolved against the env's
    spec (``max_steps`` filled in). Their defaults and checks are that class's; ``agents`` sits below ``run``,
    so it names the fields it reads here instead of importing the class."""

    @property
    def name(self) -> str:
        """registered env id: its spec gives the template and the action-syntax check"""

    @property
    def max_steps(self) -> int | None:
        """decisions per episode at most (None only before the settings are resolved)"""

    @property
    def history_length(self) -> int:
        """``K``, earlier (observation, action) pairs shown in each prompt"""

    @property
    def invalid_penalty(self) -> float:
        """subtracted from the reward of a step whose answer broke the format"""


class EpisodeRollout(Protocol):
    """The ``--rollout.*`` settings an episode reads (``progpo.run.settings.RolloutSettings``)."""

    @property
    def max_prompt_tokens(self) -> int | None:
        """prompt length limit ``P_max`` of the context guard (None = none)"""

    @property
    def max_new_tokens(self) -> int:
        """response limit per step, in tokens"""


@dataclass(frozen=True)
class EpisodeConfig:
    """Settings of one ``run_episodes`` call: the run's ``--env.*`` and ``--rollout.*`` settings objects, plus
    what the caller decides per call.

    Attributes:
        env: the env settings (:class:`EpisodeEnv`; resolved, so ``max_steps`` is set): ``name``,
            ``max_steps`` (an episode still running then is marked ``truncated`` on its last step),
            ``history_length`` and ``invalid_penalty`` (subtracted from the step reward when the response
            broke the answer format: verl-agent's invalid-action penalty coefficient, 0.1 there; a response
            cut at ``max_new_tokens``, ``finish_reason`` "length", counts as broken even if it holds a
            well-formed action block: the policy did not end its turn; its action is still sent).
        rollout: the rollout settings (:class:`EpisodeRollout`): ``max_prompt_tokens``, the context guard.
        sampling: sampling settings of every request; a set ``seed`` is mixed per (trajectory, step) by
            :func:`step_seed`.
        n_samples_per_task: ``N``, rollouts per task (the group size; 1 per call on ``train_ray``).
        penalize_env_invalid: also charge the penalty when the env flagged the action inadmissible.
        max_concurrency: at most this many episodes in flight (None = all ``U * N``).

    Raises:
        ValueError: an unregistered env, unresolved settings (``env.max_steps`` None) or a bad per-call value
            (the message names it); the settings objects check their own fields.
    """

    env: EpisodeEnv
    rollout: EpisodeRollout
    sampling: SamplingParams
    n_samples_per_task: int = 1
    penalize_env_invalid: bool = False
    max_concurrency: int | None = None

    def __post_init__(self) -> None:
        spec(self.env.name)  # ValueError naming the registered envs
        if self.env.max_steps is None:
            raise ValueError(f"env settings of {self.env.name} are not resolved (max_steps is None): "
                             "use EnvSettings.resolved()")
        if self.n_samples_per_task < 1:
            raise ValueError(f"n_samples_per_task must be >= 1, got {self.n_samples_per_task}")
        if not isinstance(self.sampling, SamplingParams):
            raise ValueError(f"sampling must be a SamplingParams, got {type(self.sampling).__name__}")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1 or None, got {self.max_concurrency}")


def step_seed(base: int | None, traj_id: int, t: int) -> int | None:
    """Per-request sampling seed: distinct per (trajectory, step), reproducible from ``base``.

    The N rollouts of a task share a prompt at step 0; one seed for all would make them identical.
    Returns None when ``base`` is None (unseeded sampling).
    """
    if base is None:
        return None
    return ((base * _SEED_MIX + traj_id) * _SEED_MIX + t) % (2**31 - 1)


def _as_task(task: TaskSpec | tuple[str, int]) -> TaskSpec:
    if isinstance(task, TaskSpec):
        return task
    if isinstance(task, tuple) and len(task) == 2:
        return TaskSpec(split=task[0], index=int(task[1]))
    raise ValueError(f"a task must be a TaskSpec or a (split, index) tuple, got {task!r}")


async def run_episodes(
    tasks: Sequence[TaskSpec | tuple[str, int]],
    cfg: EpisodeConfig,
    *,
    env_pool: EnvPool,
    generate: GenerateFn,
    tokenizer: Any,
    template: PromptTemplate | None = None,
    traj_id_start: int = 0,
    on_episode_end: Callable[[Episode], None] | None = None,
) -> list[Episode]:
    """Play ``cfg.n_samples_per_task`` rollouts of every task, all concurrently; one record per step.

    Args:
        tasks: ``[U]`` tasks (``TaskSpec`` or ``(split, index)``); a task's rollouts share its uid.
        cfg: the episode settings (:class:`EpisodeConfig`: env and rollout settings, sampling, group size).
        env_pool: runs the envs (``reset``/``step``/``release`` awaited per episode).
        generate: ``await generate(prompt_ids [P], sampling) -> Generation`` (tokens + logprobs).
        tokenizer: Hugging Face tokenizer with a chat template (prompts are built with it).
        template: override the env's registered prompt template.
        traj_id_start: first trajectory id (ids are ``traj_id_start + k``, task-major order).
        on_episode_end: called with each finished episode (e.g. a progress bar); not for failed ones.

    Returns:
        ``[U * N]`` episodes in task-major order (task 0's N rollouts first). Episodes whose env
        raised ``EnvFailure`` come back with ``failed=True`` (their steps so far are kept, but
        ``episodes_to_step_batch`` skips them); any other exception propagates.

    Raises:
        ValueError: ``generate`` returned a ``finish_reason`` other than "stop" / "length", or a task is
            neither a ``TaskSpec`` nor a ``(split, index)`` pair.
    """
    tmpl = template or get_template(cfg.env.name)
    specs = [_as_task(t) for t in tasks]
    run_id = uuid.uuid4().hex[:8]
    limit = asyncio.Semaphore(cfg.max_concurrency or max(1, len(specs) * cfg.n_samples_per_task))
    counter = itertools.count(traj_id_start)
    episodes = [
        Episode(uid=spec.group_uid, traj_id=next(counter), split=spec.split, task_index=spec.index)
        for spec in specs
        for _ in range(cfg.n_samples_per_task)
    ]

    async def one(ep: Episode) -> None:
        async with limit:
            await _play(ep, f"{run_id}-{ep.traj_id}", env_pool, generate, tokenizer, tmpl, cfg)
        if on_episode_end is not None and not ep.failed:
            on_episode_end(ep)

    await asyncio.gather(*(one(ep) for ep in episodes))
    _log_outcome(episodes, cfg.rollout.max_prompt_tokens)
    return episodes


def _log_outcome(episodes: list[Episode], max_prompt_tokens: int | None) -> None:
    """One log line for the prompts the context guard shortened, one for the episodes that failed."""
    steps = [s for ep in episodes for s in ep.steps]
    cut = [s for s in steps if s.prompt_truncated_turns or s.prompt_obs_truncated_tokens]
    if cut:
        logger.info(
            "context guard shortened %d of %d prompts (limit %s tokens): %d history turn(s) dropped, "
            "%d observation token(s) cut",
            len(cut), len(steps), max_prompt_tokens, sum(s.prompt_truncated_turns for s in cut),
            sum(s.prompt_obs_truncated_tokens for s in cut),
        )
    n_failed = sum(ep.failed for ep in episodes)
    if n_failed:
        logger.warning("%d of %d episodes failed (env died); they are dropped from training", n_failed, len(episodes))


async def _play(
    ep: Episode, eid: str, pool: EnvPool, generate: GenerateFn, tokenizer: Any,
    tmpl: PromptTemplate, cfg: EpisodeConfig,
) -> None:
    """Play one episode in place into ``ep``; an ``EnvFailure`` marks it failed."""
    try:
        obs, info = await pool.reset(eid, split=ep.split, index=ep.task_index)
        ep.task_id = str(info.get("task_id", ""))
        history: list[HistoryTurn] = []
        for t in range(cfg.env.max_steps):
            record, res = await _one_step(ep, eid, t, obs, info, history, pool, generate, tokenizer, tmpl, cfg)
            ep.steps.append(record)
            history.append(HistoryTurn(observation=record.anchor_obs, action=record.action))
            obs, info = res.observation, res.info
            ep.won = bool(info.get("won", False))
            if res.done:
                break
        else:
            last = ep.steps[-1]
            if not (last.terminated or last.truncated):
                last.truncated = True
        ep.info = {k: v for k, v in info.items() if k not in _INFO_DROP}
        ep.final_obs = str(info.get("anchor_observation", obs))
    except EnvFailure as exc:
        mark_failed(ep, exc)
        logger.warning("episode %s (uid %s) failed: %s", ep.traj_id, ep.uid, exc)
    finally:
        try:
            await pool.release(eid)
        except EnvFailure as exc:
            if not ep.failed:
                mark_failed(ep, exc)
            logger.warning("episode %s: release failed: %s", ep.traj_id, exc)


def mark_failed(ep: Episode, exc: BaseException, kind: str | None = None) -> None:
    """Mark ``ep`` failed by ``exc``: ``failure_kind`` = ``kind`` or the exception's ``kind``
    attribute (``EnvFailure.kind``; ``"rollout_error"`` when it has none), ``failure_message`` =
    its message on one line."""
    ep.failed = True
    ep.failure_kind = kind or getattr(exc, "kind", None) or "rollout_error"
    ep.failure_message = " ".join(f"{type(exc).__name__}: {exc}".split())


async def _one_step(
    ep: Episode, eid: str, t: int, obs: str, info: dict[str, Any], history: list[HistoryTurn],
    pool: EnvPool, generate: GenerateFn, tokenizer: Any, tmpl: PromptTemplate, cfg: EpisodeConfig,
) -> tuple[StepRecord, StepResult]:
    """Step ``t``: build the prompt from ``(obs, info)``, generate, parse, step the env."""
    shown = history[-cfg.env.history_length:] if cfg.env.history_length > 0 else []  # min(t, K) most recent turns
    anchor = str(info.get("anchor_observation", obs))
    prompt = build_prompt(
        tokenizer, tmpl, task=str(info.get("task", "")), observation=anchor,
        admissible_actions=list(info.get("admissible_actions", [])), history=shown, step_count=t,
        max_prompt_tokens=cfg.rollout.max_prompt_tokens,
    )
    sampling = dataclasses.replace(cfg.sampling, seed=step_seed(cfg.sampling.seed, ep.traj_id, t))
    gen = await generate(prompt.prompt_ids, sampling)
    if len(gen.token_ids) != len(gen.logprobs):
        raise ValueError(
            f"generate returned {len(gen.token_ids)} token ids but {len(gen.logprobs)} logprobs"
        )
    if gen.finish_reason not in FINISH_REASONS:
        raise ValueError(f"generate returned finish_reason {gen.finish_reason!r}; expected one of {FINISH_REASONS}")
    text = decode_response(tokenizer, gen.token_ids)  # one rule on every backend, whatever text the engine sent
    (action,), (valid,) = parse_actions([text], cfg.env.name)
    valid = valid and gen.finish_reason == "stop"  # a response cut at the token limit broke the format
    res = await pool.step(eid, action)
    env_invalid = bool(res.info.get("invalid_action", False))
    charged = (not valid) or (cfg.penalize_env_invalid and env_invalid)
    extra = info.get("state_extra")  # what the anchor observation does not show (progpo.envs.base)
    record = StepRecord(
        prompt_ids=prompt.prompt_ids,
        response_ids=list(gen.token_ids),
        logprobs=list(gen.logprobs),
        response_text=text,
        action=action,
        invalid=(not valid) or env_invalid,
        env_reward=float(res.reward),
        reward=float(res.reward) - (cfg.env.invalid_penalty if charged else 0.0),
        terminated=bool(res.terminated),
        truncated=bool(res.truncated) and not bool(res.terminated),
        anchor_obs=anchor,
        prefix_key=prompt.prefix_key,
        state_extra=None if extra is None else str(extra),
        prompt_truncated_turns=prompt.dropped_turns,
        format_invalid=not valid,
        env_invalid=env_invalid,
        prompt_obs_truncated_tokens=prompt.obs_truncated_tokens,
        finish_reason=gen.finish_reason,
        history_turns=len(shown) - prompt.dropped_turns,
        policy_version=gen.policy_version,
        policy_version_end=gen.policy_version_end,
    )
    return record, res
