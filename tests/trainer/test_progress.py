"""The run's progress bar (stage shares, fractional position, ETA input) and the metrics line."""

from __future__ import annotations

import io

import pytest

from progpo.agents.types import Episode, StepRecord
from progpo.run.metrics import format_metrics
from progpo.trainer.loop import signal_metrics
from progpo.trainer.progress import DEFAULT_SHARES, RunProgress
from progpo.run.settings import TrainSettings


def test_position_moves_through_the_stages_by_their_shares():
    p = RunProgress(3, enabled=False)
    p.begin_iteration(1)
    p.stage("rollout", 10)
    assert p.position == 0.0
    p.advance(5)  # half of the rollout: 0.5 * 0.6
    assert p.position == pytest.approx(0.3)
    p.stage("advantages")
    assert p.position == pytest.approx(DEFAULT_SHARES["rollout"])
    p.stage("update")
    assert p.position == pytest.approx(0.65)
    p.end_iteration({"rollout": 6.0, "advantages": 1.0, "update": 2.0, "checkpoint": 1.0})
    assert p.position == pytest.approx(1.0)
    assert p.shares == pytest.approx({"rollout": 0.6, "advantages": 0.1, "update": 0.2, "checkpoint": 0.1})
    p.begin_iteration(2)
    p.stage("rollout", 4)
    p.advance(4)
    p.stage("advantages")  # the measured shares of iteration 1 now drive iteration 2
    assert p.position == pytest.approx(1.6)
    p.stage("update")
    assert p.position == pytest.approx(1.7)


def test_bar_renders_stage_and_eta_and_rejects_bad_input():
    out = io.StringIO()
    p = RunProgress(2, 0, file=out)
    p.begin_iteration(1)
    p.stage("rollout", 8)
    p.advance(8)
    p.end_iteration({"rollout": 1.0, "update": 1.0}, postfix={"success": "0.25"})
    p.close()
    text = out.getvalue()
    assert "iter 1/2" in text and "1.00/2 iter" in text and "success=0.25" in text
    with pytest.raises(ValueError, match="unknown stage"):
        p.stage("sleep")
    with pytest.raises(ValueError, match="total >= 1"):
        RunProgress(0)
    resumed = RunProgress(5, 2, enabled=False)
    assert resumed.position == 2.0


def _episode(uid: str, rewards: list[float], score: float | None = None) -> Episode:
    ep = Episode(uid=uid, traj_id=0, split="train", task_index=0)
    for r in rewards:
        ep.steps.append(StepRecord(prompt_ids=[1], response_ids=[2], logprobs=[0.0], response_text="", action="a",
                                   invalid=False, env_reward=r, reward=r, terminated=False, truncated=False,
                                   anchor_obs="o", prefix_key="k"))
    if score is not None:
        ep.info["score"] = score
    return ep


def test_signal_metrics_flat_groups_and_score():
    eps = [_episode("a", [-0.1, -0.1]), _episode("a", [0.0, -0.2]),   # returns -0.2, -0.2: flat
           _episode("b", [1.0], 0.5), _episode("b", [0.0], 0.0),      # 1.0 vs 0.0: signal
           _episode("c", [3.0], 1.0)]                                  # a group of one: flat
    m = signal_metrics(eps)
    assert m["rollout/flat_group_frac"] == pytest.approx(2 / 3)
    assert m["env/score_mean"] == pytest.approx(0.5)
    failed = _episode("d", [1.0])
    failed.failed = True
    assert signal_metrics([_episode("d", [0.0]), failed]) == {"rollout/flat_group_frac": 1.0}
    assert signal_metrics([failed]) == {}


def test_groups_of_one_show_no_signal():
    """Every task played once: no return can be compared, and the metrics line says so."""
    m = signal_metrics([_episode("a", [1.0], 1.0), _episode("b", [0.0], 0.0)])
    assert m["rollout/flat_group_frac"] == 1.0
    assert "no signal" in format_metrics(1, m)


def test_metrics_line_shows_the_zero_signal_state():
    flat = {"env/success_rate": 0.0, "adv/std": 0.968, "rollout/flat_group_frac": 1.0, "env/score_mean": 0.1}
    line = format_metrics(3, flat)
    assert line.startswith("iter 3 success=0.000 score=0.100")
    assert "adv_std=0.968 flat=1.00" in line and "no signal" in line
    assert "no signal" not in format_metrics(3, {**flat, "rollout/flat_group_frac": 0.5})


def test_a_stage_start_is_written_to_a_log_file_at_once():
    # a log file (not a tty) redraws at most every 30 s; the update stage (minutes on CPU) used to show
    # only when it ended (fresh-clone trial of the main job, 2026-11-30)
    out = io.StringIO()
    p = RunProgress(2, 0, file=out)
    p.begin_iteration(1)
    p.stage("rollout", 4)
    p.advance(4)
    p.stage("update", 3)
    assert "iter 1/2 update 0/3" in out.getvalue()
    p.close()


def test_update_micro_batch_count_is_hand_computed():
    from progpo.trainer.update import UpdateConfig, num_micro_batches

    # 10 samples, mini-batches of 4 -> 4, 4, 2; micro-batches of 2 -> 2 + 2 + 1 = 5 per epoch; 2 epochs
    assert num_micro_batches(10, UpdateConfig(train=TrainSettings(batch_size=4, max_epochs=2)), 2) == 10
    # 3 samples, one mini-batch of 3, micro-batches of 2 -> 2 per epoch
    assert num_micro_batches(3, UpdateConfig(train=TrainSettings(batch_size=8, max_epochs=1)), 2) == 2
    assert num_micro_batches(0, UpdateConfig(train=TrainSettings(batch_size=8, max_epochs=1)), 2) == 0
