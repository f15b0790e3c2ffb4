"""Synthetic step batches for tests and the speed benchmark (no env needed).

``random_batch``: small random batches with revisits, invalid actions, truncation, paraphrased
observations and inventories (oracle tests). ``alfworld_like_batch``: a realistic 16 tasks x 8
trajectories x up to 50 steps batch with ALFWorld-style texts and repeated observations (benchmark).
``HashEncoder``: a deterministic stand-in encoder whose paraphrases ("... (again)") have cosine ~0.95.
"""

from __future__ import annotations

import hashlib

import numpy as np

from progpo.advantages.batch import StepBatch

_OBS = ["You are in the middle of a room.", "You arrive at drawer 1. The drawer 1 is closed.",
        "You open the drawer 1. It is empty.", "Nothing happens.", "You pick up the apple 1.",
        "You arrive at countertop 1. On it you see a knife 1.", "You put the apple 1 in fridge 1."]


class HashEncoder:
    """``list[str] -> [n, 16]`` unit vectors: a text's base (without the suffix " (again)") gets a
    hash-seeded random direction; the paraphrase adds a fixed small perturbation (cosine about 0.95)."""

    dim = 16

    def __call__(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim))
        for k, text in enumerate(texts):
            base = text.removesuffix(" (again)")
            seed = int.from_bytes(hashlib.sha256(base.encode()).digest()[:8], "little")
            v = np.random.default_rng(seed).normal(size=self.dim)
            v /= np.linalg.norm(v)
            if text != base:
                noise = np.random.default_rng(seed + 1).normal(size=self.dim)
                noise -= noise.dot(v) * v
                v = v + 0.33 * noise / np.linalg.norm(noise)
            out[k] = v / np.linalg.norm(v)
        return out


def random_batch(seed: int, n_tasks: int | None = None, max_traj: int = 5, max_len: int = 8,
                 paraphrased_finals: bool = False) -> StepBatch:
    """A small random batch (rows shuffled) exercising every edge case the estimators handle.

    ``paraphrased_finals``: some final observations of truncated trajectories are paraphrases
    (" (again)") of anchor texts, for the graph's semantic placement of final observations.
    """
    rng = np.random.default_rng(seed)
    n_tasks = n_tasks or int(rng.integers(1, 4))
    cols: dict[str, list] = {k: [] for k in ("uid", "traj_id", "step_index", "reward", "terminated", "truncated",
                                             "invalid", "anchor_obs", "prefix_key", "action", "state_extra",
                                             "final_obs")}
    with_final = bool(rng.random() < 0.5)
    tid = 0
    n_obs = int(rng.integers(2, 6))
    for u in range(n_tasks):
        for _ in range(int(rng.integers(1, max_traj + 1))):
            T = int(rng.integers(1, max_len + 1))
            ends = rng.choice(["terminated", "truncated", "none"], p=[0.6, 0.3, 0.1])
            hist: list[str] = []
            for t in range(T):
                obs = _OBS[int(rng.integers(0, n_obs))] + (" (again)" if rng.random() < 0.2 else "")
                act = f"go to {int(rng.integers(0, 3))}"
                invalid = bool(rng.random() < 0.12)
                if invalid:
                    act = f"garbage {int(rng.integers(0, 100))}"
                last = t == T - 1
                r = -0.1 * invalid + (10.0 if last and ends == "terminated" and rng.random() < 0.5 else 0.0)
                r += float(rng.choice([0.0, 0.0, 1.0, -0.5]))
                window = hist[-4:]
                cols["uid"].append(f"task{u}")
                cols["traj_id"].append(tid)
                cols["step_index"].append(t)
                cols["reward"].append(r)
                cols["terminated"].append(bool(last and ends == "terminated"))
                cols["truncated"].append(bool(last and ends == "truncated"))
                cols["invalid"].append(invalid)
                cols["anchor_obs"].append(obs)
                cols["prefix_key"].append(f"{u}|{t if rng.random() < 0.5 else 0}|" + "|".join(window + [obs]))
                cols["action"].append(act)
                cols["state_extra"].append(f"inv{int(rng.integers(0, 2))}")
                cut = last and ends == "truncated"
                final = _OBS[int(rng.integers(0, n_obs + 1))] if cut else ""
                if cut and paraphrased_finals and rng.random() < 0.4:
                    final += " (again)"
                cols["final_obs"].append(final)
                hist += [obs, act]
            tid += 1
    if not with_final:
        del cols["final_obs"]
    perm = rng.permutation(len(cols["uid"]))
    return StepBatch.from_lists(**{k: [v[i] for i in perm] for k, v in cols.items()})


