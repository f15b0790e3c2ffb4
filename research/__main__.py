"""``python -m research NAME [ARGS...]``: run one credit-assignment lab command and print its report."""

from __future__ import annotations

from benchmarks.cli import dispatch

COMMANDS: dict[str, tuple[str, str]] = {
    "fidelity": ("research.fidelity", "credit-assignment fidelity vs exact truth (synthetic families, ALFWorld)"),
    "learning": ("research.learning", "learning speed per estimator (lr sweep, censored stats, on-policy fidelity)"),
    "learning-lm": ("research.learning_lm", "the same with a transformer policy trained by the product's trainer"),
    "kinds": ("research.kind_trace", "each estimator's advantage against the exact one, per kind of step"),
    "clone": ("research.clone_probe", "a warm-started policy's agreement with the expert, per kind of decision"),
    "results": ("research.results", "assemble docs/results.md from the generated blocks (--write) or check it (--check)"),
}


def main(argv: list[str] | None = None) -> int:
    """Dispatch to the named lab command; exit code 2 with the list of names on a bad name."""
    return dispatch("research", COMMANDS, argv)


if __name__ == "__main__":
    raise SystemExit(main())
