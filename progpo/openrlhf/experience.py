"""OpenRLHF 0.11.2 experience maker whose advantages come from our step-level estimator registry.

OpenRLHF has no estimator registry: ``RemoteExperienceMaker.compute_advantages_and_returns`` is an
if/elif over its own names. :class:`StepExperienceMaker` overrides that one method: for our
estimators (``progpo``, ``gigpo``, ``grpo``, ``rloo``, ``hgpo``) it rebuilds the rollout's
:class:`progpo.advantages.StepBatch` from the per-step ``Experience.info`` entries written by
:class:`progpo.openrlhf.samples.StepSamplesGenerator`, calls
``progpo.advantages.compute_advantages`` once on the whole batch, and puts step ``(i,t)``'s
advantage ``A_{i,t}`` on every action token of that step's response (ProGPO combination, eq. 7 of
``docs/progpo-algorithm.md``: the step advantage is broadcast to the step's action tokens). The
per-step info keys are then removed (the actor's training step logs every info entry as a float
tensor and cannot take lists of strings). Any other estimator falls through to OpenRLHF's own code.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
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
from progpo.openrlhf.samples import STEP_INFO_KEYS, STEP_INFO_PREFIX

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
        for key in STEP_INFO_KEYS:
            if key not in exp.info:
                raise KeyError(f"Experience.info has no {key!r}: samples were not made by StepSamplesGenerator")
        cols = {key[len(STEP_INFO_PREFIX):]: (v.tolist() if isinstance(v, torch.Tensor) else list(v))
                for key, v in ((k, exp.info[k]) for k in STEP_INFO_KEYS)}
        cols["reward"] = exp.rewards.double().tolist()
        rows.extend(dict(zip(cols, values)) for values in zip(*cols.values()))
    return StepBatch.from_rows(rows)


def dump_step_batch(dump_dir: str, iteration: int, batch: StepBatch, config: Any, step_adv: torch.Tensor,
                    kl_coef: float) -> Path:
    """Write one rollout's step batch, estimator config and step advantages as JSON (``--debug.dump_dir``).

    File ``<dump_dir>/iter<NNN>_step_batch.json``: ``columns`` (StepBatch columns as lists, row ``k`` =
    rollout sample ``k``), ``config`` (``AdvantageConfig`` fields), ``advantages`` (``[S]``, what was
    put on the action tokens) and ``kl_coef`` (0 unless the KL is a reward penalty). Written aside,
    then renamed.
    """
    cols = {f.name: (None if getattr(batch, f.name) is None else getattr(batch, f.name).tolist())
            for f in dataclasses.fields(batch)}
    record = {"iteration": iteration, "columns": cols, "config": dataclasses.asdict(config),
              "advantages": step_adv.tolist(), "kl_coef": kl_coef}
    return _write_json(Path(dump_dir) / f"iter{iteration:03d}_step_batch.json", record)


def _write_json(path: Path, record: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record), encoding="utf-8")
    os.replace(tmp, path)
    return path


class StepExperienceMaker(RemoteExperienceMaker):
    """``RemoteExperienceMaker`` with our step-level estimators (see module docstring).

    Extra keyword arguments (besides OpenRLHF's):
        advantage_config: a frozen ``progpo.advantages.AdvantageConfig`` (its ``estimator`` must
            equal ``--algo.advantage.estimator`` when that is one of ours).
        encoder: optional ``list[str] -> np.ndarray [n, dim]`` unit-vector encoder for semantic
            expansion (None = expansion off, as the config allows).

    After each call, ``last_diagnostics`` holds the estimator's ``adv/*`` diagnostics. With
    ``--debug.dump_dir`` set, each rollout's step batch is written there (:func:`dump_step_batch`).
    """

    def __init__(
        self,
        *args: Any,
        advantage_config: Any = None,
        encoder: Callable[[list[str]], np.ndarray] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.advantage_config = advantage_config
        self.encoder = encoder
        self.last_diagnostics: dict[str, float] = {}
        self.dump_dir = getattr(self.args, "progpo_debug_dump_dir", None)
        self._iteration = 0
        if self.advantage_estimator in ESTIMATORS:
            if advantage_config is None:
                raise ValueError(f"--advantage_estimator {self.advantage_estimator} needs an AdvantageConfig")
            if advantage_config.estimator != self.advantage_estimator:
                raise ValueError(
                    f"AdvantageConfig.estimator={advantage_config.estimator!r} differs from "
                    f"--advantage_estimator={self.advantage_estimator!r}"
                )

    @torch.no_grad()
    def compute_advantages_and_returns(self, experiences: list[Experience]) -> list[Experience]:
        """Token-level advantages ``[B, A]`` for every experience (see module docstring).

        For our estimators: ``advantages[b, j] = A_{step(b)} * action_mask[b, j]`` plus, when the KL
        is a reward penalty (``--algo.kl.use_loss`` off, coefficient > 0), the reward-to-go of the
        per-token penalty ``-kl_coef * KL`` (as OpenRLHF's REINFORCE-family estimators do).
        ``returns`` equals ``advantages`` (critic-free; kept for logging).
        """
        if self.advantage_estimator not in ESTIMATORS:
            return super().compute_advantages_and_returns(experiences)
        args = self.strategy.args
        for exp in experiences:
            exp.rewards = exp.rewards.to(torch.promote_types(exp.rewards.dtype, torch.float32))
        apply_length_penalties(experiences, args)

        batch = step_batch_from_experiences(experiences)
        result = compute_advantages(batch, self.advantage_config, encoder=self.encoder)
        step_adv = torch.as_tensor(np.asarray(result.advantages, dtype=np.float64))
        if step_adv.shape != (batch.num_steps,) or not torch.isfinite(step_adv).all():
            raise ValueError(f"estimator returned advantages of shape {tuple(step_adv.shape)} or non-finite values")
        self.last_diagnostics = {k: float(v) for k, v in result.diagnostics.items()}

        kl_coef = 0.0 if args.algo.kl.use_loss else max(float(self.kl_ctl.value), 0.0)
        self._iteration += 1
        if self.dump_dir:
            dump_step_batch(self.dump_dir, self._iteration, batch, self.advantage_config, step_adv, kl_coef)
        offset = 0
        for exp in experiences:
            rows = exp.sequences.size(0)
            mask = exp.action_mask.to(torch.float32)
            adv = step_adv[offset : offset + rows].to(torch.float32).unsqueeze(1) * mask
            offset += rows
            if kl_coef > 0 and exp.kl is not None:
                adv = adv + self.get_cumulative_returns(-kl_coef * exp.kl.float(), exp.action_mask, 1.0)
            exp.advantages = adv
            exp.returns = adv.clone()
            exp.info["return"] = exp.rewards.clone()
            exp.info["adv/step_advantage"] = step_adv[offset - rows : offset].to(torch.float32)
            exp.info["adv/token_advantage_mean"] = masked_mean(adv, exp.action_mask, dim=-1)
            for key in STEP_INFO_KEYS:
                exp.info.pop(key, None)
            exp.kl = None
        return experiences
