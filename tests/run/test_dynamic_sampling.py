"""Dynamic sampling: which groups carry a return signal, that dropping the others leaves the kept groups'
advantages unchanged (ProGPO, GiGPO and the other per-task estimators), and the local loop's draws."""

from __future__ import annotations

import numpy as np
import pytest

from progpo.advantages import AdvantageConfig, Estimator, compute_advantages
from progpo.agents.batching import episodes_to_step_batch
from progpo.agents.types import Episode, StepRecord
from progpo.run.dynamic_sampling import (DynamicSamplingStats, equal_returns, group_has_signal, has_signal,
                                         keep_signal_groups, signal_discount, signal_return)
from progpo.trainer.actor import ActorConfig
from progpo.run.settings import TrainSettings
from progpo.trainer.settings import ActorSettings, AdamSettings


def _episode(uid: str, traj: int, path: list[tuple[str, str, float]], *, won: bool = False,
             failed: bool = False) -> Episode:
    """One trajectory through ``(observation, action, reward)`` steps; the last one terminates."""
    ep = Episode(uid=uid, traj_id=traj, split="train", task_index=0, won=won, failed=failed)
    prefix = uid
    for t, (obs, act, r) in enumerate(path):
        prefix = f"{prefix}|{obs}"
        ep.steps.append(StepRecord(
            prompt_ids=[1, t], response_ids=[2, 3], logprobs=[-0.5, -0.5], response_text="", action=act,
            invalid=r < 0, env_reward=r, reward=r, terminated=t == len(path) - 1, truncated=False, anchor_obs=obs,
            prefix_key=prefix))
        prefix = f"{prefix}|{act}"
    return ep


def batch_with_a_flat_group() -> list[Episode]:
    """Three tasks x 4 rollouts over shared states: task ``a`` and ``c`` have return spread, ``b`` none."""
    a = [_episode("a", 0, [("s", "x", 0.0), ("t", "y", 10.0)], won=True),
         _episode("a", 1, [("s", "x", 0.0), ("t", "z", 0.0)]),
         _episode("a", 2, [("s", "w", -0.1), ("u", "y", 0.0)]),
         _episode("a", 3, [("s", "x", 0.0), ("u", "y", 10.0)], won=True)]
    # the same reward sequence (-0.1, 0) in every episode: no signal by R or by G_0; but state s is met at t = 0
    # in some episodes and at t = 1 in others, so GiGPO's step group of s still sees different returns
    b = [_episode("b", 4 + k, [("v", "x", -0.1), ("s", "y", 0.0)] if k % 2 else [("s", "w", -0.1), ("v", "y", 0.0)])
         for k in range(4)]
    c = [_episode("c", 8, [("m", "x", 0.0), ("n", "y", 5.0)]),
         _episode("c", 9, [("m", "x", 0.0), ("n", "z", 0.0)]),
         _episode("c", 10, [("m", "w", 0.0), ("n", "y", 5.0)]),
         _episode("c", 11, [("m", "x", -0.1), ("o", "y", 0.0)])]
    return a + b + c


def test_equal_returns_is_the_estimators_tolerance():
    assert equal_returns([-0.4, -0.1 * 4]) is False or -0.4 == -0.1 * 4  # exact float sums differ at 1e-17
    assert equal_returns([-0.2, -0.2, -0.2]) and equal_returns([3.0])
    assert equal_returns([10.0, 10.0 + 1e-12])  # rounding: range 1e-12 <= 1e-12 * 10
    assert not equal_returns([10.0, 10.0 + 1e-9]) and not equal_returns([0.0, 1e-300])


def test_groups_without_signal_and_failed_episodes():
    eps = batch_with_a_flat_group()
    assert group_has_signal(eps) == {"a": True, "b": False, "c": True}
    lone = [_episode("d", 0, [("s", "x", 1.0)]), _episode("d", 1, [("s", "x", 0.0)], failed=True)]
    assert not has_signal(lone)  # one finished episode compares with nothing
    kept, uids, no_signal = keep_signal_groups(eps, want=5)
    assert uids == ["a", "c"] and no_signal == 1 and [ep.uid for ep in kept] == ["a"] * 4 + ["c"] * 4
    assert keep_signal_groups(eps, want=1)[1] == ["a"]
    stats = DynamicSamplingStats(drawn_groups=4, dropped_groups=3, extra_groups=2, rounds=1)
    assert stats.metrics() == {"rollout/dynamic_dropped_frac": 0.75, "rollout/dynamic_dropped_groups": 3.0,
                               "rollout/dynamic_kept_groups": 1.0, "rollout/dynamic_extra_groups": 2.0,
                               "rollout/dynamic_rounds": 1.0}


