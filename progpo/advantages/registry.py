"""The estimator registry and the one entry point the trainer calls (no estimator-specific kwargs)."""

from __future__ import annotations

from collections.abc import Callable

from progpo.advantages.baselines import gigpo, grpo, hgpo, rloo
from progpo.advantages.batch import StepBatch
from progpo.advantages.config import AdvantageConfig, Estimator
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
}


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
