"""Fixtures for the trainer tests: the tiny model, one shared WebShop server, finished e2e runs.

End-to-end runs are session-scoped and shared by the tests that inspect them (the expensive part is
the run, not the checks), so each (env, estimator) pair trains once per session.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from progpo_tests.patience import PATIENCE_S

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

E2E_FLAGS = [
    "--actor.model_name_or_path", "tiny", "--rollout.batch_size", "4", "--rollout.n_samples_per_prompt", "4",
    "--env.max_steps", "5", "--train.num_iterations", "2", "--rollout.max_new_tokens", "16",
    "--train.batch_size", "40", "--train.micro_batch_size", "8", "--actor.adam.lr", "1e-3",
    "--logger.progress_bar", "false", "--train.seed", "7",
]


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """The tiny random Qwen2 (built once into the model cache)."""
    from progpo.run.tiny_model import tiny_model_path

    return tiny_model_path()


@pytest.fixture(scope="session")
def webshop_url(shared_data):
    """One WebShop server on the real 87-product data for the whole session."""
    from envs.webshop_server.process import WebShopServerProcess

    with WebShopServerProcess(data_dir=shared_data / "webshop", start_timeout_s=PATIENCE_S) as server:
        yield server.url


def run_training(save_path: Path, *flags: str):
    """Train with ``E2E_FLAGS`` + ``flags`` into ``save_path``; returns the finished ``Trainer``."""
    from progpo.trainer.config import config_from_args
    from progpo.trainer.loop import Trainer

    cfg = config_from_args([*E2E_FLAGS, "--ckpt.path", str(save_path), *flags])
    trainer = Trainer(cfg)
    trainer.fit()
    return trainer


class RunCache:
    """Finished e2e runs keyed by (env, estimator), trained on first request."""

    def __init__(self, root: Path, webshop_url: str) -> None:
        self.root, self.webshop_url, self.runs = root, webshop_url, {}

    def flags(self, env: str, estimator: str) -> list[str]:
        """The full flag list (without ``--ckpt.path``) of the (env, estimator) run."""
        flags = [*E2E_FLAGS, "--env.name", env, "--algo.advantage.estimator", estimator]
        if estimator == "progpo":  # the tiny model's batches often carry no return signal, which ProGPO's
            flags += ["--progpo.zero_signal", "off"]  # default zeroes; the wiring checks need non-zero values
        if env == "webshop":
            flags += ["--env.url", self.webshop_url]
        return flags

    def get(self, env: str, estimator: str):
        key = (env, estimator)
        if key not in self.runs:
            self.runs[key] = run_training(self.root / f"{env}_{estimator}", *self.flags(env, estimator)[len(E2E_FLAGS):])
        return self.runs[key]


@pytest.fixture(scope="session")
def e2e_runs(tmp_path_factory, webshop_url) -> RunCache:
    """Lazily trained end-to-end runs shared by the e2e and resume tests."""
    return RunCache(tmp_path_factory.mktemp("e2e"), webshop_url)


@pytest.fixture(scope="session")
def train_run():
    """``train_run(save_path, *flags) -> Trainer`` (E2E_FLAGS + flags)."""
    return run_training
