"""Shared vectorised building blocks: sorted batch view, integer keys, group statistics.

Every estimator works on a ``Prepared`` view of a ``StepBatch``: rows sorted by
(traj_id, step_index), so a trajectory is a contiguous run and its previous step is ``row - 1``.
Dimension names: ``S`` steps, ``M`` trajectories, ``U`` tasks (uids), ``K`` groups of some key.
Group-bys are dense integer codes (``factorize``) plus ``np.bincount``; no Python loop over steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from progpo.advantages.batch import StepBatch
from progpo.advantages.config import AdvantageConfig

#: Canonical action symbol for invalid steps in history/depth keys and graph actions: the env
#: treats every invalid response the same way (no state change, penalty), whatever its text.
INVALID_ACTION = "<invalid>"
#: Largest |reward| accepted: squares of returns must stay far from float64 overflow.
MAX_ABS_REWARD = 1e100


def factorize(values: np.ndarray) -> tuple[np.ndarray, int]:
    """Dense codes of equal values (exact equality, not just equal hashes), numbered by first occurrence.

    Groups by Python's 64-bit ``hash`` with ``np.unique`` (C speed), then verifies that every member
    equals its group's first value; on a hash collision it falls back to an exact dict lookup. Codes are
    renumbered in order of each value's first row, so they do not depend on ``PYTHONHASHSEED``: numbered
    in hash order, the codes, and with them the order of the floating-point sums keyed on them (the
    closure's edge sums, GRAFT's per-task sums), changed from process to process, and CRBC, GRAFT and
    ProGPO's advantages differed by float rounding between two runs of one batch.

    Args:
        values: ``[S]`` object/str array.
    Returns:
        (codes ``[S]`` int64 in ``0..K-1``, ``codes[i] < codes[j]`` iff the first row holding ``values[i]``
        precedes the first row holding ``values[j]``; K).
    """
    lst = values.tolist()
    hashes = np.fromiter(map(hash, lst), dtype=np.int64, count=len(lst))
    uniq, first, codes = np.unique(hashes, return_index=True, return_inverse=True)
    codes = codes.reshape(-1).astype(np.int64)
    if np.all(values == values[first][codes]):
        rank = np.empty(len(uniq), dtype=np.int64)
        rank[np.argsort(first)] = np.arange(len(uniq))
        return rank[codes], len(uniq)
    table: dict = {}
    codes = np.fromiter((table.setdefault(v, len(table)) for v in lst), dtype=np.int64, count=len(lst))
    return codes, len(table)


def combine(*codes: np.ndarray) -> tuple[np.ndarray, int]:
    """Dense codes of the tuple of several non-negative int64 code arrays (same length ``[S]``).

    Mixes the codes into one int64 (mixed radix) and runs a single ``np.unique``; falls back to
    pairwise mixing when the radix product would not fit in 62 bits.
    """
    out = codes[0].astype(np.int64)
    radix = int(out.max(initial=0)) + 1
    for c in codes[1:]:
        base = int(c.max(initial=0)) + 1
        if radix * base >= 2**62:
            _, out = np.unique(out, return_inverse=True)
            out = out.astype(np.int64).reshape(-1)
            radix = int(out.max(initial=0)) + 1
        out = out * base + c
        radix *= base
    uniq, inv = np.unique(out, return_inverse=True)
    return inv.astype(np.int64).reshape(-1), len(uniq)


def group_stats(g: np.ndarray, n: int, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-group count, mean and sum of squared deviations (two-pass, stable).

    A group whose values are all equal gets exactly that value as its mean (and ssd 0): the
    floating-point sum/count of six 9.8s is not 9.8, and ``x - mean`` must be exactly 0 there, so
    that all-equal returns give exactly zero advantages.

    Args:
        g: ``[S]`` group codes in ``0..n-1``; x: ``[S]`` float64 values.
    Returns:
        cnt ``[n]`` (float64), mean ``[n]`` (0 for empty groups), ssd ``[n]``.
    """
    cnt = np.bincount(g, minlength=n).astype(np.float64)
    tot = np.bincount(g, weights=x, minlength=n)
    mean = np.divide(tot, cnt, out=np.zeros(n), where=cnt > 0)
    lo = np.full(n, np.inf)
    hi = np.full(n, -np.inf)
    np.minimum.at(lo, g, x)
    np.maximum.at(hi, g, x)
    mean = np.where((cnt > 0) & (lo == hi), lo, mean)
    dev = x - mean[g]
    ssd = np.bincount(g, weights=dev * dev, minlength=n)
    return cnt, mean, ssd


def sample_std(cnt: np.ndarray, ssd: np.ndarray) -> np.ndarray:
    """Sample standard deviation (n-1 denominator) per group; 0 where cnt <= 1."""
    var = np.divide(ssd, cnt - 1.0, out=np.zeros_like(ssd), where=cnt > 1)
    return np.sqrt(np.maximum(var, 0.0))


