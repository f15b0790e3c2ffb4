"""Baseline estimators: GRPO, RLOO, GiGPO, HGPO (spec "Baselines behind the same interface").

All take ``(batch, cfg, encoder)`` and return ``StepAdvantages``; ``encoder`` is unused here.
"""

from __future__ import annotations

import numpy as np

from progpo.advantages._prep import episode_term, group_normalise, group_stats, prepare
from progpo.advantages.batch import StepBatch
from progpo.advantages.config import AdvantageConfig
from progpo.advantages.result import StepAdvantages, finish


def grpo(batch: StepBatch, cfg: AdvantageConfig, encoder=None) -> StepAdvantages:
    """GRPO (Shao et al. 2024, DeepSeekMath eq. for outcome supervision): ``A_{i,t} = A^E_i``, spec (1).

    Returns ``[S]`` advantages, constant along each trajectory. Raises ValueError on a bad batch.
    """
    p = prepare(batch, cfg)
    return finish(p, episode_term(p, cfg.episode_norm), {})


def rloo(batch: StepBatch, cfg: AdvantageConfig, encoder=None) -> StepAdvantages:
    """RLOO (Ahmadian et al. 2024): ``A_i = R_i - mean_{j != i, same task} R_j``, broadcast to the steps.

    A task with one trajectory gets 0 (no baseline sample). Raises ValueError on a bad batch.
    """
    p = prepare(batch, cfg)
    cnt, mean, _ = group_stats(p.traj_task, p.n_tasks, p.R)
    n = cnt[p.traj_task]
    # R_i - (sum R - R_i)/(n-1) = n (R_i - mean R)/(n-1): exactly 0 when the task's returns are equal
    adv = np.divide(n * (p.R - mean[p.traj_task]), n - 1.0, out=np.zeros(p.n_traj), where=n > 1)
    return finish(p, adv[p.traj], {})


def _step_group_adv(p, codes: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Normalised ``G`` inside groups of ``codes`` (``cfg.gigpo_mode``); returns (adv [S], size [S])."""
    adv, size = group_normalise(codes, k, p.G, p.cfg.gigpo_mode, p.cfg.eps)
    return np.where(size >= 2, adv, 0.0), size


def gigpo(batch: StepBatch, cfg: AdvantageConfig, encoder=None) -> StepAdvantages:
    """GiGPO (Feng et al. 2025, arXiv 2505.10978, eq. for the step-relative advantage):
    ``A = A^E + omega * A^S``; ``A^S`` normalises ``G`` within the task's steps sharing the anchor
    state ``o_t`` (``state_key``); singleton step groups give ``A^S = 0``.

    Raises ValueError on a bad batch (or obs_inventory without state_extra).
    """
    p = prepare(batch, cfg)
    codes, k = p.depth_keys(0)[0]
    a_s, size = _step_group_adv(p, codes, k)
    adv = episode_term(p, cfg.episode_norm) + cfg.omega * a_s
    return finish(p, adv, {"adv/frac_anchor_ge2": float(np.mean(size >= 2))})


def hgpo(batch: StepBatch, cfg: AdvantageConfig, encoder=None) -> StepAdvantages:
    """HGPO (He et al. 2026, arXiv 2602.22817): nested groups at history levels k = 0..K (K = ``depths``;
    level k shares ``o_t`` and the last k (observation, action) pairs, our depth keys), a normalised
    ``G`` advantage per level with >= 2 members, aggregated with weights ``(k+1)**hgpo_alpha`` over
    those levels: ``A = A^E + omega * sum_k w_k A_k / sum_k w_k`` (0 when no level has a partner).

    Raises ValueError on a bad batch.
    """
    p = prepare(batch, cfg)
    levels, diag = [], {}
    for k, (codes, kk) in enumerate(p.depth_keys(cfg.depths)):
        a_k, size = _step_group_adv(p, codes, kk)
        levels.append((a_k, size >= 2, cfg.hgpo_alpha * np.log(k + 1.0)))
        diag[f"adv/hgpo_frac_level{k}_used"] = float(np.mean(size >= 2))
    # weights in log space, scaled per row by its largest used weight: (k+1)**alpha overflows a
    # float for large |alpha| although only the ratios of the weights matter
    log_max = np.full(p.S, -np.inf)
    for _, used, log_w in levels:
        log_max = np.where(used, np.maximum(log_max, log_w), log_max)
    num = np.zeros(p.S)
    den = np.zeros(p.S)
    for a_k, used, log_w in levels:
        w = np.where(used, np.exp(np.where(used, log_w - log_max, 0.0)), 0.0)
        num += w * a_k
        den += w
    a_s = np.divide(num, den, out=np.zeros(p.S), where=den > 0)
    return finish(p, episode_term(p, cfg.episode_norm) + cfg.omega * a_s, diag)
