"""OpenRLHF 0.11.2 experience maker whose advantages come from our step-level estimator registry.

OpenRLHF has no estimator registry: ``RemoteExperienceMaker.compute_advantages_and_returns`` is an
if/elif over its own names. :class:`StepExperienceMaker` overrides that one method: for our
estimators (every name of ``progpo.advantages.ESTIMATORS``) it rebuilds the rollout's
:class:`progpo.advantages.StepBatch` from the per-step ``Experience.info`` entries written by
:class:`progpo.openrlhf.samples.StepSamplesGenerator`, calls
``progpo.advantages.compute_advantages`` once on the whole batch, and puts step ``(i,t)``'s
advantage ``A_{i,t}`` on every action token of that step's response (ProGPO combination, eq. 7 of
``docs/progpo-algorithm.md``: the step advantage is broadcast to the step's action tokens). The
per-step info keys are then removed (the actor's training step logs every info entry as a float
tensor and cannot take lists of strings). Padding rows (no action tokens, see
``progpo.openrlhf.balance``) are left out of the step batch and get advantage 0.

OpenRLHF's own estimators (``group_norm``, ``reinforce``, ``reinforce_baseline``, ``dr_grpo``,
``flash_reinforce``: the comparison mode; its ``rloo`` name is our registry's) train on the same per-step samples: their
advantage is computed by OpenRLHF's own ``compute_advantages_and_returns`` on one row per episode
(reward = the episode return ``R_i``, one action position per response token of the episode), and
that episode advantage goes on every action token of each of its steps. With ``gamma = 1`` and the
KL as a loss (what ``train_ray`` allows here), this is exactly the per-token advantage OpenRLHF puts
on the episode's transcript (constant over its action tokens), without cutting the transcript to
``--data.max_len``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from openrlhf.models.utils import masked_mean
from openrlhf.trainer.ppo_utils.experience import Experience
from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker
from openrlhf.trainer.ppo_utils.length_penalty import apply_length_penalties

from progpo.advantages import ESTIMATORS, StepBatch, compute_advantages
from progpo.agents.types import Episode
from progpo.openrlhf.balance import real_rows
from progpo.openrlhf.launch import ray_run
from progpo.openrlhf.samples import STEP_INFO_KEYS, STEP_INFO_PREFIX
from progpo.run.atomic import atomic_write_text

logger = logging.getLogger(__name__)


def step_batch_from_experiences(experiences: list[Experience]) -> StepBatch:
    """Rebuild the :class:`StepBatch` of a rollout from per-step experiences (rows in order).

    Rows are taken experience by experience, row by row; ``Experience.rewards`` ``[B]`` is the step
    reward ``r_{i,t}`` (after any OpenRLHF length penalty).

    Raises:
        KeyError: an experience lacks a per-step info key (it was not made by our samples generator).
        ValueError: from :meth:`StepBatch.from_lists` (inconsistent trajectories).
    """
    rows: list[dict[str, Any]] = []
    for exp in experiences:
        keep = real_rows(exp).tolist()  # padding rows are no steps
        for key in STEP_INFO_KEYS:
            if key not in exp.info:
                raise KeyError(f"Experience.info has no {key!r}: samples were not made by StepSamplesGenerator")
        cols = {key[len(STEP_INFO_PREFIX):]: (v.tolist() if isinstance(v, torch.Tensor) else list(v))
                for key, v in ((k, exp.info[k]) for k in STEP_INFO_KEYS)}
        cols["reward"] = exp.rewards.double().tolist()
        rows.extend(dict(zip(cols, values)) for values, k in zip(zip(*cols.values()), keep) if k)
    return StepBatch.from_rows(rows)


def dump_step_batch(dump_dir: str, iteration: int, batch: StepBatch, config: Any, step_adv: torch.Tensor,
                    kl_coef: float, rollout_index: list[int]) -> Path:
    """Write one rollout's step batch, estimator config and step advantages as JSON (``--debug.dump_dir``).

    File ``<dump_dir>/iter<NNN>_step_batch.json``: ``columns`` (StepBatch columns as lists, ``[S]``),
    ``rollout_index`` (``[S]``: row ``k``'s position in the padded rollout batch, OpenRLHF's
    ``Experience.index``), ``config`` (``AdvantageConfig`` fields, or ``{"openrlhf_estimator": name}``),
    ``advantages`` (``[S]``, what was put on the action tokens) and ``kl_coef`` (0 unless the KL is a
    reward penalty). Written aside, then renamed.
    """
    cols = {f.name: (None if getattr(batch, f.name) is None else getattr(batch, f.name).tolist())
            for f in dataclasses.fields(batch)}
    record = {"iteration": iteration, "columns": cols,
              "config": config if isinstance(config, dict) else dataclasses.asdict(config),
              "advantages": step_adv.tolist(), "kl_coef": kl_coef, "rollout_index": rollout_index}
    return _write_json(Path(dump_dir) / f"iter{iteration:03d}_step_batch.json", record)


def _write_json(path: Path, record: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(record))
    return path


class StepExperienceMaker(RemoteExperienceMaker):
    """``RemoteExperienceMaker`` with our step-level estimators (see module docstring).

    Extra keyword arguments (besides OpenRLHF's):
        advantage_config: a frozen ``progpo.advantages.AdvantageConfig`` (its ``estimator`` must
            equal ``--algo.advantage.estimator`` when that is one of ours).
        encoder: optional ``list[str] -> np.ndarray [n, dim]`` unit-vector encoder for semantic
            expansion (None = expansion off, as the config allows).
        episodes_source: returns the ``[E]`` episodes of the batch being made (OpenRLHF's estimators
            need every episode, failed ones included, for their group statistics).

    After each call, ``last_diagnostics`` holds the estimator's ``adv/*`` diagnostics. With
    ``--debug.dump_dir`` set, each rollout's step batch is written there (:func:`dump_step_batch`); with
    ``--debug.flip_advantages`` every step advantage is negated (the dump records the negated ones).
    """

    def __init__(
        self,
        *args: Any,
        advantage_config: Any = None,
        encoder: Callable[[list[str]], np.ndarray] | None = None,
        episodes_source: Callable[[], list[Episode]] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.advantage_config = advantage_config
        self.encoder = encoder
        self.episodes_source = episodes_source
        self.last_diagnostics: dict[str, float] = {}
        self.dump_dir = ray_run(self.args).dump_dir
        self.flip_advantages = ray_run(self.args).settings.debug.flip_advantages
        self._iteration = 0
        if self.advantage_estimator in ESTIMATORS:
            if advantage_config is None:
                raise ValueError(f"--algo.advantage.estimator {self.advantage_estimator} needs an AdvantageConfig")
            if advantage_config.estimator != self.advantage_estimator:
                raise ValueError(
                    f"AdvantageConfig.estimator={advantage_config.estimator!r} differs from "
                    f"--algo.advantage.estimator={self.advantage_estimator!r}"
                )

    @torch.no_grad()
    def compute_advantages_and_returns(self, experiences: list[Experience]) -> list[Experience]:
        """Token-level advantages ``[B, A]`` for every experience (see module docstring).

        ``advantages[b, j] = A_{step(b)} * action_mask[b, j]``: ``A`` from our registry, or, for
        OpenRLHF's estimators, the episode's advantage (:meth:`_episode_advantages`); plus, when the
        KL is a reward penalty (``--algo.kl.use_loss`` off, coefficient > 0; our estimators only), the
        reward-to-go of the per-token penalty ``-kl_coef * KL`` (as OpenRLHF's REINFORCE-family
        estimators do). Padding rows get 0. ``returns`` equals ``advantages`` (critic-free; kept for logging).
        """
        args = self.strategy.args
        for exp in experiences:
            exp.rewards = exp.rewards.to(torch.promote_types(exp.rewards.dtype, torch.float32))
        apply_length_penalties(experiences, args)

        batch = step_batch_from_experiences(experiences)
        if self.advantage_estimator in ESTIMATORS:
            result = compute_advantages(batch, self.advantage_config, encoder=self.encoder)
            step_adv = torch.as_tensor(np.asarray(result.advantages, dtype=np.float64))
            self.last_diagnostics = {k: float(v) for k, v in result.diagnostics.items()}
            config: Any = self.advantage_config
        else:
            step_adv = self._episode_advantages(batch)
            self.last_diagnostics = {}
            config = {"openrlhf_estimator": self.advantage_estimator}
        if step_adv.shape != (batch.num_steps,) or not torch.isfinite(step_adv).all():
            raise ValueError(f"estimator returned advantages of shape {tuple(step_adv.shape)} or non-finite values")
        if self.flip_advantages:  # --debug.flip_advantages: the negative control of a learning check
            step_adv = -step_adv

        kl_coef = 0.0 if args.algo.kl.use_loss else max(float(self.kl_ctl.value), 0.0)
        if kl_coef > 0 and self.advantage_estimator not in ESTIMATORS:
            raise ValueError(f"--algo.advantage.estimator {self.advantage_estimator} on per-step samples needs "
                             "--algo.kl.use_loss (a KL reward penalty would be summed over a transcript)")
        self._iteration += 1
        if self.dump_dir:
            index = [i for exp in experiences for i, k in zip(exp.index, real_rows(exp).tolist()) if k]
            dump_step_batch(self.dump_dir, self._iteration, batch, config, step_adv, kl_coef, index)
        offset = 0
        for exp in experiences:
            real = real_rows(exp)
            row_adv = torch.zeros(exp.sequences.size(0), dtype=torch.float64)  # padding rows: 0
            row_adv[real] = step_adv[offset : offset + int(real.sum())]
            offset += int(real.sum())
            adv = row_adv.to(torch.float32).unsqueeze(1) * exp.action_mask.to(torch.float32)
            if kl_coef > 0 and exp.kl is not None:
                adv = adv + self.get_cumulative_returns(-kl_coef * exp.kl.float(), exp.action_mask, 1.0)
            exp.advantages = adv
            exp.returns = adv.clone()
            exp.info["return"] = exp.rewards.clone()
            exp.info["adv/step_advantage"] = row_adv.to(torch.float32)
            exp.info["adv/token_advantage_mean"] = masked_mean(adv, exp.action_mask, dim=-1).nan_to_num(0.0)
            for key in STEP_INFO_KEYS:
                exp.info.pop(key, None)
            exp.kl = None
        return experiences

    def _episode_advantages(self, batch: StepBatch) -> torch.Tensor:
        """``[S]`` OpenRLHF-estimator advantages of the step rows: each row gets its episode's.

        OpenRLHF's own ``compute_advantages_and_returns`` runs on one row per episode of the batch
        (:func:`episode_experience`; failed episodes included, with the return of the steps they
        played, as OpenRLHF's transcripts had them); row ``k`` (``batch.traj_id[k]`` = its episode's
        position) gets that episode's advantage.

        Raises:
            ValueError: no ``episodes_source``, or its episodes do not cover ``batch.traj_id``.
        """
        if self.episodes_source is None:
            raise ValueError(f"--algo.advantage.estimator {self.advantage_estimator} on per-step samples needs the "
                             "batch's episodes (StepExperienceMaker(episodes_source=...))")
        episodes = self.episodes_source()
        if not len(episodes) or int(batch.traj_id.max()) >= len(episodes):
            raise ValueError(f"{len(episodes)} episodes do not cover trajectory ids up to {int(batch.traj_id.max())}")
        rows = [episode_experience(ep, k) for k, ep in enumerate(episodes)]
        RemoteExperienceMaker.compute_advantages_and_returns(self, rows)  # OpenRLHF's own estimator code
        per_episode = torch.tensor([float(r.advantages[0, -1]) for r in rows], dtype=torch.float64)
        return per_episode[torch.as_tensor(batch.traj_id, dtype=torch.long)]


def episode_experience(episode: Episode, index: int) -> Experience:
    """One row standing for ``episode`` in OpenRLHF's estimators (comparison mode).

    ``rewards`` ``[1]`` = ``R_i`` (the episode return, as OpenRLHF's transcript carried it);
    ``action_mask`` ``[1, A_i]`` of ones with ``A_i`` = the episode's response tokens (>= 1), so
    that OpenRLHF's token-weighted normalisation (``reinforce``, ``reinforce_baseline``) weighs it as
    its transcript; ``kl`` zeros (the KL is a loss here); ``index = [index]`` (its position in the batch).
    """
    tokens = max(1, sum(len(s.response_ids) for s in episode.steps))
    return Experience(
        action_mask=torch.ones(1, tokens, dtype=torch.long),
        kl=torch.zeros(1, tokens),
        rewards=torch.tensor([episode.episode_return], dtype=torch.float32),
        response_length=torch.tensor([tokens]),
        truncated=torch.tensor([bool(episode.steps and episode.steps[-1].finish_reason == "length")]),
        index=[index],
        info={},
    )