def normalise(x: np.ndarray, mean: np.ndarray, std: np.ndarray, mode: str, eps: float) -> np.ndarray:
    """``x - mean`` (mean_norm) or ``(x - mean) / (std + eps)`` (mean_std_norm); arrays broadcast."""
    if mode == "mean_norm":
        return x - mean
    return (x - mean) / (std + eps)


def group_normalise(codes: np.ndarray, k: int, x: np.ndarray, mode: str, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """``x [N]`` normalised (:func:`normalise`, ``mode``) within the ``k`` groups of ``codes [N]``, with the
    group's mean and sample std (:func:`sample_std`); returns (values ``[N]``, size of each entry's group ``[N]``)."""
    cnt, mean, ssd = group_stats(codes, k, x)
    return normalise(x, mean[codes], sample_std(cnt, ssd)[codes], mode, eps), cnt[codes]


@dataclass
class Prepared:
    """Sorted, coded view of a batch (all ``[S]`` arrays are in sorted row order).

    Attributes:
        order: ``[S]`` original row of each sorted row (``out[order] = sorted_values``).
        task: ``[S]`` task code (0..U-1); traj: ``[S]`` trajectory code (0..M-1); t: ``[S]`` step index.
        r: ``[S]`` reward; G: ``[S]`` discounted return-to-go (spec notation).
        first, last: ``[S]`` bool, first/last step of its trajectory.
        traj_task: ``[M]`` task of each trajectory; traj_len: ``[M]`` T_i; R: ``[M]`` episode return.
        ended_done: ``[S]`` bool, last step that terminated (success/failure inside the task).
    """

    batch: StepBatch
    cfg: AdvantageConfig
    order: np.ndarray
    task: np.ndarray
    n_tasks: int
    traj: np.ndarray
    n_traj: int
    t: np.ndarray
    r: np.ndarray
    G: np.ndarray
    first: np.ndarray
    last: np.ndarray
    traj_task: np.ndarray
    traj_len: np.ndarray
    R: np.ndarray
    ended_done: np.ndarray
    cache: dict = field(default_factory=dict)

    @property
    def S(self) -> int:  # noqa: N802 - spec notation
        return int(self.order.shape[0])

    def unsort(self, x: np.ndarray) -> np.ndarray:
        """Map a sorted-order ``[S]`` array back to the batch's row order."""
        out = np.empty_like(x)
        out[self.order] = x
        return out

    # --- text codes -------------------------------------------------------------------
    def obs_code(self) -> np.ndarray:
        """``[S]`` code of the raw anchor observation text (batch-wide)."""
        if "obs" not in self.cache:
            self.cache["obs"] = factorize(self.batch.anchor_obs[self.order])
        return self.cache["obs"][0]

    def extra_code(self) -> np.ndarray:
        """``[S]`` code of state_extra (inventory); raises if the batch has none."""
        if "extra" not in self.cache:
            if self.batch.state_extra is None:
                raise ValueError(
                    "AdvantageConfig.state_key='obs_inventory' needs StepBatch.state_extra (the env's "
                    "inventory text); this batch has state_extra=None"
                )
            self.cache["extra"] = factorize(self.batch.state_extra[self.order])
        return self.cache["extra"][0]

    def state_code(self) -> np.ndarray:
        """``[S]`` depth-0 key ``(u, o_t)`` or ``(u, o_t, inventory)`` per ``cfg.state_key`` (E3)."""
        if "state" not in self.cache:
            parts = [self.task, self.obs_code()]
            if self.cfg.state_key == "obs_inventory":
                parts.append(self.extra_code())
            self.cache["state"] = combine(*parts)
        return self.cache["state"][0]

    def action_code(self, canonical_invalid: bool = True) -> np.ndarray:
        """``[S]`` action code; invalid steps share one symbol when ``canonical_invalid``."""
        if "act" not in self.cache:
            self.cache["act"] = factorize(self.batch.action[self.order])
        raw, k = self.cache["act"]
        if not canonical_invalid:
            return raw
        return np.where(self.batch.invalid[self.order], k, raw)  # code k = INVALID_ACTION

    def depth_keys(self, depth: int) -> list[tuple[np.ndarray, int]]:
        """Codes of the history depth keys ``k_d = (u, o_{t-d}, a_{t-d}, ..., a_{t-1}, o_t)``, d = 0..depth.

        Steps with ``t < d`` use their whole (shorter) history plus a start marker, so they pool only
        with steps that also started ``t`` steps ago from the same observation. Pools are nested
        (equal ``k_{d+1}`` implies equal ``k_d``). Invalid actions use one symbol (``INVALID_ACTION``).
        Returns ``[(codes [S], K_d)]`` for d = 0..depth.
        """
        keys = self.cache.setdefault("depth_keys", [])
        if not keys:
            s0 = self.state_code()
            keys.append((s0, int(s0.max(initial=-1)) + 1))
        act = self.action_code(True)
        prev = np.maximum(np.arange(self.S) - 1, 0)
        notfirst = ~self.first
        while len(keys) <= depth:
            k_prev = keys[-1][0]
            pk = np.where(notfirst, k_prev[prev] + 1, 0)
            pa = np.where(notfirst, act[prev] + 1, 0)
            keys.append(combine(pk, pa, keys[0][0]))
        return keys[: depth + 1]

    def peer_key(self) -> tuple[np.ndarray, int]:
        """Codes of the exact-prefix peer key (spec (2)): per task, prompt hash or full history."""
        if "peer" not in self.cache:
            if self.cfg.prefix_mode == "prompt":
                pk, _ = factorize(self.batch.prefix_key[self.order])
                self.cache["peer"] = combine(self.task, pk)
            else:
                self.cache["peer"] = self._history_key()
        return self.cache["peer"]

    def _history_key(self) -> tuple[np.ndarray, int]:
        """Full-prefix key ``(u, o_0, a_0, ..., o_t)`` on raw texts, built level by level in t."""
        obs = combine(self.task, self.obs_code())[0]
        act = self.action_code(False)
        h = np.zeros(self.S, dtype=np.int64)
        offset = 0
        for t in range(int(self.t.max(initial=-1)) + 1):
            rows = np.flatnonzero(self.t == t)
            if t == 0:
                codes, k = combine(obs[rows])
            else:
                codes, k = combine(h[rows - 1], act[rows - 1], obs[rows])
            h[rows] = codes + offset
            offset += k
        return h, offset


def prepare(batch: StepBatch, cfg: AdvantageConfig) -> Prepared:
    """Validate the batch and build its sorted view with returns (spec notation section).

    Raises:
        ValueError: empty or malformed batch (``StepBatch.validate``); |reward| > 1e100.
    """
    if not isinstance(batch, StepBatch):
        raise ValueError(f"batch must be a StepBatch, got {type(batch).__name__}")
    batch.validate()
    cfg = cfg.for_batch(batch.state_extra is not None)  # state_key='auto' (ProGPO's default: E3 keys)
    if np.max(np.abs(batch.reward)) > MAX_ABS_REWARD:
        raise ValueError(f"StepBatch.reward has |r| > {MAX_ABS_REWARD:g}; rescale rewards")
    order = np.lexsort((batch.step_index, batch.traj_id))
    tid = batch.traj_id[order]
    first = np.r_[True, tid[1:] != tid[:-1]]
    last = np.r_[first[1:], True]
    traj = np.cumsum(first) - 1
    n_traj = int(traj[-1]) + 1
    task_all, n_tasks = factorize(batch.uid[order])
    t = batch.step_index[order]
    r = batch.reward[order]
    G = discounted_returns(r, last, t, cfg.gamma)
    starts = np.flatnonzero(first)
    traj_len = np.bincount(traj, minlength=n_traj)
    R = np.bincount(traj, weights=r, minlength=n_traj)
    return Prepared(
        batch=batch, cfg=cfg, order=order, task=task_all, n_tasks=n_tasks, traj=traj, n_traj=n_traj,
        t=t, r=r, G=G, first=first, last=last, traj_task=task_all[starts], traj_len=traj_len, R=R,
        ended_done=last & batch.terminated[order],
    )


def discounted_returns(r: np.ndarray, last: np.ndarray, t: np.ndarray, gamma: float) -> np.ndarray:
    """``G_t = r_t + gamma * G_{t+1}`` (``G = r`` on the last step), rows sorted by (traj, t).

    Vectorised over trajectories, one pass per distance from the trajectory's end.
    """
    S = r.shape[0]
    ends = np.flatnonzero(last)
    lens = np.diff(np.r_[-1, ends])
    to_end = np.repeat(ends, lens) - np.arange(S)  # 0 on the last step
    G = np.empty(S)
    G[to_end == 0] = r[to_end == 0]
    for k in range(1, int(to_end.max(initial=0)) + 1):
        rows = np.flatnonzero(to_end == k)
        G[rows] = r[rows] + gamma * G[rows + 1]
    return G


def episode_term(p: Prepared, mode: str) -> np.ndarray:
    """Spec (1): ``A^E_i = (R_i - mean_u R) / (std_u R + eps)`` per trajectory, broadcast to ``[S]``.

    Sample std (n-1); a task with one trajectory has A^E = 0 (R_i - mean = 0 exactly).
    """
    a_traj, _ = group_normalise(p.traj_task, p.n_tasks, p.R, mode, p.cfg.eps)
    return a_traj[p.traj]
