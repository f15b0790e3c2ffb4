"""The fixed behaviour policy of the fidelity benchmark, shared by every task family.

``pi(a | s, o, last K actions)`` is a softmax over the admissible actions (plus a small chance
``invalid_prob`` of one of the task's invalid actions) whose logits add a per-task action prior, a
perturbation that depends on the observation text (an LLM reacts to wording), a bonus
``expert_bias`` for the expert's next subgoal action and a penalty ``repeat_penalty`` per repetition of
the action among the last K actions, so the history matters.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import fields

import numpy as np


class PolicyConfig:
    """Mixin of a family's frozen config dataclass: the checks and CLI helpers every family shares.

    The config must have ``horizon``, ``history``, ``invalid_prob``, ``prior_scale``, ``obs_scale``,
    ``repeat_penalty``, ``invalid_penalty``, ``success_reward`` and ``gamma``.
    """

    def check_common(self) -> None:
        """Validate the shared fields.

        Raises:
            ValueError: naming the first field out of range.
        """
        if not 0 <= self.invalid_prob < 1:
            raise ValueError(f"invalid_prob must be in [0, 1), got {self.invalid_prob}")
        if self.horizon < 1:
            raise ValueError(f"horizon must be >= 1, got {self.horizon}")
        if self.history < 0:
            raise ValueError(f"history must be >= 0, got {self.history}")
        for name in ("prior_scale", "obs_scale", "repeat_penalty", "invalid_penalty", "success_reward"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not 0 < self.gamma <= 1:
            raise ValueError(f"gamma must be in (0, 1], got {self.gamma}")

    @classmethod
    def field_names(cls) -> list[str]:
        """Names of the config fields (for CLI overrides)."""
        return [f.name for f in fields(cls)]


class ExpertSoftmaxPolicy:
    """Mixin: ``policy`` of :class:`progpo.envs.synthetic.mdp.TextMDP` for a task that defines ``cfg`` (with
    ``expert_bias``, ``obs_scale``, ``repeat_penalty``, ``invalid_prob``), ``seed``, ``prior`` (action ->
    logit), ``invalid_actions``, ``admissible(state)`` and ``expert_action(state)``, and sets
    ``self._logit_cache = {}`` and ``self._obs_noise = {}`` in its constructor."""

    def policy(self, state, obs: str, hist: tuple[str, ...]) -> list[tuple[str, float]]:
        """Behaviour policy ``pi(a | s, o, last K actions)`` as ``(action, prob)`` pairs (sum 1)."""
        cfg = self.cfg
        acts = self.admissible(state)
        base = self._logit_cache.get((state, obs))
        if base is None:
            expert, noise = self.expert_action(state), self._noise(obs)
            base = [self.prior.get(a, 0.0) + noise.get(a, 0.0) + (cfg.expert_bias if a == expert else 0.0)
                    for a in acts]
            self._logit_cache[(state, obs)] = base
        logits = [b - cfg.repeat_penalty * hist.count(a) for a, b in zip(acts, base)] if hist else base
        top = max(logits)
        w = [math.exp(x - top) for x in logits]
        scale = (1.0 - cfg.invalid_prob) / sum(w)
        out = [(a, x * scale) for a, x in zip(acts, w)]
        if cfg.invalid_prob > 0:
            out += [(a, cfg.invalid_prob / len(self.invalid_actions)) for a in self.invalid_actions]
        return out

    def _noise(self, obs: str) -> dict[str, float]:
        got = self._obs_noise.get(obs)
        if got is None:
            rng = np.random.default_rng([self.seed, zlib.crc32(obs.encode())])
            got = {a: float(rng.normal(0, self.cfg.obs_scale)) for a in sorted(self.prior)}
            self._obs_noise[obs] = got
        return got
