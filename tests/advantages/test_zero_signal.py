"""Tasks without a return signal: exact zeros (issue 12 case 8) and the ``zero_signal`` field (issue 10).

Case 8: equal returns must give exactly 0, not the +-1.8e-9 that ``sum/count`` rounding left in
``x - mean`` (six 9.8s average to 9.800000000000002). ``zero_signal`` goes further: a task whose
trajectories all have the same episode return gets 0 from every term, including ProGPO's transition
credit, which the ``C / std_u C`` normalisation otherwise blows up to unit size.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from progpo.advantages import ESTIMATORS, AdvantageConfig, StepBatch, compute_advantages, config_from_preset
from benchmarks.synthetic_batches import HashEncoder, random_batch

ALL = sorted(ESTIMATORS)


def _one_step_batch(rewards: list[float], obs: str = "You are in the middle of a room.") -> StepBatch:
    n = len(rewards)
    return StepBatch.from_lists(
        uid=["u"] * n, traj_id=list(range(n)), step_index=[0] * n, reward=rewards, terminated=[True] * n,
        truncated=[False] * n, invalid=[False] * n, anchor_obs=[obs] * n, prefix_key=["u|0"] * n,
        action=["look"] * n, state_extra=["You are not carrying anything."] * n)


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("reward, n", [(9.8, 6), (0.1, 7), (1 / 3, 3), (-0.4, 8)])
def test_identical_one_step_returns_give_exact_zeros(name, reward, n):
    # issue 12 case 8: six one-step trajectories with reward 9.8 gave GRPO 1.78e-9 and
    # GiGPO/HGPO/ProGPO 3.55e-9 before the group means were made exact
    if (reward, n) == (9.8, 6):
        assert sum([reward] * n) / n != reward  # the rounding the exact group mean removes
    for cfg in (AdvantageConfig(estimator=name), config_from_preset("paper", estimator=name)):
        out = compute_advantages(_one_step_batch([reward] * n), cfg, HashEncoder())
        assert np.all(out.advantages == 0.0), out.advantages
        assert out.diagnostics["adv/frac_zero"] == 1.0
        assert out.diagnostics["adv/frac_equal_return_steps"] == 1.0


def _all_invalid_batch(n_traj: int = 4, length: int = 4) -> StepBatch:
    """The main job's zero-signal case: every step invalid (-0.1), every trajectory cut at max_steps,
    every episode return -0.4; the page never changes, so the anchor observation is the same."""
    cols = {k: [] for k in ("uid", "traj_id", "step_index", "reward", "terminated", "truncated", "invalid",
                            "anchor_obs", "prefix_key", "action")}
    for i in range(n_traj):
        for t in range(length):
            for k, v in zip(cols, ("q", i, t, -0.1, False, t == length - 1, True, "WebShop [SEP] Search",
                                   f"q|{i}|{t}", f"bad {i} {t}")):
                cols[k].append(v)
    return StepBatch.from_lists(**cols, state_extra=["Selected options: none."] * len(cols["uid"]))


def test_all_invalid_main_job_case_gets_unit_size_noise_without_zero_signal():
    # the behaviour zero_signal exists for: G_t differs with t (-0.1, -0.195, ...), the depth-0 pool
    # mixes step indices, so C != 0 and C / std_u C is of unit size although no trajectory did better
    out = compute_advantages(_all_invalid_batch(), AdvantageConfig(zero_signal="off"))
    assert out.diagnostics["adv/std"] > 0.5
    assert out.diagnostics["adv/frac_equal_return_steps"] == 1.0


@pytest.mark.parametrize("name", ALL)
def test_zero_signal_zeroes_every_term_of_the_all_invalid_case(name):
    batch = _all_invalid_batch()
    for cfg in (AdvantageConfig(estimator=name, zero_signal=True), config_from_preset("candidate", estimator=name),
                AdvantageConfig(estimator=name, zero_signal=True, potential_estimator="graph", credit="action", credit_lambda=0.0,
                                max_steps=4)):
        out = compute_advantages(batch, cfg, HashEncoder() if name == "progpo" else None)
        assert np.all(out.advantages == 0.0)
        assert out.diagnostics["adv/frac_zero"] == 1.0


def _mixed_batch() -> StepBatch:
    """Task q: the all-invalid case (no signal); task w: returns 10, 0, 10 - 0.1 (a signal)."""
    b = _all_invalid_batch(n_traj=3, length=2)
    cols = {k: list(getattr(b, k)) for k in ("uid", "traj_id", "step_index", "reward", "terminated", "truncated",
                                             "invalid", "anchor_obs", "prefix_key", "action")}
    rows = [(10, 0, "room", "go", 0.0, False), (10, 1, "desk", "take", 10.0, True),
            (11, 0, "room", "wait", 0.0, False), (11, 1, "room", "wait", 0.0, True),
            (12, 0, "room", "bad", -0.1, False), (12, 1, "room", "go", 0.0, False), (12, 2, "desk", "take", 10.0, True)]
    for tid, t, obs, act, r, done in rows:
        for k, v in zip(cols, ("w", tid, t, r, done, False, act == "bad", obs, f"w|{tid}|{t}", act)):
            cols[k].append(v)
    return StepBatch.from_lists(**cols)


@pytest.mark.parametrize("name", ALL)
def test_zero_signal_leaves_tasks_with_a_signal_alone(name):
    batch = _mixed_batch()
    flat = batch.uid == "q"
    off = compute_advantages(batch, AdvantageConfig(estimator=name)).advantages
    on = compute_advantages(batch, AdvantageConfig(estimator=name, zero_signal=True))
    # task statistics are per task, so the other task's advantages do not move (bit for bit)
    np.testing.assert_array_equal(on.advantages[~flat], off[~flat])
    assert np.all(on.advantages[flat] == 0.0)
    assert np.any(on.advantages[~flat] != 0.0)
    # 6 of the 13 steps belong to the task without a signal
    assert on.diagnostics["adv/frac_equal_return_steps"] == pytest.approx(6 / 13)


def test_equal_returns_reached_at_different_times_count_as_no_signal():
    # R = 10 for both trajectories (success at t=0 vs t=1): G differs by the discount, but the episode
    # returns carry no signal; zero_signal zeroes GiGPO's step term too (that is the decision)
    batch = StepBatch.from_lists(
        uid=["u"] * 3, traj_id=[0, 1, 1], step_index=[0, 0, 1], reward=[10.0, 0.0, 10.0],
        terminated=[True, False, True], truncated=[False] * 3, invalid=[False] * 3,
        anchor_obs=["s", "s", "t"], prefix_key=["a", "a", "b"], action=["x", "y", "x"])
    off = compute_advantages(batch, AdvantageConfig(estimator="gigpo")).advantages
    assert off[0] > 0 > off[1]  # GiGPO as published: the faster success wins the step comparison
    on = compute_advantages(batch, AdvantageConfig(estimator="gigpo", zero_signal=True)).advantages
    assert np.all(on == 0.0)


def test_zero_signal_equals_the_loop_oracle_on_random_batches():
    from progpo_tests.reference import reference_progpo

    hits = 0
    for seed in range(20):
        batch = random_batch(seed, max_traj=3, max_len=2)
        cfg = AdvantageConfig(zero_signal=True, credit_lambda=0.8)
        got = compute_advantages(batch, cfg, HashEncoder()).advantages
        np.testing.assert_allclose(got, reference_progpo(batch, cfg, HashEncoder()), rtol=1e-8, atol=1e-8)
        hits += int(np.any(compute_advantages(batch, cfg).diagnostics["adv/frac_equal_return_steps"] > 0))
    assert hits > 0  # some random batches do have tasks without a signal


def test_product_default_gives_exact_zeros_on_a_batch_without_signal():
    # issue 10: ProGPO's product default (zero_signal task) zeroes a batch in which no task has a return
    # spread (the main job's every-return--0.4 batch); by hand: every advantage is exactly 0.0; the batch
    # scope does the same
    cfg = AdvantageConfig()
    assert (cfg.estimator, cfg.zero_signal) == ("progpo", "task")
    assert compute_advantages(_all_invalid_batch(), AdvantageConfig(zero_signal="batch"), HashEncoder()
                              ).advantages.tolist() == [0.0] * 16
    out = compute_advantages(_all_invalid_batch(), cfg, HashEncoder())
    assert out.advantages.tolist() == [0.0] * 16
    # two tasks, each flat but at different returns (-0.4 and 10): still no signal anywhere -> zeros
    b = _all_invalid_batch(n_traj=2, length=2)
    cols = {k: list(getattr(b, k)) for k in ("uid", "traj_id", "step_index", "reward", "terminated", "truncated",
                                             "invalid", "anchor_obs", "prefix_key", "action", "state_extra")}
    for tid, t, r in ((10, 0, 0.0), (10, 1, 10.0), (11, 0, 10.0)):
        for k, v in zip(cols, ("w", tid, t, r, t == 1 or tid == 11, False, False, f"o{t}", f"w|{tid}|{t}", "go",
                               "")):
            cols[k].append(v)
    # judged on the sum R (the former default) no task has a signal -> zeros; the default judges on G_0,
    # where the two wins at different lengths (G_0 = 9.5 and 10) differ, so that task keeps its credit
    b2 = StepBatch.from_lists(**cols)
    out = compute_advantages(b2, AdvantageConfig(zero_signal_return="sum"), HashEncoder())
    assert out.advantages.tolist() == [0.0] * 7
    assert cfg.zero_signal_return == "discounted"
    assert np.any(compute_advantages(b2, cfg, HashEncoder()).advantages != 0.0)
    # the paper reading keeps its unit-size noise on the same batch
    assert compute_advantages(_all_invalid_batch(), config_from_preset("paper"), HashEncoder()).diagnostics[
        "adv/std"] > 0.5


@pytest.mark.parametrize("name", ALL)
def test_batch_scope_leaves_a_batch_with_any_signal_alone(name):
    # zero_signal='batch' acts only when no task has a signal: on the mixed batch it changes nothing
    batch = _mixed_batch()
    off = compute_advantages(batch, AdvantageConfig(estimator=name, zero_signal="off"), HashEncoder()).advantages
    scoped = compute_advantages(batch, AdvantageConfig(estimator=name, zero_signal="batch"), HashEncoder()).advantages
    np.testing.assert_array_equal(scoped, off)
    # CRBC's and GRAFT's values are on the binary outcome, which an all-failed task leaves at 0 everywhere, and
    # G2PO's released code reads the outcome without penalties and charges every invalid step the same
    assert np.any(scoped[batch.uid == "q"] != 0.0) or name in ("grpo", "rloo", "crbc", "graft", "g2po")


def test_zero_signal_values():
    assert AdvantageConfig(zero_signal=True).zero_signal == "task"
    assert AdvantageConfig(zero_signal=False).zero_signal == "off"
    for name in ALL:  # auto: batch for ProGPO only; the baselines keep their published behaviour
        assert AdvantageConfig(estimator=name).zero_signal == ("task" if name == "progpo" else "off")
    with pytest.raises(ValueError, match="zero_signal"):
        AdvantageConfig(zero_signal="on")


def test_batch_scope_equals_the_loop_oracle():
    from progpo_tests.reference import reference_progpo

    for batch in (_all_invalid_batch(), _mixed_batch()):
        cfg = AdvantageConfig(zero_signal="batch", semantic_expansion=False)
        np.testing.assert_allclose(compute_advantages(batch, cfg).advantages, reference_progpo(batch, cfg, None),
                                   rtol=1e-8, atol=1e-8)


def _two_successes_batch() -> StepBatch:
    """One task, two successes of equal return R = 10 at different lengths: traj 0 room -> desk -> +10
    (2 steps), traj 1 room -> +10 (1 step). gamma = 0.95: G_0 = 9.5 and 10, so the faster one is better."""
    return StepBatch.from_lists(
        uid=["u"] * 3, traj_id=[0, 0, 1], step_index=[0, 1, 0], reward=[0.0, 10.0, 10.0],
        terminated=[False, True, True], truncated=[False] * 3, invalid=[False] * 3,
        anchor_obs=["room", "desk", "room"], prefix_key=["u|0|room", "u|1|desk", "u|0|room"],
        action=["go desk", "put pen", "put pen"])


def test_zero_signal_return_discounted_keeps_the_faster_success_by_hand():
    batch = _two_successes_batch()
    sd = 0.25 * np.sqrt(2.0)  # sample std of the room group's G (9.5, 10)
    cases = {
        # GiGPO: A^E = 0 (equal R); room group (9.5, 10), mean 9.75; the desk step is alone (0)
        "gigpo": [-0.25 / (sd + 1e-6), 0.0, 0.25 / (sd + 1e-6)],
        # ProGPO's default: A^E = 0; the t = 0 peer group holds the whole task (rho = 0); Phi(room) = 9.75,
        # Phi(desk) = 10; C = (0 + 0.95 * 10 - 9.75, 10 - 10, 10 - 9.75) = (-0.25, 0, 0.25), std_u C = 0.25;
        # GAE (gamma lambda = 0.76) adds 0.76 * 0 to the first step; RMS sqrt(2/3) < 1: no cap
        "progpo": [-0.25 / (0.25 + 1e-6), 0.0, 0.25 / (0.25 + 1e-6)],
    }
    for name, want in cases.items():
        summed = compute_advantages(batch, AdvantageConfig(estimator=name, zero_signal="task",
                                                           zero_signal_return="sum"))
        assert np.all(summed.advantages == 0.0)  # equal R: no signal by the sum
        got = compute_advantages(batch, AdvantageConfig(estimator=name, zero_signal="task",
                                                        zero_signal_return="discounted"))
        assert got.advantages == pytest.approx(want, abs=1e-9), name
        assert got.diagnostics["adv/frac_equal_return_steps"] == 0.0
    # ProGPO's default is this reading (zero_signal task, judged on G_0)
    default = compute_advantages(batch, AdvantageConfig())
    assert default.advantages == pytest.approx(cases["progpo"], abs=1e-9)


@pytest.mark.parametrize("name", ALL)
def test_zero_signal_return_discounted_still_zeroes_equal_reward_sequences(name):
    # the main job's all-invalid batch: every trajectory -0.1 at every step, so G_0 is equal too
    cfg = AdvantageConfig(estimator=name, zero_signal="task", zero_signal_return="discounted")
    out = compute_advantages(_all_invalid_batch(), cfg)
    assert np.all(out.advantages == 0.0)
    with pytest.raises(ValueError, match="zero_signal_return"):
        AdvantageConfig(zero_signal_return="mean")


@pytest.mark.parametrize("estimator", [str(e) for e in ESTIMATORS])
@pytest.mark.parametrize("zero_signal_return", ["sum", "discounted"])
def test_timing_scale_spread_is_refused_where_it_would_do_nothing(estimator, zero_signal_return):
    """``spread`` acts only in ProGPO with ``zero_signal_return='discounted'`` (``timing_factor`` is 1 with
    ``sum``; no other estimator calls it): elsewhere the option was taken and silently did nothing."""
    cfg = dict(estimator=estimator, zero_signal_return=zero_signal_return)
    if estimator == "progpo" and zero_signal_return == "discounted":
        assert AdvantageConfig(timing_scale="spread", **cfg).timing_scale == "spread"
    else:
        with pytest.raises(ValueError, match=r"^AdvantageConfig\.timing_scale='spread' .*"
                                             rf"estimator='progpo'.*zero_signal_return='discounted'.*{estimator}"):
            AdvantageConfig(timing_scale="spread", **cfg)
    assert AdvantageConfig(timing_scale="unit", **cfg).timing_scale == "unit"  # the default fits every estimator


def test_timing_scale_spread_scales_the_timing_only_task_by_its_return_spread_by_hand():
    # task u: the two successes above (G_0 = 9.5, 10; sample std 0.5 / sqrt 2); task v: one success, one
    # failure in one step each (G_0 = 10, 0; sample std 10 / sqrt 2): factor for u = 0.05, v keeps 1
    two = _two_successes_batch()
    rows = {c: list(getattr(two, c)) for c in ("uid", "traj_id", "step_index", "reward", "terminated", "truncated",
                                                "invalid", "anchor_obs", "prefix_key", "action")}
    for c, vals in (("uid", ["v", "v"]), ("traj_id", [2, 3]), ("step_index", [0, 0]), ("reward", [10.0, 0.0]),
                    ("terminated", [True, True]), ("truncated", [False, False]), ("invalid", [False, False]),
                    ("anchor_obs", ["hall", "hall"]), ("prefix_key", ["v|0|hall"] * 2), ("action", ["buy", "buy"])):
        rows[c] += vals
    batch = StepBatch.from_lists(**rows)
    cfg = AdvantageConfig(zero_signal_return="discounted", timing_scale="spread")
    # v: A^E = +-5 / (sd + eps); C = +-5 (Phi(hall) = 5), C^ = +-5 / (sd + eps); rho = 0 (whole-task peer group)
    v = 5.0 / (10.0 / np.sqrt(2.0) + 1e-6)
    u = 0.25 / (0.25 + 1e-6)  # ProGPO's credit on u, as in the test above
    want = [-0.05 * u, 0.0, 0.05 * u, 2 * v, -2 * v]  # RMS sqrt((4 v^2 + 2 (0.05 u)^2) / 5) < 1: no cap
    got = compute_advantages(batch, cfg).advantages
    assert got == pytest.approx(want, abs=1e-9)
    unit = compute_advantages(batch, AdvantageConfig(zero_signal_return="discounted")).advantages
    f = 1.0 / np.sqrt((2 * u * u + 8 * v * v) / 5)  # unit: RMS sqrt(6 / 5) > 1, so rms_cap scales the batch
    assert unit == pytest.approx([-u * f, 0.0, u * f, 2 * v * f, -2 * v * f], abs=1e-9)


# an episode: (length 1..4, final reward 0 or 10, observation of each step from a small set)
_EPISODE = st.tuples(st.integers(1, 4), st.sampled_from([0.0, 10.0]), st.lists(st.sampled_from("abc"), min_size=4,
                                                                                 max_size=4))


@settings(max_examples=60, deadline=None)
@given(tasks=st.lists(st.lists(_EPISODE, min_size=1, max_size=4), min_size=1, max_size=4))
def test_zero_signal_return_discounted_changes_only_the_timing_only_tasks(tasks):
    # every form of task: one episode, all won at equal or different lengths, all lost, mixed; with
    # rms_cap = 0 each task's advantages depend on that task alone, so per task: equal G_0 -> 0; an R
    # spread -> as with the sum; equal R but unequal G_0 -> as without zeroing (zero_signal off)
    cols = {k: [] for k in ("uid", "traj_id", "step_index", "reward", "terminated", "truncated", "invalid",
                            "anchor_obs", "prefix_key", "action")}
    g0, tid = {}, 0
    for u, episodes in enumerate(tasks):
        for length, final, obs in episodes:
            for t in range(length):
                last = t == length - 1
                row = (f"u{u}", tid, t, final if last else 0.0, last and final > 0, last and final == 0, False,
                       obs[t], f"u{u}|{t}|{''.join(obs[:t + 1])}", "act")
                for k, v in zip(cols, row):
                    cols[k].append(v)
            g0.setdefault(u, []).append(final * 0.95 ** (length - 1))
            tid += 1
    batch = StepBatch.from_lists(**cols)
    task = np.asarray([int(x[1:]) for x in cols["uid"]])
    r_equal = {u: len({e[1] for e in eps}) == 1 for u, eps in enumerate(tasks)}
    g_equal = {u: max(v) - min(v) <= 1e-12 * max(abs(x) for x in v) for u, v in g0.items()}
    for name in ALL:
        kw = dict(estimator=name, rms_cap=0.0, semantic_expansion=False)
        disc = compute_advantages(batch, AdvantageConfig(**kw, zero_signal="task", zero_signal_return="discounted"))
        summed = compute_advantages(batch, AdvantageConfig(**kw, zero_signal="task")).advantages
        off = compute_advantages(batch, AdvantageConfig(**kw, zero_signal="off")).advantages
        for u in range(len(tasks)):
            rows = task == u
            want = 0.0 * off[rows] if g_equal[u] else (summed[rows] if not r_equal[u] else off[rows])
            np.testing.assert_array_equal(disc.advantages[rows], want, err_msg=f"{name} task {u}")
