"""Pure step-level advantage estimators (numpy only): ProGPO and its baselines GRPO, GiGPO, RLOO, HGPO, G2PO,
PGPO, CRBC, GRAFT.

Public API: ``compute_advantages(batch: StepBatch, cfg: AdvantageConfig, encoder=None) -> StepAdvantages``,
dispatching through ``ESTIMATORS`` (:class:`Estimator` member -> function with that same signature; the
names are written once, in the enum). ``PRESETS`` names
configurations (``paper``, ``default``, ``candidate``); ``config_from_preset(name, **overrides)`` builds one.
"""

from progpo.advantages.batch import StepBatch
from progpo.advantages.config import PRESETS, AdvantageConfig, Estimator, config_from_preset
from progpo.advantages.registry import ESTIMATORS, compute_advantages
from progpo.advantages.result import StepAdvantages

__all__ = ["AdvantageConfig", "ESTIMATORS", "Estimator", "PRESETS", "StepAdvantages", "StepBatch", "compute_advantages",
           "config_from_preset"]
