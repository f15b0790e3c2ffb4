"""The order in which a run draws its training tasks: seeded, epoch-wise random, resumable.

Used by the local trainer (:mod:`progpo.trainer.loop`) and the behaviour-cloning warm start
(:mod:`progpo.trainer.warm_start`), so both draw the same tasks of the same range in the same order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class TaskSampler:
    """Tasks of one split in seeded epoch-wise random order (every task once per epoch).

    Draws from task indices ``offset .. offset + count - 1`` of the split (``--env.task_offset``,
    ``--env.num_tasks``; default the whole split).

    Attributes:
        num_tasks: tasks in the split. seed: run seed. offset, count: the task range drawn from
            (count None: ``num_tasks - offset``). epoch, pos: where the next draw starts.

    Raises:
        ValueError: the range does not fit in the split (names ``--env.task_offset`` / ``--env.num_tasks``).
    """

    num_tasks: int
    seed: int
    offset: int = 0
    count: int | None = None
    epoch: int = 0
    pos: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.offset < self.num_tasks:
            raise ValueError(f"--env.task_offset must be in [0, {self.num_tasks}) (tasks in the split), got {self.offset}")
        if self.count is None:
            self.count = self.num_tasks - self.offset
        if not 1 <= self.count <= self.num_tasks - self.offset:
            raise ValueError(f"--env.num_tasks must be in [1, {self.num_tasks - self.offset}] (tasks in the split after "
                             f"--env.task_offset {self.offset}), got {self.count}")

    def _perm(self) -> np.ndarray:
        return self.offset + np.random.default_rng([self.seed, self.epoch]).permutation(self.count)

    def next(self, k: int) -> list[int]:
        """The next ``k`` task indices (crossing into the next epoch's permutation when needed)."""
        out: list[int] = []
        while len(out) < k:
            perm = self._perm()
            take = perm[self.pos:self.pos + k - len(out)].tolist()
            out.extend(int(i) for i in take)
            self.pos += len(take)
            if self.pos >= self.count:
                self.epoch, self.pos = self.epoch + 1, 0
        return out

    def state_dict(self) -> dict[str, int]:
        """Position in the task order (saved in checkpoints)."""
        return {"num_tasks": self.num_tasks, "seed": self.seed, "offset": self.offset, "count": self.count,
                "epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Restore ``state_dict``; ValueError if the split size, task range or seed changed."""
        saved = (state["num_tasks"], state["seed"], state.get("offset", 0), state.get("count", state["num_tasks"]))
        if saved != (self.num_tasks, self.seed, self.offset, self.count):
            raise ValueError(f"checkpoint task order was for {saved[0]} tasks / seed {saved[1]} / tasks {saved[2]}.."
                             f"{saved[2] + saved[3] - 1}, this run has {self.num_tasks} / {self.seed} / {self.offset}.."
                             f"{self.offset + self.count - 1} (--env.train_split, --env.num_tasks, --env.task_offset "
                             "or --train.seed changed?)")
        self.epoch, self.pos = int(state["epoch"]), int(state["pos"])
