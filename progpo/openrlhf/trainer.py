"""OpenRLHF 0.11.2 PPO trainer actor with our samples generator and experience maker, and its launcher.

``ProGPOPPOTrainer`` is ``@ray.remote class ProGPOPPOTrainer(PPOTrainer.__ray_actor_class__)``: it
runs OpenRLHF's own constructor (tokenizer, prompt dataloaders, KL controller, loggers) and then
replaces ``samples_generator`` and ``experience_maker`` with
:class:`~progpo.openrlhf.samples.StepSamplesGenerator` and
:class:`~progpo.openrlhf.experience.StepExperienceMaker`; every other stage (reference and
actor forward passes, DeepSpeed ZeRO update, NCCL weight sync to vLLM, checkpoints, TensorBoard/W&B)
is OpenRLHF's.

:func:`run_openrlhf_main` runs OpenRLHF's ``cli/train_ppo_ray.py`` ``__main__`` block (its argument
post-processing and checks, then its ``train``), with our trainer class in place of ``PPOTrainer``.
This is the one place that patches OpenRLHF, for exactly the pinned version (:data:`OPENRLHF_VERSION`).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import logging
import runpy
from collections.abc import Iterator
from typing import Any

import ray
from openrlhf.trainer import ppo_trainer as _ppo_trainer_module
from openrlhf.trainer.ppo_trainer import PPOTrainer

from progpo.openrlhf.experience import StepExperienceMaker
from progpo.openrlhf.samples import StepSamplesGenerator

logger = logging.getLogger(__name__)

OPENRLHF_VERSION = "0.11.2"
"""The OpenRLHF release whose private seams these subclasses override."""

_TRAIN_MODULE = "openrlhf.cli.train_ppo_ray"


def check_openrlhf_version() -> None:
    """Raise RuntimeError unless the installed openrlhf is exactly :data:`OPENRLHF_VERSION`."""
    found = importlib.metadata.version("openrlhf")
    if found != OPENRLHF_VERSION:
        raise RuntimeError(
            f"progpo's OpenRLHF extension needs openrlhf=={OPENRLHF_VERSION} (found {found}); "
            f"install it with: pip install --no-deps openrlhf=={OPENRLHF_VERSION}"
        )


class _ProGPOTrainerMixin:
    """What :class:`ProGPOPPOTrainer` adds to OpenRLHF's trainer (kept apart for CPU tests)."""

    def _install_progpo_stages(self, strategy: Any, vllm_engines: Any, advantage_config: Any) -> None:
        self.samples_generator = StepSamplesGenerator(
            strategy=strategy,
            prompts_dataloader=self.prompts_dataloader,
            eval_dataloader=self.eval_dataloader,
            tokenizer=self.tokenizer,
            vllm_engines=vllm_engines,
        )
        encoder = None
        if advantage_config is not None and getattr(advantage_config, "semantic_expansion", False):
            from progpo.advantages.embeddings import default_encoder

            encoder = default_encoder()
        self.experience_maker = StepExperienceMaker(
            self.actor_model_group,
            self.critic_model_group,
            self.reward_model_group,
            self.reference_model_group,
            self.kl_ctl,
            strategy,
            self.tokenizer,
            advantage_config=advantage_config,
            encoder=encoder,
        )

    def train_step(self, rollout_samples: Any, global_step: int) -> tuple[dict, int]:
        """OpenRLHF's train step, plus episode (``env/``, ``rollout/``) and estimator (``adv/``) metrics."""
        status, global_step = super().train_step(rollout_samples, global_step)
        status.update(self.samples_generator.last_stats)
        status.update(self.experience_maker.last_diagnostics)
        return status, global_step


@ray.remote
class ProGPOPPOTrainer(_ProGPOTrainerMixin, PPOTrainer.__ray_actor_class__):
    """OpenRLHF's single-controller PPO trainer with per-step samples and our estimators.

    Same constructor as OpenRLHF's ``PPOTrainer``; the ``AdvantageConfig`` is read from
    ``strategy.args.progpo_advantage_config`` (set by ``python -m progpo.cli.train_ray``).
    """

    def __init__(self, pretrain: str, strategy: Any, actor_model_group: Any, critic_model_group: Any,
                 reward_model_group: Any, reference_model_group: Any, vllm_engines: Any,
                 **generate_kwargs: Any) -> None:
        super().__init__(pretrain, strategy, actor_model_group, critic_model_group, reward_model_group,
                         reference_model_group, vllm_engines, **generate_kwargs)
        cfg = getattr(strategy.args, "progpo_advantage_config", None)
        self._install_progpo_stages(strategy, vllm_engines, cfg)


@contextlib.contextmanager
def _patched(obj: Any, name: str, value: Any) -> Iterator[None]:
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


class _ParserCaptured(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__("parser captured")
        self.parser = parser


def openrlhf_parser() -> argparse.ArgumentParser:
    """OpenRLHF's own ``train_ppo_ray`` argument parser (all its flags, defaults and help).

    Its parser is built inside ``if __name__ == "__main__"``; the block is run with
    ``parse_args`` replaced by a function that hands the parser back before anything is parsed.
    """
    check_openrlhf_version()

    def capture(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        raise _ParserCaptured(self)

    with _patched(argparse.ArgumentParser, "parse_args", capture):
        try:
            runpy.run_module(_TRAIN_MODULE, run_name="__main__")
        except _ParserCaptured as captured:
            return captured.parser
    raise RuntimeError(f"{_TRAIN_MODULE} did not build an argument parser")


def run_openrlhf_main(namespace: argparse.Namespace) -> None:
    """Run OpenRLHF's ``train_ppo_ray`` main block on an already-parsed flat ``namespace``.

    Its post-processing and checks apply unchanged; its ``train`` then builds the Ray actor
    groups and vLLM engines and starts :class:`ProGPOPPOTrainer` in place of ``PPOTrainer``
    (synchronous mode only; ``--train.async_enable`` is refused earlier by ``train_ray``).
    """
    check_openrlhf_version()

    def given(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> argparse.Namespace:
        return namespace

    with _patched(argparse.ArgumentParser, "parse_args", given), _patched(
        _ppo_trainer_module, "PPOTrainer", ProGPOPPOTrainer
    ):
        runpy.run_module(_TRAIN_MODULE, run_name="__main__")
