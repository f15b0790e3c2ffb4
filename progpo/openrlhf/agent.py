"""OpenRLHF 0.11.2 agent executor that runs our episode loop inside the vLLM engine actors.

``--train.agent_func_path`` points to ``agent_file.py``, which re-exports
:class:`AgentExecutor` from here (``python -m progpo.cli.train_ray`` sets it). OpenRLHF loads that
file in every ``RolloutRayActor`` (vLLM engine) and instantiates ``AgentExecutor()`` without
arguments, so the settings travel in the ``PROGPO_AGENT_CONFIG`` environment variable (JSON of
:class:`AgentConfig`; ``train_ray`` puts it into Ray's runtime env).

For each dataset row (a task spec ``{"split": ..., "index": ...}``) OpenRLHF calls ``execute`` once
per rollout, all concurrently on the engine's event loop. ``execute`` plays ONE episode with
``progpo.agents.episode.run_episodes`` (per-step prompts with the K-step history window), where
``generate`` is the engine's own async ``generate`` (token ids in, token ids + log-probs out) and
the env pool is one of:

* ``http``: WebShop over async HTTP (``progpo.envs.webshop`` client in async mode; never blocks the
  event loop);
* ``ray``: ALFWorld (or any registered env) in our Ray env actors (``progpo.envs.ray_pool``);
* ``local``: envs in this process, stepped in threads (debugging, tests).

The response dict carries OpenRLHF's usual fields (so its own estimators still work on the
concatenated transcript) and the :class:`Episode` itself under
``progpo.openrlhf.samples.RESPONSE_EPISODE_KEY`` for the per-step expansion.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import logging
import os
from dataclasses import dataclass, field
from typing import Any

from openrlhf.utils.agent import AgentExecutorBase

from progpo.agents.stop_tokens import stop_token_ids
from progpo.agents.types import Episode, Generation, SamplingParams
from progpo.envs.base import EnvRejected
from progpo.openrlhf.policy_clock import policy_clock, read_version
from progpo.run.settings import EnvSettings, RolloutSettings

logger = logging.getLogger(__name__)

CONFIG_ENV_VAR = "PROGPO_AGENT_CONFIG"
RESPONSE_EPISODE_KEY = "progpo_episode"
"""Key of the :class:`Episode` in the response dict (read by ``progpo.openrlhf.samples``)."""


ENVS_PER_ENGINE = 256
"""Envs alive at once per engine on train_ray when ``--env.num_envs`` is 0 (its default)."""


@dataclass(frozen=True)
class AgentConfig:
    """Settings of the episode loop run by :class:`AgentExecutor`: the ``train_ray`` job's settings objects.

    Attributes:
        env: the ``--env.*`` settings (``progpo.run.settings.EnvSettings``, resolved: ``max_steps``, the
            splits and ``pool`` filled in from the env's spec).
        rollout: the ``--rollout.*`` settings (``progpo.run.settings.RolloutSettings``): ``max_prompt_tokens``,
            the context guard of each step prompt (None = ``--data.max_len - max_new_tokens``), and
            ``max_new_tokens``, the response limit per step when OpenRLHF's sampling parameters carry no
            ``max_tokens`` (its ``--rollout.max_new_tokens`` unset; ``train_ray``'s default is in
            ``progpo.openrlhf.launch.RayArgs``).
        env_kwargs: keyword arguments of the env class (WebShop: ``base_url``; ALFWorld: ``data_dir``).

    Envs alive at once per engine (``local``/``http`` pools) are ``env.num_envs``, or
    :data:`ENVS_PER_ENGINE` where it is 0.
    """

    env: EnvSettings
    rollout: RolloutSettings = field(default_factory=RolloutSettings)
    env_kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.env, dict):
            object.__setattr__(self, "env", EnvSettings(**self.env))
        if isinstance(self.rollout, dict):
            object.__setattr__(self, "rollout", RolloutSettings(**self.rollout))
        object.__setattr__(self, "env", self.env.resolved())

    def to_json(self) -> str:
        """Serialise for ``PROGPO_AGENT_CONFIG``."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> AgentConfig:
        """Parse ``to_json`` output; ValueError names an unknown or bad field."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{CONFIG_ENV_VAR} is not valid JSON: {exc}") from exc
        sections = (("", cls, data), ("env.", EnvSettings, data.get("env") or {}),
                    ("rollout.", RolloutSettings, data.get("rollout") or {}))
        for where, names, got in ((w, {f.name for f in dataclasses.fields(c)}, d) for w, c, d in sections):
            unknown = sorted(set(got) - names)
            if unknown:
                raise ValueError(f"{CONFIG_ENV_VAR} has unknown fields {[where + u for u in unknown]}")
        return cls(**data)


def parse_task(prompt: str) -> tuple[str, int]:
    """The ``(split, index)`` of a dataset row's prompt ``{"split": str, "index": int}``.

    Raises:
        ValueError: the prompt is not such a JSON object (names what is wrong).
    """
    try:
        spec = json.loads(prompt)
    except json.JSONDecodeError as exc:
        raise ValueError(f"task prompt must be JSON like {{'split': 'train', 'index': 0}}, got {prompt[:80]!r}") from exc
    if not isinstance(spec, dict) or not isinstance(spec.get("split"), str) or not isinstance(spec.get("index"), int):
        raise ValueError(f"task prompt needs a str 'split' and an int 'index', got {prompt[:80]!r}")
    return spec["split"], spec["index"]


class EngineError(RuntimeError):
    """The generation engine failed one request; it fails that episode only (kind ``engine_*``).

    Attributes:
        kind: ``engine_<finish reason>`` for a vLLM finish reason other than stop/length
            (``engine_abort``, ``engine_error``), ``engine_rejected`` for a request the engine
            raised on (e.g. a prompt longer than the model allows), ``engine_no_logprobs``.
    """

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


class EngineGenerate:
    """``GenerateFn`` over an OpenRLHF ``RolloutRayActor`` (or anything with its ``generate``).

    ``await engine.generate(prompt_token_ids, vllm_sampling_params)`` must return a vLLM
    ``RequestOutput``-like object: ``outputs[0].token_ids``, ``.text``, ``.logprobs`` (one
    ``{token_id: Logprob}`` dict per sampled token), ``.finish_reason`` (``"stop"``/``"length"``,
    copied into :attr:`Generation.finish_reason`). With ``clock`` (the job's
    :class:`~progpo.openrlhf.policy_clock.PolicyClock`), the weight version is read before the request is sent
    and after it returns (:attr:`Generation.policy_version`, ``policy_version_end``). Our :class:`SamplingParams`
    are copied onto a deep copy of OpenRLHF's vLLM sampling params with ``SamplingParams.vllm_kwargs`` (temperature,
    top_p, max_tokens, seed, ``stop_token_ids``, and every other distribution-changing field switched off:
    OpenRLHF's template carries ``top_k`` and ``min_tokens=1``), plus ``logprobs=1``.

    Raises:
        EngineError: the engine raised on the request (``engine_rejected``), returned no per-token
            logprobs (``engine_no_logprobs``), or finished with a reason other than ``stop``/``length``
            (``engine_abort`` for a cancelled request, ``engine_error``, ...).
    """

    def __init__(self, engine: Any, vllm_sampling_params: Any, clock: Any = None) -> None:
        self.engine = engine
        self.template = vllm_sampling_params
        self.clock = clock

    async def __call__(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        params = copy.deepcopy(self.template)
        for name, value in sampling.vllm_kwargs().items():
            setattr(params, name, value)
        params.logprobs = 1
        version = await read_version(self.clock)
        try:
            output = (await self.engine.generate(list(prompt_ids), params)).outputs[0]
        except Exception as exc:  # noqa: BLE001 - any refusal of one request fails that episode only
            raise EngineError(f"the engine refused a request of {len(prompt_ids)} prompt tokens: {exc!r}",
                              "engine_rejected") from exc
        ids = list(output.token_ids)
        reason = output.finish_reason
        if reason not in ("stop", "length"):
            raise EngineError(f"the engine finished a request with finish_reason={reason!r} (expected stop or length)",
                              f"engine_{reason}")
        if output.logprobs is None or len(output.logprobs) != len(ids):
            raise EngineError("the vLLM engine returned no per-token logprobs (logprobs=1 was requested)",
                              "engine_no_logprobs")
        logprobs = [float(step[tok].logprob) for step, tok in zip(output.logprobs, ids)]
        return Generation(token_ids=ids, logprobs=logprobs, text=output.text, finish_reason=reason,
                          policy_version=version, policy_version_end=await read_version(self.clock))


class RejectionsFail:
    """``EnvPool`` wrapper: a ``ValueError`` from ``reset``/``step`` (the env refused the request: an
    unknown split, a WebShop 4xx) becomes ``EnvRejected``, so the episode loop fails that episode
    instead of raising through OpenRLHF's rollout gather and ending the job."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool

    async def reset(self, episode_id: Any, **kwargs: Any) -> Any:
        try:
            return await self.pool.reset(episode_id, **kwargs)
        except ValueError as exc:
            raise EnvRejected(str(exc)) from exc

    async def step(self, episode_id: Any, action: str) -> Any:
        try:
            return await self.pool.step(episode_id, action)
        except ValueError as exc:
            raise EnvRejected(str(exc)) from exc

    async def release(self, episode_id: Any) -> None:
        await self.pool.release(episode_id)

    async def close(self) -> None:
        await self.pool.close()


def make_env_pool(cfg: AgentConfig) -> Any:
    """The ``EnvPool`` of ``cfg.env.pool`` for one engine (``progpo.run.env_setup.make_env_pool``, the one
    factory of both backends). The env's own step limit is ``cfg.env.max_steps`` unless ``env_kwargs`` sets it."""
    from progpo.run.env_setup import make_env_pool as make_pool

    env = cfg.env
    return make_pool(env.name, {"max_steps": env.max_steps, **cfg.env_kwargs}, env.pool,
                     max_envs=env.num_envs or ENVS_PER_ENGINE, num_env_actors=env.num_env_actors, num_cpus_per_actor=env.num_cpus_per_actor,
                     episodes_per_actor=env.episodes_per_actor, call_timeout_s=env.call_timeout_s,
                     start_timeout_s=env.start_timeout_s)


class AgentExecutor(AgentExecutorBase):
    """OpenRLHF agent executor playing one of our episodes per ``execute`` call.

    Args:
        config: the settings; None = read ``PROGPO_AGENT_CONFIG`` (how OpenRLHF builds it).
        env_pool: an ``EnvPool`` to use instead of building one from the config (tests).
    """

    def __init__(self, config: AgentConfig | None = None, env_pool: Any = None) -> None:
        if config is None:
            text = os.environ.get(CONFIG_ENV_VAR)
            if not text:
                raise ValueError(f"{CONFIG_ENV_VAR} is not set: launch with python -m progpo.cli.train_ray")
            config = AgentConfig.from_json(text)
        self.config = config
        self._pool = env_pool
        self._pool_lock = asyncio.Lock()
        self._traj_counter = 0
        self._stops: tuple[Any, tuple[int, ...]] | None = None
        self._clock: Any = None

    def stop_ids(self, tokenizer: Any) -> tuple[int, ...]:
        """``tokenizer``'s stop set (``progpo.agents.stop_tokens.stop_token_ids``: its EOS and its chat template's
        turn end), derived once per tokenizer object. vLLM stops at EOS only, so every request carries it.

        Raises:
            ValueError: the turn end cannot be derived (``train_ray``'s start-up check refuses such a tokenizer).
        """
        if self._stops is None or self._stops[0] is not tokenizer:
            self._stops = (tokenizer, tuple(stop_token_ids(tokenizer)))
        return self._stops[1]

    async def _env_pool(self) -> Any:
        async with self._pool_lock:
            if self._pool is None:
                self._pool = make_env_pool(self.config)
            return self._pool

    def _policy_clock(self) -> Any:
        """The job's policy clock (looked up until found: the trainer creates it before the first rollout)."""
        if self._clock is None:
            self._clock = policy_clock()
        return self._clock

    async def execute(
        self, prompt, label, sampling_params, max_length: int, hf_tokenizer, llm_engine, images=None
    ) -> dict[str, Any]:
        """Play one episode of the task in ``prompt``; returns OpenRLHF's response dict + the episode.

        Args:
            prompt: the task spec JSON (see :func:`parse_task`).
            label: the dataset label (logged only).
            sampling_params: OpenRLHF's vLLM sampling params (temperature, top_p, max_tokens).
            max_length: ``--data.max_len``; each step prompt is guarded to ``max_length - max_new_tokens``.
            hf_tokenizer: the policy's tokenizer (chat template used to build prompts; its stop set,
                :meth:`stop_ids`, goes on every request's ``stop_token_ids``).
            llm_engine: the vLLM engine actor (only its ``generate`` is used).
            images: must be None (text environments).
        """
        from progpo.agents.episode import EpisodeConfig, mark_failed, run_episodes

        if images:
            raise ValueError("ProGPO environments are text-only; the dataset row carried images")
        cfg = self.config
        split, index = parse_task(prompt)
        max_new = getattr(sampling_params, "max_tokens", None) or cfg.rollout.max_new_tokens
        if max_new >= max_length:
            raise ValueError(f"--rollout.max_new_tokens={max_new} must be < --data.max_len={max_length}")
        sampling = SamplingParams(
            temperature=max(float(sampling_params.temperature), 1e-6),
            top_p=float(sampling_params.top_p),
            max_new_tokens=int(max_new),
            seed=getattr(sampling_params, "seed", None),
            stop_token_ids=tuple(sorted(set(self.stop_ids(hf_tokenizer))
                                        | set(getattr(sampling_params, "stop_token_ids", None) or ()))),
        )
        self._traj_counter += 1
        try:
            guard = cfg.rollout.max_prompt_tokens or (max_length - max_new)
            episode_cfg = EpisodeConfig(env=cfg.env, sampling=sampling,
                                        rollout=dataclasses.replace(cfg.rollout, max_prompt_tokens=guard))
            (episode,) = await run_episodes(
                [(split, index)], episode_cfg, env_pool=RejectionsFail(await self._env_pool()),
                generate=EngineGenerate(llm_engine, sampling_params, self._policy_clock()), tokenizer=hf_tokenizer,
                traj_id_start=self._traj_counter,
            )
        except Exception as exc:  # noqa: BLE001 - one episode's error (engine refusal, ...) fails that episode
            episode = Episode(uid=f"{split}:{index}", traj_id=self._traj_counter, split=split, task_index=index)
            mark_failed(episode, exc, getattr(exc, "kind", None) or "rollout_error")
            logger.warning("episode of task %s:%s failed (%s)", split, index, episode.failure_kind, exc_info=True)
        return transcript_response(episode, prompt=prompt, label=label, with_logprobs=sampling_params.logprobs)


def transcript_response(episode: Episode, *, prompt: str, label: str, with_logprobs: Any) -> dict[str, Any]:
    """OpenRLHF's multi-turn response dict for ``episode`` plus the episode itself.

    The transcript is every step's prompt and response concatenated (``observation_tokens``) with
    ``action_ranges`` over the responses: what OpenRLHF's own estimators train on when a
    non-ProGPO estimator is chosen. ``reward`` is the episode return ``R_i``; ``scores`` is 1.0 for
    a won episode. ``rollout_log_probs`` is 0 on prompt tokens, the behaviour log-probs on responses.
    ``truncated`` is OpenRLHF's multi-turn flag: the last response stopped at the token limit
    (``finish_reason == "length"``).
    """
    tokens: list[int] = []
    ranges: list[tuple[int, int]] = []
    logprobs: list[float] = []
    for step in episode.steps:
        tokens.extend(step.prompt_ids)
        logprobs.extend([0.0] * len(step.prompt_ids))
        start = len(tokens)
        tokens.extend(step.response_ids)
        logprobs.extend(step.logprobs)
        ranges.append((start, len(tokens)))
    return {
        "prompt": prompt,
        "label": label,
        "images": None,
        "mm_train_inputs": None,
        "reward": episode.episode_return,
        "scores": float(episode.won),
        "observation_tokens": tokens,
        "action_ranges": ranges,
        "rollout_log_probs": logprobs if with_logprobs is not None else None,
        "truncated": bool(episode.steps and episode.steps[-1].finish_reason == "length"),
        "extra_logs": {"env/won": float(episode.won), "env/episode_length": float(len(episode.steps))},
        RESPONSE_EPISODE_KEY: episode,
    }
