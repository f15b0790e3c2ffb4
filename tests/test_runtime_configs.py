"""Each setting has one dataclass field and one default (issue 33, item 1): the runtime configs hold the settings
objects the flags are built from, and never restate a settings field under their own name or default.

A runtime config's fields are either settings sections (dataclasses reachable from a CLI's settings) or values
the run derives that no flag sets; a field whose name is a settings field's name fails here, so a config cannot
grow a second spelling (with a second default and check) of a flag again.
"""

from __future__ import annotations

import dataclasses
import typing

import pytest

from progpo.agents.episode import EpisodeConfig
from progpo.cli.evaluate import EvaluateArgs
from progpo.openrlhf.agent import AgentConfig
from progpo.openrlhf.launch import RayArgs
from progpo.trainer.actor import ActorConfig
from progpo.trainer.config import TrainConfig
from progpo.trainer.update import UpdateConfig
from progpo.trainer.warm_start import SFTArgs

#: the CLIs' settings trees (each a dataclass whose fields are the flag sections).
CLI_SETTINGS = (TrainConfig, SFTArgs, RayArgs, EvaluateArgs)
RUNTIME_CONFIGS = (ActorConfig, UpdateConfig, EpisodeConfig, AgentConfig)


def _sections(root: type) -> set[type]:
    """Every dataclass reachable from ``root``'s fields (the settings sections, nested ones too)."""
    out: set[type] = set()
    todo = [root]
    while todo:
        cls = todo.pop()
        for name, hint in typing.get_type_hints(cls).items():
            for t in (hint, *typing.get_args(hint)):
                if dataclasses.is_dataclass(t) and t not in out and name in {f.name for f in dataclasses.fields(cls)}:
                    out.add(t)
                    todo.append(t)
    return out


SECTIONS = set().union(*(_sections(root) for root in CLI_SETTINGS)) - set(RUNTIME_CONFIGS)
SETTING_NAMES = {f.name for cls in SECTIONS for f in dataclasses.fields(cls) if not dataclasses.is_dataclass(
    typing.get_type_hints(cls)[f.name])}


def _is_settings(hint: object) -> bool:
    """A settings section, or a ``Protocol`` naming fields of one (``agents`` sits below ``run`` and names the
    fields of ``EnvSettings`` / ``RolloutSettings`` it reads instead of importing them)."""
    if hint in SECTIONS:
        return True
    if getattr(hint, "_is_protocol", False):
        members = {n for n in vars(hint) if not n.startswith("_")}
        return bool(members) and any(members <= {f.name for f in dataclasses.fields(c)} for c in SECTIONS)
    return False


def _own_fields(config: type) -> dict[str, object]:
    """``config``'s fields that are not settings sections: name -> type."""
    hints = typing.get_type_hints(config)
    return {f.name: hints[f.name] for f in dataclasses.fields(config) if not _is_settings(hints[f.name])}


def test_the_settings_tree_is_found():
    names = {cls.__name__ for cls in SECTIONS}
    assert {"EnvSettings", "RolloutSettings", "ActorSettings", "AdamSettings", "DeepSpeedSettings", "LoraSettings",
            "KLSettings", "TrainSettings", "SFTSettings", "EvalSettings"} <= names
    assert {"max_steps", "history_length", "invalid_penalty", "max_prompt_tokens", "max_new_tokens", "temperature",
            "micro_batch_size", "lr", "init_coef", "max_epochs", "batch_size"} <= SETTING_NAMES


@pytest.mark.parametrize("config", RUNTIME_CONFIGS, ids=lambda c: c.__name__)
def test_runtime_config_holds_settings_and_respells_none(config):
    hints = typing.get_type_hints(config)
    respelled = sorted(set(_own_fields(config)) & SETTING_NAMES)
    assert not respelled, (f"{config.__name__} restates settings fields {respelled}: hold the settings object "
                           "instead (one field, one default, one check per setting)")
    held = [f.name for f in dataclasses.fields(config) if _is_settings(hints[f.name])]
    assert held, f"{config.__name__} holds no settings object"


def test_the_local_trainer_passes_its_own_settings_objects():
    cfg = TrainConfig()
    actor, update = cfg.actor_config(1), cfg.update_config()
    assert (actor.actor, actor.ds, actor.train) == (cfg.actor, cfg.ds, cfg.train)
    assert actor.actor is cfg.actor and actor.ds is cfg.ds and actor.train is cfg.train
    assert update.train is cfg.train and update.actor is cfg.actor and update.kl is cfg.algo.kl
    assert update.rollout is cfg.rollout
