"""``python -m benchmarks roofline``: generation and update throughput of the main job's batch against
this machine's bound, measured in the same run.

1. **Machine** (in this process, with torch's threads): the matmul rate (best of a few fp32 and bf16
   GEMMs, 2048 x 2048 x 2048) and the memory bandwidth (a 256 MiB fp32 copy, bytes read + written),
   each call timed by its CPU time over the threads like the phases below.
2. **Batch**: the main job's rollout (``examples/scripts/run_local.sh``: WebShop, SmolLM2-135M-Instruct,
   2 tasks x 4 rollouts, at most 6 steps, history window 2, answers of at most 64 tokens, context guard
   512 tokens),
   played once with the local backend's own generator; then one update (behaviour and reference
   log-probs, one PPO epoch, one optimizer step per ``--train.batch_size`` samples) on those step
   samples. The update gets fixed advantages (+1 / -1 alternating): its cost does not depend on their
   values, and the base model's batches usually carry none. The base model (not the main job's
   behaviour-cloned one) plays the rollout: its answers run to the 64-token limit, so the batch is at
   least as large as the main job's.
3. **Work** (useful FLOPs, padding not counted; dimension names: ``p`` prompt tokens, ``r`` response
   tokens of a step, ``L`` layers, ``d_attn`` query width, ``d`` hidden size, ``V`` vocabulary,
   ``N_lin`` weights of the linear layers under the output head):

   * forward of ``n`` tokens: ``2 N_lin n`` (Kaplan et al. 2020, arXiv 2001.08361, table 1) plus
     attention ``2 L d_attn n^2`` for a causal ``n``-token prefix (scores and values), plus ``2 d V``
     per position whose logits are computed;
   * generation: the prefill of the prompt tokens the generator computed (a prefix shared by several
     prompts once; each token's attention over the real tokens before it; the logits of one position
     per row of each prefill pass: :func:`prefill_work`) and per step ``r - 1`` decode positions (one
     token each, logits every time, attention over ``p + j``);
   * update: the behaviour and (with a KL term) reference log-probs are a forward of ``p + r`` tokens
     with logits on the ``r`` response positions; training is forward + backward = 3 forwards with
     every weight trained, 2 with LoRA (no weight gradient for frozen weights; the adapter is small).

   The bound of a phase is ``max(FLOPs / matmul rate, bytes / bandwidth)``, per decode pass (each reads
   every weight once; the KV cache is counted too), at the precision its matmuls run in: bf16 under
   ``--ds.mixed_precision`` bf16 (autocast: the bf16 GEMM rate, weights read and KV cache held in bf16)
   or ``--ds.param_dtype bf16``, fp32 otherwise. Prefill and the update are compute-bound at these
   sizes; decode passes of a few rows are bandwidth-bound. The CPU's bf16 capability (its flags, as
   ``progpo.run.precision`` reads them) and the precision chosen are printed first.

Prints one table (work, wall time, time, rate, bound, time over bound) and the peak resident memory of
the update (sampled every 20 ms). ``time`` is the CPU time of this process divided by torch's threads:
its wall time on an idle machine, and a figure that other jobs sharing the cores change little (the wall
time is printed beside it). ``--compare`` measures the rollout with identical prompts prefilled once and
then with the prefix that different prompts share prefilled once too (prefix reuse; it checks that both
rollouts sampled the same tokens), and the update with every behaviour log-prob recomputed and then with those of the first
optimizer step taken from its own forward pass: before / after of the steps taken toward the bound.
``--ds.lora.rank R`` measures the update with a LoRA adapter.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from benchmarks import cli
from benchmarks.train import train_config, train_section
from progpo.bounds import number
from progpo.run.precision import bf16_capability
from progpo.run.settings import EnvSettings, RolloutSettings, TrainSettings
from progpo.trainer.config import TrainConfig
from progpo.trainer.settings import ActorSettings, DeepSpeedSettings


@dataclass(frozen=True)
class MachineBound:
    """Measured peak rates of this machine.

    Attributes:
        fp32_flops, bf16_flops: best GEMM rate (FLOP/s) of a 2048^3 matmul in that dtype.
        bandwidth: bytes/s of a large copy (read + write counted).
    """

    fp32_flops: float
    bf16_flops: float
    bandwidth: float

    def flops(self, dtype: torch.dtype) -> float:
        """The matmul rate of ``dtype`` (bf16 for bf16, else fp32)."""
        return self.bf16_flops if dtype == torch.bfloat16 else self.fp32_flops


def _best_rate(fn, work: float, seconds: float) -> float:
    """``work / time`` of ``fn()``'s fastest call within ``seconds`` of wall time (after one warm-up call);
    ``time`` is the call's CPU time over torch's threads, as the phases are timed (see :func:`_row`)."""
    fn()
    best = float("inf")
    end = time.perf_counter() + seconds
    threads = torch.get_num_threads()
    while True:
        c0 = time.process_time()
        fn()
        best = min(best, (time.process_time() - c0) / threads)
        if time.perf_counter() > end:
            return work / best


def measure_machine(seconds: float = 2.0) -> MachineBound:
    """Matmul rates (fp32, bf16) and copy bandwidth of this process (see :class:`MachineBound`)."""
    n = 2048
    rates = {}
    for dtype in (torch.float32, torch.bfloat16):
        a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
        rates[dtype] = _best_rate(lambda: torch.mm(a, b), 2.0 * n ** 3, seconds)
    x = torch.ones(64 * 2 ** 20, dtype=torch.float32)
    y = torch.empty_like(x)
    bandwidth = _best_rate(lambda: y.copy_(x), 2.0 * x.numel() * x.element_size(), seconds)
    return MachineBound(rates[torch.float32], rates[torch.bfloat16], bandwidth)


@dataclass(frozen=True)
class ModelShape:
    """What the FLOP model needs of a causal LM.

    Attributes:
        linear: ``N_lin``, weights of every linear layer but the output head.
        layers, d_attn, kv_dim, hidden, vocab: ``L``, query width, key/value width, ``d``, ``V``.
        weight_bytes: bytes of every parameter (read once per decode pass).
        dtype: parameter dtype.
    """

    linear: int
    layers: int
    d_attn: int
    kv_dim: int
    hidden: int
    vocab: int
    weight_bytes: int
    dtype: torch.dtype

    @classmethod
    def of(cls, model) -> ModelShape:
        """Read the shape from a Hugging Face causal LM (a peft wrapper is looked through)."""
        from progpo.run.lora import base_model

        base = base_model(model)
        head = base.get_output_embeddings()
        linear = sum(m.weight.numel() for m in base.modules()
                     if isinstance(m, torch.nn.Linear) and m is not head)  # a LoRA adapter's A and B are counted too
        c = base.config
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        params = {id(p): p for p in base.parameters()}
        return cls(linear=int(linear), layers=c.num_hidden_layers, d_attn=c.num_attention_heads * head_dim,
                   kv_dim=getattr(c, "num_key_value_heads", c.num_attention_heads) * head_dim, hidden=c.hidden_size,
                   vocab=c.vocab_size, weight_bytes=sum(p.numel() * p.element_size() for p in params.values()),
                   dtype=next(iter(params.values())).dtype)

    def forward(self, tokens: float, causal_sq: float, logit_rows: float) -> float:
        """FLOPs of a forward pass: ``2 N_lin tokens + 2 L d_attn causal_sq + 2 d V logit_rows``
        (``causal_sq``: sum over sequences of ``n^2``, or over decoded tokens of ``2 * context``)."""
        return 2.0 * self.linear * tokens + 2.0 * self.layers * self.d_attn * causal_sq + 2.0 * self.hidden * self.vocab * logit_rows


def generation_work(shape: ModelShape, steps: list[tuple[tuple[int, ...], int]],
                    compute_dtype: torch.dtype | None = None) -> dict[str, float]:
    """Useful FLOPs of generating every ``(prompt ids, r)`` step: the prefill of each distinct prompt once
    (the N rollouts of a task start from one prompt) and every decode position (see module docstring);
    ``decode_kv_bytes`` counts the KV cache in ``compute_dtype`` (None: the weights' dtype)."""
    distinct = np.array([len(q) for q in {prompt for prompt, _ in steps}], dtype=np.float64)
    p = np.array([len(s[0]) for s in steps], dtype=np.float64)
    r = np.array([s[1] for s in steps], dtype=np.float64)
    prefill = shape.forward(distinct.sum(), (distinct ** 2).sum(), len(distinct))
    dec = np.maximum(r - 1, 0)
    ctx2 = (2 * (dec * p + dec * (dec + 1) / 2)).sum()  # sum over decoded tokens j=1..r-1 of 2 (p + j)
    decode = shape.forward(dec.sum(), ctx2, dec.sum())
    kv_bytes = 2.0 * shape.layers * shape.kv_dim * (ctx2 / 2) * torch.finfo(compute_dtype or shape.dtype).bits / 8
    return {"prefill_flops": prefill, "decode_flops": decode, "decode_kv_bytes": kv_bytes,
            "decode_tokens": float(dec.sum()), "prompt_tokens": float(p.sum()), "distinct_prompt_tokens": float(distinct.sum())}


def prefill_work(shape: ModelShape, stats: dict) -> float:
    """FLOPs of the prefills an ``HFGenerator`` computed, from its ``stats`` counters: its real prompt tokens
    (``prompt_tokens``; a shared prefix once), ``prefill_causal_sq`` (sum over them of twice the real
    tokens each attends to) and the rows whose logits were computed (``prefill_logit_rows``)."""
    return shape.forward(stats["prompt_tokens"], stats["prefill_causal_sq"], stats["prefill_logit_rows"])


def same_samples(a: list, b: list) -> tuple[int, int]:
    """``(steps with the same prompt and response tokens, steps)`` of two rollouts' step lists, in order."""
    same = sum(list(x.prompt_ids) == list(y.prompt_ids) and list(x.response_ids) == list(y.response_ids)
               for x, y in zip(a, b))
    return same, max(len(a), len(b))


def update_work(shape: ModelShape, samples: list[tuple[int, int]], *, logprob_passes: int, train_forwards: float) -> dict[str, float]:
    """Useful FLOPs of the update on ``(p, r)`` samples: ``logprob_passes`` forwards (behaviour,
    reference) and one training pass of ``train_forwards`` forwards (3 full, 2 LoRA)."""
    n = np.array([p + r for p, r in samples], dtype=np.float64)
    r = np.array([r for _, r in samples], dtype=np.float64)
    fwd = shape.forward(n.sum(), (n ** 2).sum(), r.sum())
    return {"logprobs_flops": logprob_passes * fwd, "train_flops": train_forwards * fwd}


class PeakRSS:
    """Peak resident memory of this process while the context is open (sampled every 20 ms), in bytes."""

    def __enter__(self) -> PeakRSS:
        import psutil

        self._proc = psutil.Process()
        self.start = self.peak = self._proc.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def _poll(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self._proc.memory_info().rss)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._proc.memory_info().rss)


