"""``python tests/trainer/kill_during_save.py STAGE ITERATION -- TRAIN_FLAGS...``: ``python -m progpo.cli.train``
that SIGKILLs itself at one point of a write (run by ``test_interrupted_write.py``).

STAGE is a stage of :meth:`progpo.run.checkpoint.CheckpointManager.save` (``partial``, ``written``,
``published``, ``marked``, ``rotating``; see ``CheckpointManager.on_stage``) reached while saving iteration
ITERATION, or ``metrics``: half of iteration ITERATION's ``metrics.jsonl`` line is written, then the kill.
"""

from __future__ import annotations

import os
import signal
import sys


def main() -> int:
    stage, iteration, sep, *flags = sys.argv[1:]
    if sep != "--":
        raise SystemExit("usage: kill_during_save.py STAGE ITERATION -- TRAIN_FLAGS...")
    at = int(iteration)
    from progpo.cli.train import main as train
    from progpo.run import metrics
    from progpo.run.checkpoint import CheckpointManager

    def kill() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    if stage == "metrics":
        append = metrics.append_line

        def torn(path, line):
            if f'"iteration": {at},' not in line:
                return append(path, line)
            with open(path, "a") as f:
                f.write(line[: len(line) // 2])
            kill()

        metrics.append_line = torn
    else:
        CheckpointManager.on_stage = staticmethod(lambda s, it: kill() if (s, it) == (stage, at) else None)
    return train(flags)


if __name__ == "__main__":
    sys.exit(main())