_PLACES = ["cabinet", "drawer", "countertop", "shelf", "fridge", "sinkbasin", "stoveburner", "desk", "bed"]
_OBJECTS = ["apple", "mug", "knife", "book", "pencil", "plate", "cellphone", "keychain"]


def alfworld_like_batch(n_tasks: int = 16, n_traj: int = 8, max_len: int = 50, seed: int = 0) -> StepBatch:
    """A realistic batch: ``n_tasks`` x ``n_traj`` trajectories of up to ``max_len`` steps.

    Each task has ~40 locations; a trajectory walks among them with a noisy expert bias, so anchor
    observations repeat across and within trajectories, histories fragment, ~5% invalid actions,
    success (reward 10) ends a trajectory early, the rest are truncated at ``max_len``.
    """
    rng = np.random.default_rng(seed)
    cols: dict[str, list] = {k: [] for k in ("uid", "traj_id", "step_index", "reward", "terminated", "truncated",
                                             "invalid", "anchor_obs", "prefix_key", "action", "state_extra")}
    tid = 0
    for u in range(n_tasks):
        locs = [f"{p} {k}" for p in _PLACES for k in range(1, 6)][: 30 + int(rng.integers(0, 15))]
        target = _OBJECTS[u % len(_OBJECTS)]
        walkthrough = list(rng.choice(len(locs), size=6, replace=False))
        for _ in range(n_traj):
            hist: list[str] = []
            holding = "nothing"
            obs = f"-= Welcome to TextWorld, ALFRED! =- You are in the middle of a room. Your task is to: put a {target} in {locs[walkthrough[-1]]}."
            for t in range(max_len):
                if rng.random() < 0.05:
                    act, invalid, nxt = "think about it", True, "Nothing happens."
                else:
                    k = walkthrough[min(t, 5)] if rng.random() < 0.55 else int(rng.integers(0, len(locs)))
                    act, invalid = f"go to {locs[k]}", False
                    state = "closed" if rng.random() < 0.5 else "open"
                    nxt = f"You arrive at {locs[k]}. The {locs[k]} is {state}."
                    if k == walkthrough[2] and holding == "nothing":
                        holding = f"{target} 1"
                success = holding != "nothing" and act == f"go to {locs[walkthrough[-1]]}" and rng.random() < 0.02
                last = success or t == max_len - 1
                cols["uid"].append(f"game{u}")
                cols["traj_id"].append(tid)
                cols["step_index"].append(t)
                cols["reward"].append((10.0 if success else 0.0) - (0.1 if invalid else 0.0))
                cols["terminated"].append(bool(success))
                cols["truncated"].append(bool(last and not success))
                cols["invalid"].append(invalid)
                cols["anchor_obs"].append(obs)
                key = f"game{u}|step {t}|" + "|".join(hist[-4:] + [obs])
                cols["prefix_key"].append(hashlib.blake2b(key.encode(), digest_size=16).hexdigest())
                cols["action"].append(act)
                cols["state_extra"].append(f"You are carrying: {holding}.")
                hist += [obs, act]
                obs = nxt
                if last:
                    break
            tid += 1
    return StepBatch.from_lists(**cols)