def _cpu_s() -> float:
    """CPU seconds of this process, all threads (user + system)."""
    return time.process_time()


def _row(name: str, flops: float, wall_s: float, cpu_s: float, bound_s: float) -> str:
    """One table row; ``time`` is the CPU time over the threads (the wall time of an idle machine)."""
    threads = torch.get_num_threads()
    t = cpu_s / threads
    rate = flops / t / 1e9 if t > 0 else float("nan")
    return (f"{name:<34} {flops / 1e9:>8.1f} {wall_s:>8.1f} {t:>8.1f} {rate:>8.1f} {bound_s:>8.1f} "
            f"{t / bound_s if bound_s > 0 else float('nan'):>7.2f}x")


HEADER = (f"{'phase':<34} {'GFLOP':>8} {'wall_s':>8} {'time_s':>8} {'GFLOP/s':>8} {'bound_s':>8} {'time/bound':>8}")


@dataclass(frozen=True)
class RooflineBench:
    """The flags of ``python -m benchmarks roofline``: ``train``'s own settings, whose defaults here are the main job's
    batch (``examples/scripts/run_local.sh``; a test holds them to it)."""

    actor: ActorSettings = field(default_factory=lambda: train_section("actor"),
                                 metadata={"flags": ("model_name_or_path",)})
    rollout: RolloutSettings = field(
        default_factory=lambda: train_section("rollout", batch_size=2, n_samples_per_prompt=4, max_new_tokens=64,
                                              max_prompt_tokens=512),
        metadata={"flags": ("batch_size", "n_samples_per_prompt", "max_new_tokens", "max_prompt_tokens")})
    env: EnvSettings = field(default_factory=lambda: train_section("env", name="webshop", max_steps=6, history_length=2),
                             metadata={"flags": ("max_steps", "history_length")})
    train: TrainSettings = field(default_factory=lambda: train_section("train", micro_batch_size=2, batch_size=16),
                                 metadata={"flags": ("micro_batch_size", "batch_size")})
    ds: DeepSpeedSettings = field(default_factory=lambda: train_section("ds"),
                                  metadata={"flags": ("lora", "param_dtype", "mixed_precision"),
                                            "skip": ("lora.target_modules", "lora.dropout")})
    machine_seconds: float = number(2.0, "> 0")
    """time per machine measurement"""
    compare: bool = False
    """measure each phase both ways: rollout with identical prompts prefilled once, then with shared prefixes prefilled once too (same seed: the same tokens); update with the behaviour log-probs recomputed for every sample, then deferred (the same tasks and samples)"""

    def __post_init__(self) -> None:
        self.train_config(None)  # train's own checks of these settings, before the machine is measured

    def train_config(self, ckpt_path: str | None) -> TrainConfig:
        """``train``'s config of the measured run (WebShop)."""
        return train_config(ckpt_path, actor=self.actor, rollout=self.rollout, env=self.env, train=self.train,
                            ds=self.ds)


