"""Records the episode loop produces and the generation contract it awaits.

Dimension names: ``P`` prompt tokens, ``R`` response tokens of one step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


# vLLM SamplingParams fields that change the sampling distribution (or what the response may
# contain), at the values that switch them off. Set explicitly on every vLLM request, so that no
# template (OpenRLHF's carries top_k and min_tokens=1) and no default can change what is sampled.
VLLM_NEUTRAL_SAMPLING = {
    "top_k": -1,
    "min_p": 0.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "repetition_penalty": 1.0,
    "min_tokens": 0,
    "logit_bias": None,
    "allowed_token_ids": None,
    "bad_words": None,
    "ignore_eos": False,
}


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings, identical in meaning for the local HF sampler and vLLM.

    These are the *only* settings that shape a response: the HF sampler ignores the checkpoint's
    ``generation_config`` (see ``progpo.run.generation``) and vLLM requests are built from
    :meth:`vllm_kwargs`, which switches every other distribution-changing vLLM field off.

    Attributes:
        temperature: softmax temperature (> 0; 1.0 = the policy's own distribution).
        top_p: nucleus mass in (0, 1].
        max_new_tokens: response length limit in tokens (>= 1).
        seed: optional per-request seed for reproducible sampling.
        stop_token_ids: token ids that end the response besides the generator's own stop set (vLLM's
            ``stop_token_ids``; the stop token is kept in the response, as EOS is). The OpenRLHF executor sends
            its tokenizer's stop set (``progpo.agents.stop_tokens.stop_token_ids``: EOS and the chat template's
            turn end) here, since the engines stop at EOS only.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))

    def vllm_kwargs(self) -> dict:
        """Keyword arguments for ``vllm.SamplingParams``: ours plus ``VLLM_NEUTRAL_SAMPLING``.

        ``logprobs`` is not included (the caller asks for what it needs).
        """
        return {**VLLM_NEUTRAL_SAMPLING, "temperature": self.temperature, "top_p": self.top_p,
                "max_tokens": self.max_new_tokens, "seed": self.seed, "stop_token_ids": list(self.stop_token_ids)}


@dataclass(frozen=True)
class Generation:
    """One sampled response.

    Attributes:
        token_ids: ``[R]`` response token ids (EOS included when it was sampled).
        logprobs: ``[R]`` log-probability (nats) of each sampled token under the sampling policy.
        text: the engine's decoded response (informational: the episode loop records
            ``progpo.agents.templates.decode_response`` of ``token_ids``, the same rule on every backend).
        finish_reason: why sampling stopped, in vLLM's words: ``"stop"`` (a stop token: EOS or the turn end) or
            ``"length"`` (cut at ``SamplingParams.max_new_tokens``).
        policy_version, policy_version_end: the engine's weight version (weight syncs done,
            ``progpo.openrlhf.policy_clock``) when the request was sent and when it returned; equal unless a sync
            (OpenRLHF's partial rollout) fell inside it; -1 where no clock runs (the local backend).
    """

    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str = "stop"
    policy_version: int = -1
    policy_version_end: int = -1


class GenerateFn(Protocol):
    """``await generate(prompt_ids, sampling) -> Generation``: the only thing a backend supplies."""

    async def __call__(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation: ...


@dataclass
class StepRecord:
    """One policy decision (= one training sample).

    Attributes:
        prompt_ids: ``[P]`` token ids of the full policy context ``x_{i,t}`` (chat template applied).
        response_ids: ``[R]`` sampled response token ids.
        logprobs: ``[R]`` behaviour log-probabilities (nats) of ``response_ids``.
        response_text: ``decode_response(tokenizer, response_ids)`` (control tokens dropped, answer tags kept, on
            every backend).
        action: the parsed action sent to the env (raw response when unparsable).
        invalid: response had no parsable action, or the env flagged it invalid.
        env_reward: the env's reward for this step.
        reward: ``env_reward`` minus the invalid-action penalty (what estimators see).
        terminated, truncated: as in ``progpo.envs.base.StepResult``.
        anchor_obs: ``o_{i,t}``, the raw observation the policy saw at this step.
        prefix_key: hash of the exact prompt (``x_{i,t}``).
        state_extra: extra state text (ALFWorld inventory) or None.
        prompt_truncated_turns: history turns dropped by the context-length guard.
        format_invalid: the response broke the answer protocol (``parse_actions`` said invalid);
            this is what the invalid-action penalty is charged for.
        env_invalid: the env flagged the action (``info["invalid_action"]``: inadmissible).
        prompt_obs_truncated_tokens: observation tokens the context-length guard cut (0 = none).
        finish_reason: the generation's ``finish_reason`` (``"stop"`` or ``"length"``: the response
            was cut at the token limit).
        history_turns: earlier (observation, action) turns the prompt shows (``min(t, K)`` minus
            those the context guard dropped).
        policy_version, policy_version_end: :attr:`Generation.policy_version` / ``policy_version_end`` of the
            response (-1: not recorded).
    """

    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    response_text: str
    action: str
    invalid: bool
    env_reward: float
    reward: float
    terminated: bool
    truncated: bool
    anchor_obs: str
    prefix_key: str
    state_extra: str | None = None
    prompt_truncated_turns: int = 0
    format_invalid: bool = False
    env_invalid: bool = False
    prompt_obs_truncated_tokens: int = 0
    finish_reason: str = "stop"
    history_turns: int = 0
    policy_version: int = -1
    policy_version_end: int = -1


@dataclass
class Episode:
    """One trajectory of one task.

    Attributes:
        uid: group id shared by the N rollouts of the same task.
        traj_id: unique id in the batch.
        split, task_index: what ``reset`` was called with.
        task_id: the env's stable task id (``info['task_id']``).
        steps: the ``T`` step records, in order.
        won: the env reported success.
        failed: the episode could not be played to its end (its env died, or, on the distributed
            path, its engine or env refused a request); it is dropped from training.
        failure_kind: why it failed, one word (``EnvFailure.kind``: ``env_unreachable``,
            ``env_data_missing``, ``env_not_started``, ``env_actor_died``, ...; ``engine_abort`` ...);
            ``""`` when not failed.
        failure_message: the error's message, one line (``""`` when not failed).
        info: env-specific end-of-episode data (task_type, WebShop score, ...).
        final_obs: the anchor observation the env returned after the last step (the state a
            truncated trajectory was cut in; fills ``StepBatch.final_obs`` for the graph estimator).
    """

    uid: str
    traj_id: int
    split: str
    task_index: int
    task_id: str = ""
    steps: list[StepRecord] = field(default_factory=list)
    won: bool = False
    failed: bool = False
    failure_kind: str = ""
    failure_message: str = ""
    info: dict[str, Any] = field(default_factory=dict)
    final_obs: str = ""

    @property
    def episode_return(self) -> float:
        """``R_i = sum_t r_{i,t}`` (penalties included)."""
        return float(sum(s.reward for s in self.steps))
