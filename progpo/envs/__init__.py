"""Text environments behind one protocol (``progpo.envs.base``), one spec each (``progpo.envs.spec``).

Every environment is registered here with :func:`register`, as Gymnasium does: adding one means one
``register`` call and its module. Nothing else lists env names: the CLIs' ``--env.name`` choices, the
episode loop's template and syntax lookups, both backends' env setup, the SFT experts, the evaluation
summaries and the data downloader read the registry.

This package imports no ray/deepspeed/vllm at module level; the Ray env pool lives in
``progpo.envs.ray_pool`` and imports ray only when used.
"""

from __future__ import annotations

from typing import Any

from progpo.envs.base import EnvFailure, EnvPool, StepResult, TextEnv
from progpo.envs.spec import POOLS, EnvSpec, PromptTemplate, env_ids, register, spec

register(
    id="webshop",
    entry_point="progpo.envs.webshop:WebShopEnv",
    max_steps=15,
    demo_max_steps=6,
    splits=("train", "eval", "test"),
    eval_split="test",
    template="progpo.envs.webshop:WEBSHOP_TEMPLATE",
    syntax="progpo.envs.webshop:webshop_syntax_ok",
    expert="progpo.agents.experts:webshop_expert",
    service="progpo.run.env_setup:webshop_service",
    summary="progpo.run.evaluation:webshop_summary",
    download="progpo.envs.download:download_webshop",
    data_subdir="webshop",
    http_pool="progpo.envs.http_pool:make_async_http_pool",
    server="envs.webshop_server",
    pool="http",
    reports_score=True,
    language_rule=False,  # its catalog and goals hold CJK (goal #706: "... 1.8米 capacity")
)

register(
    id="alfworld",
    entry_point="progpo.envs.alfworld:AlfWorldEnv",
    max_steps=50,
    demo_max_steps=8,
    splits=("train", "valid_seen", "valid_unseen", "valid_train"),
    eval_split="valid_unseen",
    template="progpo.envs.alfworld:ALFWORLD_TEMPLATE",
    syntax="progpo.envs.alfworld:alfworld_syntax_ok",
    expert="progpo.agents.experts:alfworld_expert",
    summary="progpo.envs.alfworld:alfworld_summary",
    download="progpo.envs.download:download_alfworld",
    data_subdir="alfworld",
    data_check="progpo.envs.alfworld_data:check_data",
    pool="ray",
)

# The lab's synthetic task families (progpo.envs.synthetic) with the real envs' templates and answer syntax:
# exact truth available (research.oracle), nothing to download or start, a few microseconds per step.
register(
    id="alfworld_like",
    entry_point="progpo.envs.synthetic.env:SyntheticEnv",
    max_steps=30,
    splits=("train", "test"),
    eval_split="test",
    template="progpo.envs.alfworld:ALFWORLD_TEMPLATE",
    syntax="progpo.envs.synthetic.env:alfworld_like_syntax_ok",
    expert="progpo.envs.synthetic.env:synthetic_expert",
    kwargs={"family": "alfworld"},
)

register(
    id="webshop_like",
    entry_point="progpo.envs.synthetic.env:SyntheticEnv",
    max_steps=15,
    splits=("train", "test"),
    eval_split="test",
    template="progpo.envs.webshop:WEBSHOP_TEMPLATE",
    syntax="progpo.envs.webshop:webshop_syntax_ok",
    expert="progpo.envs.synthetic.env:synthetic_expert",
    reports_score=True,
    kwargs={"family": "webshop"},
)


def env_class(name: str) -> type:
    """The env class registered under ``name``; ValueError names the known ones."""
    return spec(name).load("entry_point")


def make_env(name: str, **kwargs: Any) -> TextEnv:
    """Build the env registered under ``name`` with its spec's ``kwargs`` and then ``kwargs``."""
    s = spec(name)
    return s.load("entry_point")(**{**dict(s.kwargs), **kwargs})


__all__ = ["EnvFailure", "EnvPool", "EnvSpec", "POOLS", "PromptTemplate", "StepResult", "TextEnv", "env_class",
           "env_ids", "make_env", "register", "spec"]
