"""From episodes to the estimators' ``StepBatch`` (one row per step) and rollout metrics.

Row order is fixed and shared by every function here: episodes in the given order (failed ones
skipped), each episode's steps in time order. ``training_steps(episodes)[k]`` is the record of row
``k`` of ``episodes_to_step_batch(episodes)``, so ``StepAdvantages.advantages[k]`` belongs to it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from progpo.advantages.batch import StepBatch
from progpo.agents.types import Episode, StepRecord


def training_episodes(episodes: Sequence[Episode]) -> list[Episode]:
    """The episodes that become training samples: not failed and with at least one step."""
    return [ep for ep in episodes if not ep.failed and ep.steps]


def training_steps(episodes: Sequence[Episode]) -> list[StepRecord]:
    """``[S]`` step records in batch-row order (see module docstring)."""
    return [s for ep in training_episodes(episodes) for s in ep.steps]


def episodes_to_step_batch(episodes: Sequence[Episode]) -> StepBatch:
    """Build the estimators' ``StepBatch`` from the episodes (failed ones skipped).

    One row per step (:func:`step_row`). ``state_extra`` is filled (``""`` where a step has none) when
    any step carries extra state (ALFWorld inventory), else left None; ``final_obs`` likewise holds the
    episode's final anchor observation on the last step of a truncated trajectory.

    Returns:
        A validated ``StepBatch`` with ``S = len(training_steps(episodes))`` rows.

    Raises:
        ValueError: no training steps at all (every episode failed or is empty), or a malformed
            trajectory (``StepBatch.validate`` names it).
    """
    eps = training_episodes(episodes)
    if not eps:
        raise ValueError(
            f"no training steps: all {len(episodes)} episodes failed or are empty (check the env pool logs)"
        )
    return StepBatch.from_rows([step_row(ep, t, step) for ep in eps for t, step in enumerate(ep.steps)])


def step_row(episode: Episode, t: int, step: StepRecord) -> dict[str, object]:
    """Row ``t`` of ``episode`` as a ``StepBatch`` row: every column a :class:`StepRecord` has under the
    same name, plus the episode's ``uid`` / ``traj_id``, ``step_index = t`` and ``final_obs`` (the
    episode's final anchor observation on a truncated last step, ``""`` elsewhere)."""
    row = {name: getattr(step, name) for name in StepBatch.columns() if hasattr(step, name)}
    row.update(uid=episode.uid, traj_id=episode.traj_id, step_index=t,
               final_obs=episode.final_obs if step.truncated else "")
    return row


def rollout_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
    """Namespaced rollout/env metrics of one batch of episodes (all floats).

    ``env/success_rate`` (fraction won), ``env/return_mean`` (mean ``R_i``, penalties included),
    ``env/episode_length_mean`` (steps), ``env/failed_frac`` (episodes lost to env failures),
    ``rollout/invalid_format_frac`` and ``rollout/env_invalid_frac`` (per step),
    ``rollout/prompt_len_mean|max`` and ``rollout/response_len_mean|max`` (tokens),
    ``rollout/history_turns_mean`` (earlier turns shown per prompt: ``min(t, K)`` less guard drops),
    ``rollout/guard_truncated_frac`` (steps whose prompt the context guard shortened),
    ``rollout/guard_dropped_turns`` and ``rollout/guard_obs_tokens_cut`` (totals),
    ``rollout/truncated_response_frac`` (steps whose response was cut at the token limit:
    ``finish_reason == "length"``),
    ``rollout/num_steps`` and ``rollout/num_episodes``. Means over the non-failed episodes / their steps.
    """
    eps = training_episodes(episodes)
    steps = [s for ep in eps for s in ep.steps]
    out: dict[str, float] = {
        "rollout/num_episodes": float(len(episodes)),
        "rollout/num_steps": float(len(steps)),
        "env/failed_frac": float(np.mean([ep.failed for ep in episodes])) if episodes else 0.0,
    }
    if not eps:
        return out
    plen = np.array([len(s.prompt_ids) for s in steps], dtype=np.float64)
    rlen = np.array([len(s.response_ids) for s in steps], dtype=np.float64)
    out.update({
        "env/success_rate": float(np.mean([ep.won for ep in eps])),
        "env/return_mean": float(np.mean([ep.episode_return for ep in eps])),
        "env/episode_length_mean": float(np.mean([len(ep.steps) for ep in eps])),
        "rollout/invalid_format_frac": float(np.mean([s.format_invalid for s in steps])),
        "rollout/env_invalid_frac": float(np.mean([s.env_invalid for s in steps])),
        "rollout/prompt_len_mean": float(plen.mean()),
        "rollout/prompt_len_max": float(plen.max()),
        "rollout/response_len_mean": float(rlen.mean()),
        "rollout/response_len_max": float(rlen.max()),
        "rollout/history_turns_mean": float(np.mean([s.history_turns for s in steps])),
        "rollout/guard_truncated_frac": float(
            np.mean([bool(s.prompt_truncated_turns or s.prompt_obs_truncated_tokens) for s in steps])
        ),
        "rollout/guard_dropped_turns": float(sum(s.prompt_truncated_turns for s in steps)),
        "rollout/guard_obs_tokens_cut": float(sum(s.prompt_obs_truncated_tokens for s in steps)),
        "rollout/truncated_response_frac": float(np.mean([s.finish_reason == "length" for s in steps])),
    })
    return out


CUT_WARN_FRAC = 0.5
"""Share of a batch's answers cut at the token limit above which :func:`cut_answer_warning` speaks."""

_ACTION_CLOSED = re.compile(r"</action>", re.IGNORECASE)


def cut_answer_warning(episodes: Sequence[Episode]) -> str | None:
    """One warning line when more than :data:`CUT_WARN_FRAC` of a batch's answers hit the token limit, else None.

    The line counts the cut answers (``finish_reason == "length"``, over the steps of the training episodes, as
    ``rollout/truncated_response_frac``) and names the likely cause from what they hold: when most of them
    close an ``<action>`` block, the model finished its answer and went on writing, so its end-of-turn token is
    not in the stop set (the tokenizer's EOS and the chat template's turn end,
    ``progpo.agents.stop_tokens.stop_token_ids``); else the answers were cut mid-answer, so
    ``--rollout.max_new_tokens`` (the longest cut answer's length) is too small for them.
    """
    steps = training_steps(episodes)
    cut = [s for s in steps if s.finish_reason == "length"]
    if not steps or len(cut) <= CUT_WARN_FRAC * len(steps):
        return None
    limit = max(len(s.response_ids) for s in cut)
    closed = sum(_ACTION_CLOSED.search(s.response_text) is not None for s in cut)
    head = (f"{len(cut)} of {len(steps)} answers ({len(cut) / len(steps):.0%}) hit the token limit "
            f"(--rollout.max_new_tokens {limit})")
    if closed * 2 > len(cut):
        return (f"{head}; {closed} of them closed their <action> block and went on, so the token the model ends its "
                "answers with is likely not a stop token (the stop tokens are the tokenizer's EOS and its chat "
                "template's turn end): check that the tokenizer's chat template is the one the model was trained with")
    return (f"{head}; {len(cut) - closed} of them stopped mid-answer (no </action>), so --rollout.max_new_tokens "
            f"{limit} is likely too small for the answers: raise it")
