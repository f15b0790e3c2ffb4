"""The estimator registry and the one entry point the trainer calls (no estimator-specific kwargs)."""

from __future__ import annotations

from collections.abc import Callable

from progpo.advantages.baselines import gigpo, grpo, hgpo, rloo
from progpo.advantages.batch import StepBatch
from progpo.advantages.config import AdvantageConfig, Estimator
from progpo.advantages.crbc import crbc
from progpo.advantages.g2po import g2po
from progpo.advantages.graft import graft
from progpo.advantages.pgpo import pgpo
from progpo.advantages.progpo import progpo
from progpo.advantages.result import StepAdvantages
from progpo.advantages.semantic import Encoder

EstimatorFn = Callable[[StepBatch, AdvantageConfig, "Encoder | None"], StepAdvantages]

#: name -> estimator, every one with the signature ``(batch, cfg, encoder) -> StepAdvantages``.
ESTIMATORS: dict[Estimator, EstimatorFn] = {
    Estimator.GRPO: grpo,
    Estimator.GIGPO: gigpo,
    Estimator.PROGPO: progpo,
    Estimator.RLOO: rloo,
    Estimator.HGPO: hgpo,
    Estimator.G2PO: g2po,
    Estimator.PGPO: pgpo,
    Estimator.CRBC: crbc,
    Estimator.GRAFT: graft,
}


MIN_GROUP_SIZE = 2
"""Rollouts per task (``--rollout.n_samples_per_prompt``) the estimators of :data:`ESTIMATORS` need."""


def group_size_error(n_samples_per_prompt: int) -> str | None:
    """The one line that refuses a group size under which the group estimators learn nothing, or None.

    Every estimator of :data:`ESTIMATORS` compares the ``N`` rollouts of a task with each other (the
    episode term of GRPO/GiGPO/HGPO/G2PO/CRBC/ProGPO, RLOO's leave-one-out baseline, the anchor groups and
    merged graphs of PGPO/CRBC/GRAFT): with ``N = 1`` there is no
    episode-level signal (GRPO, RLOO and ProGPO give every step exactly zero advantage). Both backends
    print this line (``train`` and ``train_ray``), so it names the flag.

    Args:
        n_samples_per_prompt: ``N``, rollouts per task.

    Returns:
        The error line (starts with ``--rollout.n_samples_per_prompt``), or None when ``N >= 2``.
    """
    if n_samples_per_prompt >= MIN_GROUP_SIZE:
        return None
    return (f"--rollout.n_samples_per_prompt must be >= {MIN_GROUP_SIZE} for the group estimators "
            f"({', '.join(ESTIMATORS)}): they compare a task's rollouts with each other, and a group of "
            f"{n_samples_per_prompt} carries no signal; got {n_samples_per_prompt}")


def compute_advantages(batch: StepBatch, cfg: AdvantageConfig, encoder: Encoder | None = None) -> StepAdvantages:
    """Run ``cfg.estimator`` on ``batch``.

    Args:
        batch: ``S`` steps (any row order). cfg: ``AdvantageConfig``.
        encoder: ``list[str] -> [n, dim]`` unit vectors for ProGPO's semantic expansion (None: off).
    Returns:
        ``StepAdvantages``: ``advantages`` ``[S]`` float64 aligned with the batch rows, ``diagnostics``.
    Raises:
        ValueError: unknown estimator, empty/malformed batch, config/batch mismatch (message names the field).
    """
    if not isinstance(cfg, AdvantageConfig):
        raise ValueError(f"cfg must be an AdvantageConfig, got {type(cfg).__name__}")
    try:
        fn = ESTIMATORS[cfg.estimator]
    except KeyError:
        raise ValueError(f"AdvantageConfig.estimator {cfg.estimator!r} is not in {sorted(ESTIMATORS)}") from None
    return fn(batch, cfg, encoder)
