"""The typed step batch every advantage estimator reads.

One row per *step* (one policy decision = one training sample). Dimension names used in
docstrings: ``S`` = number of steps in the batch. A trajectory ``i`` of task ``u`` contributes
rows ``t = 0..T_i-1``; rows may come in any order (estimators sort by (traj_id, step_index)).
Notation follows ``docs/progpo-algorithm.md`` (shared docs): ``r_{i,t}``, ``o_{i,t}``, ``x_{i,t}``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np


_DTYPES = {"int": np.int64, "float": np.float64, "bool": bool}
_NUMPY_KINDS = {"int": "iu", "float": "fiu", "bool": "b"}


def _column(kind: str, values: Sequence[Any], name: str) -> np.ndarray:
    """One column as a numpy array of its kind (``str`` -> object array of str)."""
    if kind != "str":
        return np.asarray(values, dtype=_DTYPES[kind]).reshape(-1)
    arr = np.empty(len(values), dtype=object)
    for k, v in enumerate(values):
        if not isinstance(v, str):
            raise ValueError(f"StepBatch.{name}[{k}] must be str, got {type(v).__name__}")
        arr[k] = v
    return arr


@dataclass(frozen=True)
class StepBatch:
    """All steps of one rollout batch, column-wise (numpy arrays of length ``S``).

    Plumbing is field-generic (OpenRLHF's ``fields(Experience)`` loops): :meth:`to_rows` /
    :meth:`from_rows` carry every column, so a new column is one field here (with its ``kind``) and,
    where a step record has an attribute of the same name, nothing else.

    Attributes:
        uid: ``[S]`` str, episode level. Task/group id: the N trajectories that played the same
            task (ALFWorld game, WebShop goal) from the same initial state share it.
        traj_id: ``[S]`` int64, episode level. Trajectory id, unique in the batch.
        step_index: ``[S]`` int64, step level. ``t``: 0 for the first step of a trajectory; the
            steps of one trajectory are exactly ``0..T_i-1``.
        reward: ``[S]`` float64, step level. ``r_{i,t}``: env reward of this step with the
            invalid-action penalty already subtracted (reward units: success = 10 by default).
        terminated: ``[S]`` bool, step level. The episode ended at this step inside the task
            (success or failure). At most one True per trajectory, on its last step.
        truncated: ``[S]`` bool, step level. The episode was cut by the step limit at this step
            (last step only). Never True together with ``terminated``.
        invalid: ``[S]`` bool, step level. The response had no parsable action or the env rejected it.
        anchor_obs: ``[S]`` str, step level. ``o_{i,t}``: raw env observation the policy saw at
            step t (no template, history or action list); GiGPO's anchor state.
        prefix_key: ``[S]`` str, step level. Hash of the exact policy context ``x_{i,t}`` (the
            full prompt); equal keys = history-consistent peers.
        action: ``[S]`` str, step level. ``a_{i,t}``: the action text sent to the env (the parsed
            action, or the raw response when unparsable). Used for history depth keys.
        state_extra: ``[S]`` str or None, step level. Extra state text appended to the anchor
            observation when a config asks for it (ALFWorld inventory; ``state_key =
            obs_inventory``). None when the env provides none.
        final_obs: ``[S]`` str or None, step level. On the last step of a *truncated* trajectory:
            the observation the env returned after that step (the state the trajectory was cut in);
            ignored on every other row (use ""). Lets ``potential_estimator = graph`` (E1) send a
            truncated step to its final observation's node. None when not recorded (the graph then
            leaves those transitions out of T).
    """

    uid: np.ndarray = field(metadata={"kind": "str"})
    traj_id: np.ndarray = field(metadata={"kind": "int"})
    step_index: np.ndarray = field(metadata={"kind": "int"})
    reward: np.ndarray = field(metadata={"kind": "float"})
    terminated: np.ndarray = field(metadata={"kind": "bool"})
    truncated: np.ndarray = field(metadata={"kind": "bool"})
    invalid: np.ndarray = field(metadata={"kind": "bool"})
    anchor_obs: np.ndarray = field(metadata={"kind": "str"})
    prefix_key: np.ndarray = field(metadata={"kind": "str"})
    action: np.ndarray = field(metadata={"kind": "str"})
    state_extra: np.ndarray | None = field(default=None, metadata={"kind": "str"})
    final_obs: np.ndarray | None = field(default=None, metadata={"kind": "str"})

    @classmethod
    def columns(cls) -> tuple[str, ...]:
        """The column names, in field order (every plumbing loop iterates over these)."""
        return tuple(f.name for f in fields(cls))

    @classmethod
    def optional_columns(cls) -> tuple[str, ...]:
        """The columns that may be None (``state_extra``, ``final_obs``)."""
        return tuple(f.name for f in fields(cls) if f.default is None)

    @classmethod
    def kind(cls, name: str) -> str:
        """Python kind of column ``name``: ``str``, ``int``, ``float`` or ``bool``."""
        return next(f.metadata["kind"] for f in fields(cls) if f.name == name)

    @classmethod
    def from_lists(cls, **columns: Sequence[Any] | None) -> StepBatch:
        """Build and validate a batch from per-step Python lists, one keyword per column (see the
        class attributes; ``state_extra`` / ``final_obs`` may be omitted or None).

        Raises:
            ValueError: an unknown or missing column, or the first column whose length, type or
                content is wrong (named).
        """
        unknown = sorted(set(columns) - set(cls.columns()))
        if unknown:
            raise ValueError(f"StepBatch has no columns {unknown}")
        missing = [n for n in cls.columns() if n not in cls.optional_columns() and columns.get(n) is None]
        if missing:
            raise ValueError(f"StepBatch.from_lists: missing columns {missing}")
        batch = cls(**{n: None if columns.get(n) is None else _column(cls.kind(n), columns[n], n)
                       for n in cls.columns()})
        batch.validate()
        return batch

    @classmethod
    def from_rows(cls, rows: Sequence[Mapping[str, Any]]) -> StepBatch:
        """Build and validate a batch from one mapping per step (``column -> value``), as
        :meth:`to_rows` writes them. An optional column whose values are all None or ``""`` becomes
        None (not recorded); otherwise its None values become ``""``.

        Raises:
            ValueError: a row lacking a required column, or as :meth:`from_lists`.
        """
        cols: dict[str, list[Any] | None] = {}
        for name in cls.columns():
            values = [r.get(name) for r in rows]
            if name in cls.optional_columns():
                cols[name] = None if all(v is None or v == "" for v in values) else [
                    "" if v is None else v for v in values]
            elif any(v is None for v in values):
                k = next(k for k, v in enumerate(values) if v is None)
                raise ValueError(f"StepBatch row {k} has no {name!r}")
            else:
                cols[name] = values
        return cls.from_lists(**cols)

    def to_rows(self) -> list[dict[str, Any]]:
        """``[S]`` mappings ``column -> Python value`` (None for a column that is None): :meth:`from_rows`'s input."""
        lists = {n: (None if getattr(self, n) is None else getattr(self, n).tolist()) for n in self.columns()}
        return [{n: (None if v is None else v[k]) for n, v in lists.items()} for k in range(self.num_steps)]

    @property
    def num_steps(self) -> int:
        """``S``, the number of steps (rows)."""
        return int(self.uid.shape[0])

    def validate(self) -> None:
        """Check lengths, finiteness and trajectory structure.

        Raises:
            ValueError: empty batch; a field of the wrong length; a non-finite reward; a
                trajectory whose step indices are not exactly 0..T-1, that spans two uids, or whose
                terminated/truncated flags are set on a step other than its last (or both).
        """
        s = self.num_steps
        if s == 0:
            raise ValueError("StepBatch is empty: an estimator needs at least one step")
        for name in self.columns():
            arr = getattr(self, name)
            if arr is None and name not in self.optional_columns():
                raise ValueError(f"StepBatch.{name} is required")
            if arr is not None and arr.shape != (s,):
                raise ValueError(f"StepBatch.{name} has shape {arr.shape}, expected ({s},)")
        self._check_dtypes()
        if not np.all(np.isfinite(self.reward)):
            bad = int(np.flatnonzero(~np.isfinite(self.reward))[0])
            raise ValueError(f"StepBatch.reward[{bad}] is not finite ({self.reward[bad]})")
        if np.any(self.terminated & self.truncated):
            raise ValueError("StepBatch: a step is both terminated and truncated")
        order = np.lexsort((self.step_index, self.traj_id))
        tid, t = self.traj_id[order], self.step_index[order]
        starts = np.flatnonzero(np.r_[True, tid[1:] != tid[:-1]])
        ends = np.r_[starts[1:], s]
        for a, b in zip(starts, ends):
            if not np.array_equal(t[a:b], np.arange(b - a)):
                raise ValueError(
                    f"StepBatch: trajectory {tid[a]} has step_index {t[a:b].tolist()}, expected 0..{b - a - 1}"
                )
            rows = order[a:b]
            if len(set(self.uid[rows].tolist())) != 1:
                raise ValueError(f"StepBatch: trajectory {tid[a]} spans several uids")
            ended = self.terminated[rows[:-1]] | self.truncated[rows[:-1]]
            if np.any(ended):
                raise ValueError(
                    f"StepBatch: trajectory {tid[a]} has terminated/truncated before its last step"
                )

    def _check_dtypes(self) -> None:
        """ValueError naming a column of the wrong dtype (a batch built with ``StepBatch(...)``
        directly skips ``from_lists``' conversions)."""
        for name in self.columns():
            arr, kind = getattr(self, name), self.kind(name)
            if arr is None:
                continue
            if kind == "str":
                if arr.dtype != object or not all(isinstance(v, str) for v in arr.tolist()):
                    raise ValueError(f"StepBatch.{name} must be an object array of str (use StepBatch.from_lists)")
            elif arr.dtype.kind not in _NUMPY_KINDS[kind]:
                raise ValueError(f"StepBatch.{name} has dtype {arr.dtype}, expected kind {_NUMPY_KINDS[kind]!r}")