@pytest.mark.parametrize("estimator", [Estimator.PROGPO, Estimator.GIGPO, Estimator.GRPO, Estimator.RLOO,
                                       Estimator.HGPO])
def test_kept_groups_get_the_advantages_of_the_full_batch(estimator):
    eps = batch_with_a_flat_group()
    cfg = AdvantageConfig(estimator=estimator, max_steps=2)
    full = np.asarray(compute_advantages(episodes_to_step_batch(eps), cfg).advantages)
    kept, _, _ = keep_signal_groups(eps, want=3, gamma=signal_discount(cfg))
    part = np.asarray(compute_advantages(episodes_to_step_batch(kept), cfg).advantages)
    rows_kept = np.array([ep.uid != "b" for ep in eps for _ in ep.steps])
    assert rows_kept.sum() == part.size == 16
    np.testing.assert_array_equal(part, full[rows_kept])  # exactly: every statistic is taken inside a task
    assert np.any(part != 0.0)


def test_progpo_zeroes_exactly_the_groups_dynamic_sampling_drops():
    """The two criteria are one: ProGPO's zero_signal='task' zeroes the dropped group and no kept one;
    GiGPO as published (zero_signal off) still gives the dropped group non-zero step advantages."""
    eps = batch_with_a_flat_group()
    uid = np.array([ep.uid for ep in eps for _ in ep.steps])
    batch = episodes_to_step_batch(eps)
    progpo = np.asarray(compute_advantages(batch, AdvantageConfig(estimator="progpo", max_steps=2)).advantages)
    gigpo = np.asarray(compute_advantages(batch, AdvantageConfig(estimator="gigpo", max_steps=2)).advantages)
    signal = group_has_signal(eps, signal_discount(AdvantageConfig(estimator="progpo")))
    for u, ok in signal.items():
        assert np.all(progpo[uid == u] == 0.0) == (not ok), u
    assert np.any(gigpo[uid == "b"] != 0.0)


def _timing_only_group() -> list[Episode]:
    """Every return is -0.1 but the penalty falls at t = 0 or t = 1: G_0 = -0.1 or -0.095 (gamma 0.95)."""
    return [_episode("e", k, [("s", "x", -0.1), ("v", "y", 0.0)] if k % 2 else [("s", "w", 0.0), ("v", "y", -0.1)])
            for k in range(4)]


def test_the_criterion_follows_the_return_the_estimator_judges_signal_on():
    """ProGPO's default judges on G_0 and keeps the group; the baselines (and ProGPO's paper reading) judge on
    R, as DAPO does, and drop it. Either way the dropped groups are exactly those ProGPO zeroes."""
    eps = _timing_only_group()
    progpo = AdvantageConfig(estimator="progpo", max_steps=2)
    assert signal_discount(progpo) == 0.95
    assert signal_discount(AdvantageConfig(estimator="gigpo")) is None and signal_discount(None) is None
    assert signal_discount(AdvantageConfig(estimator="progpo", zero_signal_return="sum")) is None
    assert signal_return(eps[0], 0.95) == pytest.approx(-0.095) and signal_return(eps[1], 0.95) == pytest.approx(-0.1)
    assert signal_return(eps[0]) == pytest.approx(-0.1)
    assert group_has_signal(eps) == {"e": False} and group_has_signal(eps, 0.95) == {"e": True}
    assert keep_signal_groups(eps, 1, signal_discount(progpo))[1] == ["e"]
    assert keep_signal_groups(eps, 1)[1] == []
    adv = compute_advantages(episodes_to_step_batch(eps), progpo).advantages
    assert np.any(np.asarray(adv) != 0.0)  # the group ProGPO keeps carries step credit


# ---- the local loop's draws ------------------------------------------------------------------------
class _Generator:
    def __init__(self) -> None:
        self.stats = {"seconds": 0.0, "tokens": 0}
        self.seeds: list[int] = []

    def set_seed(self, seed: int) -> None:
        self.seeds.append(seed)


