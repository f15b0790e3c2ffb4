"""``python -m progpo.cli.bench NAME [ARGS...]``: run one benchmark and print its table.

Each benchmark module exposes ``main(argv: list[str]) -> int``; ``--help`` after NAME lists its own flags.
"""

from __future__ import annotations

import importlib
import sys

BENCHMARKS: dict[str, tuple[str, str]] = {
    "advantages": ("progpo.bench.advantages", "estimator speed on a realistic 6,400-step batch"),
    "fidelity": ("progpo.lab.fidelity", "credit-assignment fidelity vs exact truth (synthetic families, ALFWorld)"),
    "learning": ("progpo.lab.learning", "learning speed per estimator (lr sweep, censored stats, on-policy fidelity)"),
    "learning-lm": ("progpo.lab.learning_lm", "the same with a transformer policy trained by the product's trainer"),
    "kinds": ("progpo.lab.kind_trace", "each estimator's advantage against the exact one, per kind of step"),
    "clone": ("progpo.lab.clone_probe", "a warm-started policy's agreement with the expert, per kind of decision"),
    "alfworld": ("progpo.bench.alfworld", "ALFWorld reset/step latency, Ray pool throughput"),
    "webshop": ("progpo.bench.webshop", "WebShop server start time, RSS, step latency"),
    "train": ("progpo.bench.train", "one training iteration's time split per estimator"),
    "roofline": ("progpo.bench.roofline", "main job's generation and update throughput vs this machine's bound"),
}


def main(argv: list[str] | None = None) -> int:
    """Dispatch to the named benchmark; exit code 2 with the list of names on a bad name."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in BENCHMARKS:
        lines = [f"  {name:<12} {desc}" for name, (_, desc) in BENCHMARKS.items()]
        msg = "usage: python -m progpo.cli.bench NAME [ARGS...]\n\nbenchmarks:\n" + "\n".join(lines)
        if argv and argv[0] not in ("-h", "--help"):
            sys.stderr.write(f"unknown benchmark {argv[0]!r}\n{msg}\n")
            return 2
        sys.stdout.write(msg + "\n")
        return 0
    module = importlib.import_module(BENCHMARKS[argv[0]][0])
    return int(module.main(argv[1:]) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
