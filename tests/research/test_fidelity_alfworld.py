"""ALFWorld fidelity mode: the noisy expert's logic (pure) and a tiny real run (slow)."""

from __future__ import annotations

import numpy as np
import pytest

from research import fidelity
from research.fidelity_alfworld import NoisyExpert


def test_noisy_expert_follows_walkthrough_and_walks_back():
    pol = NoisyExpert(["go to desk 1", "take pen 1 from desk 1", "go to shelf 1"], p=1.0)
    rng = np.random.default_rng(0)
    assert pol.progress(["look", "go to desk 1", "go to bed 1"]) == 1
    assert pol.act([], ["go to desk 1", "look"], rng) == "go to desk 1"
    # after a detour the walkthrough's "take" is not admissible: go back to the desk
    assert pol.act(["go to desk 1", "go to bed 1"], ["go to desk 1", "look"], rng) == "go to desk 1"
    random_pol = NoisyExpert(["go to desk 1"], p=0.0)
    picks = {random_pol.act([], ["a", "b", "c"], rng) for _ in range(50)}
    assert picks == {"a", "b", "c"}
    with pytest.raises(ValueError, match="--p_expert"):
        NoisyExpert([], p=1.5)


@pytest.mark.slow
def test_tiny_alfworld_run(shared_data, tmp_path, capsys):
    pytest.importorskip("alfworld")
    argv = ["--mode", "alfworld", "--games", "0", "--rollout.n_samples_per_prompt", "2", "--continuations", "1",
            "--env.max_steps", "3", "--estimators", "grpo,gigpo,progpo", "--encoder", "none", "--out", str(tmp_path)]
    assert fidelity.main(argv) == 0
    text = capsys.readouterr().out
    assert "Truth standard error" in text and "| gigpo |" in text