def _trainer(tmp_path, *flags: str):
    from progpo.trainer.config import config_from_args
    from progpo.trainer.loop import TaskSampler, Trainer

    cfg = config_from_args(["--actor.model_name_or_path", "tiny", "--ckpt.path", str(tmp_path), "--env.url",
                            "http://127.0.0.1:9", "--rollout.batch_size", "2", "--rollout.n_samples_per_prompt", "2",
                            "--env.max_steps", "2", *flags])
    trainer = Trainer(cfg)
    trainer.generator = _Generator()
    trainer.sampler = TaskSampler(num_tasks=10, seed=0)
    return trainer


def _scripted_play(signal_tasks: set[int], calls: list):
    """``Trainer._play`` stand-in: a task in ``signal_tasks`` gets returns 1 and 0, any other 0 and 0."""

    def play(tasks, sampling, traj_id_start, loop):
        calls.append(([t.index for t in tasks], [t.group_uid for t in tasks], traj_id_start, sampling.seed))
        out, k = [], traj_id_start
        for t in tasks:
            for r in ((1.0, 0.0) if t.index in signal_tasks else (0.0, 0.0)):
                ep = _episode(t.group_uid, k, [("s", "x", r)])
                ep.task_index = t.index
                out.append(ep)
                k += 1
        return out

    return play


def test_local_loop_draws_new_groups_until_the_batch_is_full(tmp_path):
    trainer = _trainer(tmp_path, "--rollout.dynamic_sampling", "true", "--rollout.dynamic_sampling_max_rounds", "3")
    order = trainer.sampler.next(10)  # the sampler's seeded order, to script which tasks carry signal
    trainer.sampler = type(trainer.sampler)(num_tasks=10, seed=0)
    calls: list = []
    trainer._play = _scripted_play({order[1], order[3]}, calls)
    roll = trainer.rollout(1, loop=None)
    # round 0: tasks 0, 1 (1 kept); round 1: one task (2, flat); round 2: one task (3, kept) -> full
    assert [c[0] for c in calls] == [order[:2], [order[2]], [order[3]]]
    assert [c[2] for c in calls] == [0, 4, 6]  # trajectory ids never repeat (they seed the sampling)
    assert len({c[3] for c in calls}) == 1
    assert calls[1][1] == [f"train:{order[2]}@1"]  # a task drawn again later still forms its own group
    assert [ep.task_index for ep in roll.training] == [order[1]] * 2 + [order[3]] * 2
    assert len(roll.episodes) == 8
    m = roll.metrics
    assert (m["rollout/dynamic_dropped_frac"], m["rollout/dynamic_extra_groups"], m["rollout/dynamic_rounds"]) == (
        0.5, 2.0, 2.0)
    assert m["rollout/flat_group_frac"] == 0.5 and m["rollout/num_episodes"] == 8


def _timing_only_play(calls: list):
    """``Trainer._play`` stand-in: two-step episodes that all return -0.1, the penalty at step 0 in a task's
    first episode and at step 1 in its second (G_0 = -0.1 and -0.095 with gamma 0.95)."""

    def play(tasks, sampling, traj_id_start, loop):
        calls.append([t.index for t in tasks])
        out = []
        for t in tasks:
            for j, path in enumerate(([("s", "x", -0.1), ("v", "y", 0.0)], [("s", "w", 0.0), ("v", "y", -0.1)])):
                ep = _episode(t.group_uid, traj_id_start + len(out), path)
                ep.task_index = t.index
                out.append(ep)
        return out

    return play


