"""The run's progress bar: one tqdm bar over the iterations, moving through each iteration's stages.

The bar counts iterations (``n`` is fractional inside an iteration) and shows the current stage
(``rollout``, ``advantages``, ``update``, ``checkpoint``) with its own progress where it is known
(rollout: env steps done out of ``episodes * max_steps``; an episode that ends early counts its
unplayed steps as done). Inside an iteration each stage moves the bar by its share of the
iteration's time, taken from the previous iteration's measured split (a fixed guess for the first),
so tqdm's rate and ETA are in iterations of wall time. Lines printed with :func:`write` appear
above the bar instead of tearing it. On a non-terminal stream (a log file) the bar redraws when a
stage starts and otherwise at most every 30 s (the update counts micro-batches, so a long update
moves the bar too).
"""

from __future__ import annotations

import sys
from typing import Any

STAGES = ("rollout", "advantages", "update", "checkpoint")
DEFAULT_SHARES = {"rollout": 0.6, "advantages": 0.05, "update": 0.3, "checkpoint": 0.05}
"""Stage shares of an iteration's time before one has been measured (SmolLM2 on CPU, roughly)."""


def write(line: str) -> None:
    """Print ``line`` to stdout above any active progress bar (plain print when there is none)."""
    from tqdm.auto import tqdm

    tqdm.write(line, file=sys.stdout)
    sys.stdout.flush()


class TqdmWriter:
    """A text stream whose lines go through :func:`write` (above any active progress bar)."""

    def __init__(self) -> None:
        self._buf = ""

    def write(self, text: str) -> int:
        self._buf += text
        *lines, self._buf = self._buf.split("\n")
        for line in lines:
            write(line)
        return len(text)

    def flush(self) -> None:
        if self._buf:
            write(self._buf)
            self._buf = ""


class RunProgress:
    """Progress of a training run (a no-op object when ``enabled`` is False).

    Args:
        total: iterations of the run. start: iterations already done (resume).
        enabled: draw the bar. file: stream (default stderr).

    Raises:
        ValueError: ``total < 1`` or ``start`` outside ``[0, total]``.
    """

    def __init__(self, total: int, start: int = 0, *, enabled: bool = True, file: Any = None) -> None:
        if total < 1 or not 0 <= start <= total:
            raise ValueError(f"progress needs total >= 1 and 0 <= start <= total, got total={total}, start={start}")
        self.total, self.start = total, start
        self.shares = dict(DEFAULT_SHARES)
        self.iteration = start
        self.stage_name = ""
        self._done_share = 0.0  # shares of the stages finished in this iteration
        self._units = 0.0
        self._stage_total = 0.0
        self.bar = None
        self._tty = False
        if enabled:
            from tqdm.auto import tqdm

            stream = file if file is not None else sys.stderr
            tty = self._tty = bool(getattr(stream, "isatty", lambda: False)())
            self.bar = tqdm(total=total, initial=start, unit="iter", file=stream, dynamic_ncols=True,
                            mininterval=0.5 if tty else 30.0, smoothing=0.5,
                            bar_format="{desc} {percentage:3.0f}%|{bar}| {n:.2f}/{total} iter "
                                       "[{elapsed}<{remaining}{postfix}]")

    @property
    def position(self) -> float:
        """Fractional iterations done (what the bar shows)."""
        frac = self._units / self._stage_total if self._stage_total > 0 else 0.0
        inside = self._done_share + self.shares.get(self.stage_name, 0.0) * min(frac, 1.0)
        return (self.iteration - 1) + min(inside, 1.0) if self.iteration > self.start else float(self.start)

    def _redraw(self) -> None:
        if self.bar is None:
            return
        self.bar.set_description_str(self._desc(), refresh=False)
        delta = self.position - self.bar.n
        if delta > 0:
            self.bar.update(delta)  # redraws at most every mininterval
        elif self._tty:
            self.bar.refresh()

    def _desc(self) -> str:
        desc = f"iter {self.iteration}/{self.total} {self.stage_name}"
        if self._stage_total > 0:
            desc += f" {int(self._units)}/{int(self._stage_total)}"
        return desc

    def begin_iteration(self, it: int) -> None:
        """Iteration ``it`` (1-based) starts."""
        self.iteration, self._done_share = it, 0.0
        self.stage_name, self._units, self._stage_total = "", 0.0, 0.0

    def stage(self, name: str, total_units: float = 0) -> None:
        """Stage ``name`` starts; ``total_units`` > 0 gives it a countable size (see ``advance``).

        Raises:
            ValueError: an unknown stage name.
        """
        if name not in STAGES:
            raise ValueError(f"unknown stage {name!r}; stages are {STAGES}")
        if self.stage_name:
            self._done_share += self.shares.get(self.stage_name, 0.0)
        self.stage_name, self._units, self._stage_total = name, 0.0, float(total_units)
        self._redraw()
        if self.bar is not None:
            self.bar.refresh()  # a stage start is always shown, also in a log file (mininterval 30 s)

    def advance(self, units: float = 1) -> None:
        """``units`` of the current stage are done."""
        self._units += units
        self._redraw()

    def end_iteration(self, seconds: dict[str, float], postfix: dict[str, str] | None = None) -> None:
        """The iteration is done; ``seconds`` (stage -> wall time) become the next shares."""
        total = sum(max(seconds.get(s, 0.0), 0.0) for s in STAGES)
        if total > 0:
            self.shares = {s: max(seconds.get(s, 0.0), 0.0) / total for s in STAGES}
        self.stage_name, self._units, self._stage_total = "", 0.0, 0.0
        self._done_share = 1.0
        if self.bar is not None:
            if postfix:
                self.bar.set_postfix(postfix, refresh=False)
            self.bar.set_description_str(f"iter {self.iteration}/{self.total} done", refresh=False)
            self.bar.update(self.iteration - self.bar.n)

    def close(self) -> None:
        """Close the bar (leaves its last state on screen)."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
