"""The finite text MDPs behind the synthetic environments: one transition outcome, and the protocol a task
with a fixed behaviour policy implements (what :class:`research.oracle.ExactOracle` solves exactly).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import NamedTuple, Protocol


class Outcome(NamedTuple):
    """One possible result of taking an action in a latent state.

    Attributes:
        prob: probability of this outcome (the outcomes of one (state, action) sum to 1).
        next_state: hashable latent state after the step (ignored when ``terminated``).
        obs: observation text the agent sees next (the anchor observation of the next step).
        reward: reward of this step (reward units; invalid-action penalty already subtracted).
        terminated: the episode ends here (success or failure), no value after it.
        invalid: the action was rejected by the environment.
    """

    prob: float
    next_state: Hashable
    obs: str
    reward: float
    terminated: bool
    invalid: bool


class TextMDP(Protocol):
    """A finite text MDP with a fixed behaviour policy that conditions on the last ``history`` actions."""

    horizon: int  #: H, max steps; the episode is truncated after step H-1
    gamma: float  #: discount of the returns whose advantages are computed
    history: int  #: K, number of past actions the policy conditions on

    def initial(self) -> list[tuple[float, Hashable, str]]:
        """Initial distribution: ``(prob, state, observation)`` triples summing to 1."""
        ...

    def policy(self, state: Hashable, obs: str, hist: tuple[str, ...]) -> list[tuple[str, float]]:
        """Behaviour policy ``pi(a | s, o, last K actions)`` as ``(action, prob)`` pairs (probs > 0, sum 1).

        ``hist`` holds the last K action texts, oldest first, padded with "" at the episode start.
        """
        ...

    def outcomes(self, state: Hashable, action: str) -> list[Outcome]:
        """Transition and observation distribution of ``action`` in ``state``."""
        ...