def test_local_loop_keeps_groups_whose_returns_differ_only_in_timing(tmp_path):
    """ProGPO (the default estimator) judges signal on G_0: both groups are kept, 4 episodes, 0 dropped, no
    extra draw. GRPO judges on R = -0.1 for all: both groups are flat, dropped and drawn again."""
    trainer = _trainer(tmp_path, "--rollout.dynamic_sampling", "true", "--rollout.dynamic_sampling_max_rounds", "2")
    assert signal_discount(trainer.cfg.progpo) == 0.95
    calls: list = []
    trainer._play = _timing_only_play(calls)
    roll = trainer.rollout(1, loop=None)
    assert len(calls) == 1 and len(roll.training) == 4 and roll.training == roll.episodes
    assert [signal_return(ep, 0.95) for ep in roll.training] == pytest.approx([-0.1, -0.095] * 2, abs=1e-12)
    m = roll.metrics
    assert (m["rollout/dynamic_kept_groups"], m["rollout/dynamic_dropped_groups"], m["rollout/dynamic_rounds"]) == (
        2.0, 0.0, 0.0)
    grpo = _trainer(tmp_path / "grpo", "--rollout.dynamic_sampling", "true", "--rollout.dynamic_sampling_max_rounds",
                    "2", "--algo.advantage.estimator", "grpo")
    calls = []
    grpo._play = _timing_only_play(calls)
    roll = grpo.rollout(1, loop=None)
    assert len(calls) == 3 and roll.training == [] and roll.metrics["rollout/dynamic_dropped_groups"] == 6.0


def test_local_loop_stops_at_the_round_cap_and_off_by_default(tmp_path):
    trainer = _trainer(tmp_path, "--rollout.dynamic_sampling", "true", "--rollout.dynamic_sampling_max_rounds", "1")
    calls: list = []
    trainer._play = _scripted_play(set(), calls)
    roll = trainer.rollout(1, loop=None)
    assert len(calls) == 2 and roll.training == [] and roll.metrics["rollout/dynamic_kept_groups"] == 0.0
    off = _trainer(tmp_path / "off")
    calls = []
    off._play = _scripted_play(set(), calls)
    roll = off.rollout(1, loop=None)
    assert len(calls) == 1 and roll.training is roll.episodes
    assert not any(k.startswith("rollout/dynamic_") for k in roll.metrics)


def test_bad_round_cap_names_the_flag(tmp_path):
    from progpo.trainer.config import config_from_args

    with pytest.raises(ValueError, match="^--rollout.dynamic_sampling_max_rounds:? must be >= 0"):
        config_from_args(["--rollout.dynamic_sampling_max_rounds", "-1"])


# ---- skipping an update that cannot change the policy --------------------------------------------
class _NoForwardActor:
    """An actor whose every forward pass fails: a skipped update must not run one."""

    def __init__(self, weight_decay: float = 0.0) -> None:
        self.cfg = ActorConfig(actor=ActorSettings(adam=AdamSettings(weight_decay=weight_decay)),
                               train=TrainSettings(micro_batch_size=2))

    def logprobs(self, *args, **kwargs):
        raise AssertionError("the update ran a forward pass")


def _samples(*advantages: float):
    from progpo.trainer.update import TrainSample

    return [TrainSample([1, 2], [3], a) for a in advantages]


def test_all_zero_advantages_at_the_reference_skip_the_update(tmp_path):
    trainer = _trainer(tmp_path)
    trainer.actor = _NoForwardActor()
    m = trainer.update(_samples(0.0, 0.0, -0.0))
    assert m == {"loss/update_skipped": 1.0, "loss/update_skipped_nonfinite": 0.0, "loss/optimizer_steps": 0.0,
                 "perf/logprobs_s": 0.0}
    assert trainer.skip_reason(_samples(0.0)) == "every advantage is 0 and the policy equals the reference"
    trainer.policy_is_reference = False  # the KL term now has a gradient
    assert trainer.skip_reason(_samples(0.0)) is None
    assert trainer.skip_reason(_samples(0.0, 1e-30)) is None


def test_skip_needs_no_other_gradient_source(tmp_path):
    no_kl = _trainer(tmp_path / "a", "--algo.kl.init_coef", "0")
    no_kl.actor, no_kl.policy_is_reference = _NoForwardActor(), False
    assert no_kl.skip_reason(_samples(0.0)) == "every advantage is 0 and the KL term is off"
    entropy = _trainer(tmp_path / "b", "--actor.entropy_coef", "0.01")
    entropy.actor = _NoForwardActor()
    assert entropy.skip_reason(_samples(0.0)) is None
    decay = _trainer(tmp_path / "c")
    decay.actor = _NoForwardActor(weight_decay=0.1)
    assert decay.skip_reason(_samples(0.0)) is None
    assert decay.skip_reason([]) == "no training samples"
