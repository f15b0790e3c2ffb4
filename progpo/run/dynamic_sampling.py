"""Dynamic sampling: keep only rollout groups that carry a return signal, and draw new ones for the rest.

DAPO (Yu et al. 2025, arXiv 2503.14476, section 3.2 "Dynamic Sampling") over-samples and filters
out prompts whose group accuracy is 0 or 1, because such a group gives every sample GRPO advantage 0:
it costs a forward/backward pass and teaches nothing. verl-agent applies the same to agent groups.
Here a group is the ``N`` rollouts of one task (one ``uid``) and it carries **no return signal** when
every finished episode of it has the same return (up to float rounding: range ``<= 1e-12 * max |R|``,
the test ProGPO's ``zero_signal`` uses in ``progpo.advantages.result``), or when fewer than two of its
episodes finished. The return is the one the estimator decides "no return signal" on
(``AdvantageConfig.zero_signal_return``, :func:`signal_discount`): the episode return ``R_i = sum_t r_{i,t}``
(DAPO's accuracy, the baselines), or for ProGPO's default the discounted return ``G_{i,0} = sum_t gamma^t
r_{i,t}`` (Sutton & Barto 2018, eq. 3.8), so a group won by every episode at different lengths, which
ProGPO still gives step credit, is kept. The criterion is the same on both backends
(``progpo.trainer.loop`` and ``progpo.openrlhf.samples``) and is this module's :func:`group_has_signal`.

Per-task estimators (ProGPO, GiGPO, GRPO, RLOO, HGPO: every statistic is taken inside one task) give
the kept groups exactly the advantages they would get in the full batch, so dropping groups changes
which samples are trained on, not their values (``tests/run/test_dynamic_sampling.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from progpo.advantages import AdvantageConfig
from progpo.agents.types import Episode

RELATIVE_TOLERANCE = 1e-12
"""Returns whose range is at most this times their largest magnitude count as equal."""


def equal_returns(returns: Sequence[float]) -> bool:
    """True when every return is equal up to rounding (``max - min <= 1e-12 * max |R|``); True for < 2 values."""
    r = np.asarray(returns, dtype=np.float64)
    if r.size < 2:
        return True
    return bool(np.ptp(r) <= RELATIVE_TOLERANCE * np.max(np.abs(r)))


def signal_discount(cfg: AdvantageConfig | None) -> float | None:
    """The discount of the return that decides a group's signal: ``cfg.gamma`` where the estimator judges
    "no return signal" on the discounted return (``zero_signal_return='discounted'``, ProGPO's default),
    None (the episode return ``R_i``) otherwise, and for OpenRLHF's own estimators (``cfg`` None)."""
    return cfg.gamma if cfg is not None and cfg.zero_signal_return == "discounted" else None


def signal_return(ep: Episode, gamma: float | None = None) -> float:
    """One episode's return in reward units, penalties included: ``R_i = sum_t r_{i,t}`` (``gamma`` None) or the
    discounted ``G_{i,0} = sum_t gamma^t r_{i,t}`` (Sutton & Barto 2018, eq. 3.8), ``t`` over ``ep.steps``."""
    if gamma is None:
        return float(ep.episode_return)
    return float(sum(gamma**t * s.reward for t, s in enumerate(ep.steps)))


def group_returns(episodes: Iterable[Episode], gamma: float | None = None) -> dict[str, list[float]]:
    """``uid -> [return]`` of the finished (not failed) episodes (:func:`signal_return`), groups in first-seen order."""
    groups: dict[str, list[float]] = {}
    for ep in episodes:
        groups.setdefault(ep.uid, [])
        if not ep.failed:
            groups[ep.uid].append(signal_return(ep, gamma))
    return groups


def has_signal(group: Iterable[Episode], gamma: float | None = None) -> bool:
    """True when the finished episodes of one group (at least two) do not all have the same return
    (:func:`signal_return`: ``R_i``, or ``G_{i,0}`` with ``gamma``)."""
    returns = [signal_return(ep, gamma) for ep in group if not ep.failed]
    return len(returns) >= 2 and not equal_returns(returns)


def group_has_signal(episodes: Iterable[Episode], gamma: float | None = None) -> dict[str, bool]:
    """``uid -> True`` when the group's finished episodes (at least two) do not all have the same return
    (:func:`signal_return`: ``R_i``, or ``G_{i,0}`` with ``gamma``)."""
    return {uid: len(r) >= 2 and not equal_returns(r) for uid, r in group_returns(episodes, gamma).items()}


@dataclass
class DynamicSamplingStats:
    """What dynamic sampling did in one iteration.

    Attributes:
        drawn_groups: groups played (the batch's plus the extra draws).
        dropped_groups: of those, the groups without a return signal (left out of the update).
        extra_groups: groups drawn beyond ``--rollout.batch_size``.
        rounds: extra rollout rounds played (at most ``--rollout.dynamic_sampling_max_rounds``).
    """

    drawn_groups: int = 0
    dropped_groups: int = 0
    extra_groups: int = 0
    rounds: int = 0

    def metrics(self) -> dict[str, float]:
        """``rollout/dynamic_*`` metrics: dropped share and count, kept groups, extra groups and rounds."""
        kept = self.drawn_groups - self.dropped_groups
        return {
            "rollout/dynamic_dropped_frac": self.dropped_groups / self.drawn_groups if self.drawn_groups else 0.0,
            "rollout/dynamic_dropped_groups": float(self.dropped_groups),
            "rollout/dynamic_kept_groups": float(kept),
            "rollout/dynamic_extra_groups": float(self.extra_groups),
            "rollout/dynamic_rounds": float(self.rounds),
        }


def keep_signal_groups(episodes: Sequence[Episode], want: int,
                       gamma: float | None = None) -> tuple[list[Episode], list[str], int]:
    """The episodes of the first ``want`` groups with a return signal, in batch order.

    Args:
        episodes: one round of rollouts (groups of consecutive episodes sharing a ``uid``).
        want: most groups to keep (groups with signal beyond it are dropped too, counted as kept-out).
        gamma: judge the signal on ``G_{i,0}`` with this discount (:func:`signal_discount`); None: on ``R_i``.

    Returns:
        ``(kept episodes, kept uids, groups without signal)``.
    """
    signal = group_has_signal(episodes, gamma)
    kept_uids = [uid for uid, ok in signal.items() if ok][: max(want, 0)]
    keep = set(kept_uids)
    no_signal = sum(1 for ok in signal.values() if not ok)
    return [ep for ep in episodes if ep.uid in keep], kept_uids, no_signal