def build_parser() -> argparse.ArgumentParser:
    """The benchmark's flags (:class:`RooflineBench`)."""
    first = " ".join(__doc__.split("\n\n")[0].split())
    return cli.settings_parser(RooflineBench, "python -m benchmarks roofline", f"{first} The defaults are the main job's "
                               "batch (examples/scripts/run_local.sh).")


def parse(argv: list[str] | None = None) -> RooflineBench:
    """``argv`` as the benchmark's settings; exit 2 naming the flag on a bad value."""
    return cli.parse(RooflineBench, build_parser(), argv)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its table (exit code 0; 2 on a bad flag, before any measurement)."""
    args = parse(argv)

    from progpo.run.env_setup import open_env_pool
    from progpo.run.process import setup_logging
    from progpo.trainer.loop import Trainer
    from progpo.trainer.update import TrainSample, ppo_update, prepare, rollout_mismatch

    setup_logging("WARNING")
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # unwind: stop the WebShop server
    load0 = os.getloadavg()
    machine = measure_machine(args.machine_seconds)
    with tempfile.TemporaryDirectory(prefix="progpo-bench-roofline-") as tmp:
        cfg = args.train_config(tmp)
        trainer = Trainer(cfg)
        loop = asyncio.new_event_loop()
        rollouts, updates = [], []
        with open_env_pool(cfg.env, cfg.rollout.batch_size * cfg.rollout.n_samples_per_prompt) as envs:
            trainer.envs = envs
            trainer._build(envs)
            for reuse in (False, True) if args.compare else (True,):
                trainer.generator.reuse_prefix = reuse
                trainer.sampler = type(trainer.sampler)(trainer.sampler.num_tasks, cfg.train.seed)  # same tasks
                stats0 = dict(trainer.generator.stats)
                t0 = time.perf_counter()
                roll = trainer.rollout(1, loop)
                wall = time.perf_counter() - t0
                rollouts.append((reuse, {k: trainer.generator.stats[k] - stats0[k] for k in stats0}, wall,
                                 [s for ep in roll.episodes for s in ep.steps]))
            steps = rollouts[-1][3]
            samples = [TrainSample(list(s.prompt_ids), list(s.response_ids), 1.0 if k % 2 else -1.0,
                                   rollout_logprobs=torch.tensor(s.logprobs, dtype=torch.float32))
                       for k, s in enumerate(steps) if s.response_ids]
            actor, ucfg = trainer.actor, trainer.update_cfg
            for defer in (False, True) if args.compare else (True,):
                with PeakRSS() as mem:
                    t1, c1 = time.perf_counter(), _cpu_s()
                    prepared = prepare(actor, samples, ucfg, defer_behaviour=defer, policy_is_reference=False)
                    t2, c2 = time.perf_counter(), _cpu_s()
                    m = ppo_update(actor, prepared, ucfg, np.random.default_rng(0))
                    t3, c3 = time.perf_counter(), _cpu_s()
                lp_share = m["perf/logprobs_s"] / max(t3 - t2, 1e-9)  # the up-front behaviour pass inside it
                updates.append((defer, t2 - t1 + m["perf/logprobs_s"], c2 - c1 + lp_share * (c3 - c2),
                                t3 - t2 - m["perf/logprobs_s"], (1 - lp_share) * (c3 - c2), mem))
                mismatch = rollout_mismatch(prepared)  # the behaviour log-probs of the first update vs the generator's
        loop.close()
    shape = ModelShape.of(actor.model)
    compute = torch.bfloat16 if actor.precision.autocast else shape.dtype  # the dtype the matmuls run in
    peak = machine.flops(compute)
    weight_bytes = shape.weight_bytes * torch.finfo(compute).bits / torch.finfo(shape.dtype).bits  # read per decode pass
    cap = bf16_capability(actor.precision.device)
    print(f"roofline | model {cfg.actor.model_name_or_path} ({shape.dtype}, {shape.weight_bytes / 2**20:.0f} MiB weights, N_lin "
          f"{shape.linear / 1e6:.1f}M, V {shape.vocab}) | LoRA rank {cfg.ds.lora.rank} | load average "
          f"{load0[0]:.1f} -> {os.getloadavg()[0]:.1f} | torch threads {torch.get_num_threads()}")
    print(f"machine: matmul fp32 {machine.fp32_flops / 1e9:.1f} GFLOP/s, bf16 {machine.bf16_flops / 1e9:.1f} GFLOP/s "
          f"({machine.bf16_flops / machine.fp32_flops:.2f}x fp32); copy bandwidth {machine.bandwidth / 1e9:.1f} GB/s "
          f"(best of {args.machine_seconds:g} s each)")
    print(f"bf16: {'native' if cap.native else 'emulated'} ({cap.detail}); precision {actor.precision.name} "
          f"({actor.precision.reason}); bounds at the {str(compute).removeprefix('torch.')} matmul rate")
    print("time_s = CPU seconds of this process / torch threads (its wall time on an idle machine); bound_s = "
          "max(FLOPs / matmul rate, bytes / bandwidth)")
    print(HEADER)
    for reuse, gen, wall, steps_r in rollouts:
        g = generation_work(shape, [(tuple(s.prompt_ids), len(s.response_ids)) for s in steps_r], compute)
        prefill_flops = prefill_work(shape, gen)
        prefill_bound = prefill_flops / peak
        decode_bound = max(g["decode_flops"] / peak,
                           (gen["decode_steps"] * weight_bytes + g["decode_kv_bytes"]) / machine.bandwidth)
        tag = "shared prefixes prefilled once" if reuse else "identical prompts prefilled once"
        print(f"-- generation, {tag}: {len(steps_r)} steps, prompt {g['prompt_tokens'] / len(steps_r):.0f} tokens "
              f"({g['distinct_prompt_tokens'] / g['prompt_tokens']:.2f} distinct), response "
              f"{np.mean([len(s.response_ids) for s in steps_r]):.1f} tokens (means); {int(gen['calls'])} generate "
              f"calls, {int(gen['prefill_rows'])} prefill rows, {int(gen['decode_steps'])} decode passes; rollout wall "
              f"{wall:.1f} s")
        print(f"   prefill: {int(gen['prompt_tokens'])} prompt tokens computed ({gen['prompt_tokens'] / g['prompt_tokens']:.2f}"
              f" of all, {gen['prompt_tokens'] / g['distinct_prompt_tokens']:.2f} of the distinct prompts') in "
              f"{int(gen['prefill_passes'])} passes of {int(gen['prefill_tokens'])} padded tokens")
        if reuse and len(rollouts) == 2:
            same, total = same_samples(rollouts[0][3], steps_r)
            before = prefill_work(shape, rollouts[0][1])
            print(f"   same samples as without prefix reuse: {same} of {total} steps (prompt and response tokens); "
                  f"prefill {before / 1e9:.1f} -> {prefill_flops / 1e9:.1f} GFLOP ({1 - prefill_flops / before:.0%} saved), "
                  f"time {rollouts[0][1]['prefill_cpu_s'] / torch.get_num_threads():.1f} -> "
                  f"{gen['prefill_cpu_s'] / torch.get_num_threads():.1f} s")
        print(_row("generate: prefill", prefill_flops, gen["prefill_s"], gen["prefill_cpu_s"], prefill_bound))
        print(_row("generate: decode", g["decode_flops"], gen["seconds"] - gen["prefill_s"], gen["decode_cpu_s"],
                   decode_bound))
        print(_row("generate (total)", prefill_flops + g["decode_flops"], gen["seconds"],
                   gen["prefill_cpu_s"] + gen["decode_cpu_s"], prefill_bound + decode_bound))
    pairs = [(len(s.prompt_ids), len(s.response_ids)) for s in samples]
    later = max(len(samples) - cfg.train.batch_size, 0) / max(len(samples), 1)
    for defer, lp_wall, lp_cpu, tr_wall, tr_cpu, mem in updates:
        passes = (later if defer else 1.0) + float(ucfg.kl.init_coef > 0)
        u = update_work(shape, pairs, logprob_passes=passes, train_forwards=2.0 if cfg.ds.lora.rank > 0 else 3.0)
        lp_bound, tr_bound = u["logprobs_flops"] / peak, u["train_flops"] / peak
        tag = ("behaviour log-probs of the first step from its own forward" if defer else
               "behaviour log-probs recomputed for every sample")
        print(f"-- update, {tag}: {len(samples)} samples, {cfg.train.batch_size} per optimizer step, micro-batch "
              f"{cfg.train.micro_batch_size}; peak RSS {mem.peak / 2**30:.2f} GiB ({(mem.peak - mem.start) / 2**30:+.2f} GiB "
              "during it)")
        print(_row(f"update: log-probs ({passes:.2f} fwd)", u["logprobs_flops"], lp_wall, lp_cpu, lp_bound))
        print(_row("update: train step", u["train_flops"], tr_wall, tr_cpu, tr_bound))
        print(_row("update (total)", u["logprobs_flops"] + u["train_flops"], lp_wall + tr_wall, lp_cpu + tr_cpu,
                   lp_bound + tr_bound))
    if mismatch:
        print(f"generator vs trainer log-probs of the same {sum(len(s.response_ids) for s in samples)} tokens (first "
              f"update, {actor.precision.name}): |ratio - 1| median {mismatch['rollout/ratio_dev_p50']:.2e}, p99 "
              f"{mismatch['rollout/ratio_dev_p99']:.2e}, max {mismatch['rollout/ratio_dev_max']:.2e}; "
              f"mismatch KL {mismatch['rollout/mismatch_kl']:+.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
