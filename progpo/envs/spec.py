"""One spec per environment, registered by id as Gymnasium does (``register(id=..., entry_point=...)``).

An :class:`EnvSpec` holds everything the rest of the system needs to know about an environment: its
class, default step limit, splits, prompt template, answer syntax check, expert, the service it needs
started (the WebShop server), its default pool on the cluster path, and what its ``info`` reports.
Adding an environment means one :func:`register` call and its module; every CLI's ``--env.name``
choices, the episode loop's template and syntax lookups, the env setup of both backends and the SFT
experts read the registry (tests check that nothing else lists env names).

References to code are ``"module:attribute"`` strings, imported on first use (:meth:`EnvSpec.load`),
so reading the registry imports no env library (TextWorld, HTTP clients) and no higher layer.

:class:`PromptTemplate` lives here too: a template is data about how an env is shown to an LLM, and an
env module may define its own next to the env.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
from dataclasses import dataclass
from typing import Any

REF_FIELDS: tuple[str, ...] = ("entry_point", "template", "syntax", "expert", "service", "summary", "download",
                               "data_check", "http_pool")
"""The :class:`EnvSpec` fields that name code as ``"module:attribute"`` (:meth:`EnvSpec.load`)."""

_MODULE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")

POOLS = ("local", "ray", "http")
"""Env pools: ``local`` (envs in this process, stepped in threads), ``ray`` (one Ray actor per env),
``http`` (WebShop over async HTTP, no threads)."""


ANSWER_FORMAT = (
    "Now it's your turn to take an action.\n"
    "First reason step by step about the current situation; this reasoning MUST be enclosed "
    "within <think> </think> tags.\n"
    "Then choose exactly one admissible action for the current step and give it within "
    "<action> </action> tags."
)
"""The answer-format instruction the verl-agent / GiGPO prompts end with (the real envs' templates and the
synthetic families built on them): reason in ``<think> </think>``, answer one admissible action in
``<action> </action>`` (the tags ``progpo.agents.parsing`` checks)."""


@dataclass(frozen=True)
class PromptTemplate:
    """The prompt of one environment, as data (rendered by ``progpo.agents.templates``).

    Attributes:
        env_name: registry id of the env (``"webshop"``, ``"alfworld"``).
        with_history: the user message when at least one earlier step is shown. Fields:
            ``{task}``, ``{step_count}`` (steps already taken, ``t``), ``{history_length}``
            (turns shown), ``{history}``, ``{current_step}`` (``t + 1``), ``{observation}``,
            ``{actions}``.
        no_history: the user message at the first step (or when history is off / dropped):
            fields ``{task}``, ``{observation}``, ``{actions}``.
        history_turn: one (observation, action) pair; fields ``{step}`` (1-based step number),
            ``{observation}``, ``{action}``.
        history_separator: joins history turns.
        action_item: one admissible action; field ``{action}``.
        action_separator: joins admissible actions.
        hidden_actions: admissible actions never shown (ALFWorld's ``help``).
        system: optional system message (None = user message only, as verl-agent does).
    """

    env_name: str
    with_history: str
    no_history: str
    history_turn: str
    history_separator: str
    action_item: str
    action_separator: str
    hidden_actions: tuple[str, ...] = ()
    system: str | None = None


@dataclass(frozen=True)
class EnvSpec:
    """Everything about one environment (see the module docstring).

    Attributes:
        id: registry name, the ``--env.name`` value.
        entry_point: ``"module:Class"`` of the env (``TextEnv`` protocol, ``progpo.envs.base``).
        max_steps: default decisions per episode (``--env.max_steps``; the GiGPO protocol's limits).
        demo_max_steps: decisions per episode of the one-machine main job (``examples/scripts/run_local.sh``,
            a few CPU iterations): enough for the scripted expert to finish most tasks, so the warm-started
            model's groups differ in return, and no more (every step costs a generate call on 2 cores).
            WebShop 6 (above its expert's mean episode length: docs/training.md, "The main job"), ALFWorld 8.
            None: ``max_steps``.
        splits: task splits the env serves; the first is the default training split.
        eval_split: default split of ``evaluate`` and of evaluation during training.
        template: ``"module:OBJECT"`` of its :class:`PromptTemplate`.
        syntax: ``"module:function"``, ``normalised action -> bool``: the answer-format check of one
            action (``progpo.agents.parsing``); admissibility beyond the format is the env's.
        expert: ``"module:function"``, ``env_kwargs -> (() -> Expert)``: a factory of the scripted
            expert the behaviour-cloning warm start plays (``progpo.agents.experts``); None: no expert.
        service: ``"module:function"``, a context manager ``(EnvSettings) -> env_kwargs`` that starts what
            the env needs (the WebShop server) and yields the env class's keyword arguments; None: the
            env needs nothing started and takes ``max_steps`` (and ``data_dir`` when ``data_subdir`` is set).
        summary: ``"module:function"``, ``episodes -> dict``: env-specific figures of an evaluation
            (``progpo.run.evaluation.summarize``); None: only the common ones.
        download: ``"module:function"``, ``(folder, timeout_s, **options) -> path(s)``: fetches the env's
            data into ``folder`` = ``<data root>/<data_subdir>`` (``python -m progpo.cli.data download``); None:
            nothing to fetch.
        data_subdir: folder of its data under the data root (``progpo.paths.data_root``); None: no data.
        data_check: ``"module:function"``, ``(data_dir: str | None) -> None`` raising ``FileNotFoundError``
            (naming what is missing) when the env's data cannot be found from this machine; ``train_ray``
            calls it at start-up, before any actor starts. None: nothing to check.
        http_pool: ``"module:function"``, ``(env_kwargs, max_envs) -> EnvPool``: the async HTTP pool of an env
            served over HTTP (``--env.pool http``); None: the env has none.
        server: the ``python -m`` module of the HTTP server that serves the env, taking ``--host``, ``--port``,
            ``--threads`` and ``--data-dir`` (WebShop: ``envs.webshop_server``): the launch scripts
            (``examples/scripts``) start it once where every node reaches it, unless ``WEBSHOP_URL`` names a
            running one, and pass its URL as ``--env.url`` (which its ``service`` then uses). None: they start
            nothing.
        pool: default ``--env.pool`` on the cluster path (``train_ray``): one of :data:`POOLS`.
        reports_score: ``info["score"]`` is a [0, 1] task score (WebShop's), logged as ``env/score_mean``.
        language_rule: verl-agent's rule against language switches applies: a response holding a CJK ideograph
            (U+4E00-U+9FFF) anywhere is format-invalid (``progpo.agents.parsing``). False for an env whose own
            text (tasks, pages, labels) holds such characters, where the rule would refuse answers that click
            the env's own labels or copy its task's words (WebShop: ``click[1.8米]``, goal #706).
        kwargs: extra constructor keyword arguments of every env instance.
    """

    id: str
    entry_point: str
    max_steps: int
    splits: tuple[str, ...]
    eval_split: str
    template: str
    syntax: str
    expert: str | None = None
    service: str | None = None
    summary: str | None = None
    download: str | None = None
    data_subdir: str | None = None
    data_check: str | None = None
    http_pool: str | None = None
    server: str | None = None
    pool: str = "local"
    reports_score: bool = False
    language_rule: bool = True
    demo_max_steps: int | None = None
    kwargs: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        for name in REF_FIELDS:
            ref = getattr(self, name)
            if ref is not None and (not isinstance(ref, str) or ref.count(":") != 1):
                raise ValueError(f"EnvSpec {self.id!r}: {name} must be a 'module:attribute' string, got {ref!r}")
        if self.max_steps < 1:
            raise ValueError(f"EnvSpec {self.id!r}: max_steps must be >= 1, got {self.max_steps}")
        if self.demo_max_steps is not None and not 1 <= self.demo_max_steps <= self.max_steps:
            raise ValueError(f"EnvSpec {self.id!r}: demo_max_steps must be in 1..max_steps ({self.max_steps}), "
                             f"got {self.demo_max_steps}")
        if not self.splits or self.eval_split not in self.splits:
            raise ValueError(f"EnvSpec {self.id!r}: eval_split {self.eval_split!r} must be one of splits {self.splits}")
        if self.pool not in POOLS:
            raise ValueError(f"EnvSpec {self.id!r}: pool must be one of {POOLS}, got {self.pool!r}")
        if self.download is not None and self.data_subdir is None:
            raise ValueError(f"EnvSpec {self.id!r}: a download needs a data_subdir (the folder it fills)")
        if self.pool == "http" and self.http_pool is None:
            raise ValueError(f"EnvSpec {self.id!r}: pool http needs an http_pool")
        if self.server is not None and (self.service is None or not _MODULE.fullmatch(self.server)):
            raise ValueError(f"EnvSpec {self.id!r}: server must be a module name (python -m MODULE) of an env with a "
                             f"service (that takes its URL), got server={self.server!r}, service={self.service!r}")

    @property
    def train_split(self) -> str:
        """The default training split (the first of ``splits``)."""
        return self.splits[0]

    def load(self, name: str) -> Any:
        """The object a ``"module:attribute"`` field names (``entry_point``, ``template``, ...), imported now.

        Raises:
            ValueError: the field is None for this env (e.g. no expert).
        """
        ref = getattr(self, name)
        if ref is None:
            raise ValueError(f"env {self.id!r} has no {name}")
        module, attr = ref.split(":")
        return getattr(importlib.import_module(module), attr)


_REGISTRY: dict[str, EnvSpec] = {}


def register(id: str, **fields: Any) -> EnvSpec:  # noqa: A002 - Gymnasium's keyword
    """Register an environment under ``id`` (Gymnasium's ``register``); returns its spec.

    Raises:
        ValueError: ``id`` is taken, or a field is invalid (see :class:`EnvSpec`).
    """
    if id in _REGISTRY:
        raise ValueError(f"env {id!r} is already registered")
    if isinstance(fields.get("kwargs"), dict):
        fields["kwargs"] = tuple(sorted(fields["kwargs"].items()))
    spec = EnvSpec(id=id, **fields)
    _REGISTRY[id] = spec
    return spec


def spec(id: str) -> EnvSpec:  # noqa: A002
    """The spec registered under ``id``.

    Raises:
        ValueError: unknown id (the message lists the registered ones).
    """
    try:
        return _REGISTRY[id]
    except KeyError:
        raise ValueError(f"unknown env {id!r}; registered: {sorted(_REGISTRY)}") from None


def env_ids() -> tuple[str, ...]:
    """Every registered env id, sorted (the ``--env.name`` choices)."""
    return tuple(sorted(_REGISTRY))


def replace_spec(id: str, **changes: Any) -> EnvSpec:  # noqa: A002
    """A copy of ``id``'s spec with ``changes`` (not registered; for tests and variants)."""
    return dataclasses.replace(spec(id), **changes)
