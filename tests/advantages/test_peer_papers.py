"""Hand-computed PGPO (arXiv 2609.02236), CRBC (arXiv 2609.35082) and GRAFT (arXiv 2609.28963) on one group.

One task, four rollouts, anchor states ``s`` (start), ``m`` (shared by three rollouts) and ``d`` (a dead end);
success reward 10, no invalid actions:

* t1: s -a-> m -b-> success (r = 10 on the last step)
* t2: s -c-> m -e-> failure (terminated, r = 0)
* t3: s -f-> d -g-> cut by the step limit (truncated, r = 0)
* t4: s -a-> m -b-> success (r = 10)

Every expected number is derived in the comments from the paper's equations, by hand; the vectorised
estimators are never called to produce one. ``eps = 1e-6`` shifts the standardised values by about 1e-6
of themselves, hence the tolerance.
"""

from math import sqrt

import pytest

from progpo.advantages import AdvantageConfig, compute_advantages, config_from_preset
from progpo.advantages.batch import StepBatch

# (traj, t, obs, action, reward, terminated, truncated)
ROWS = [
    (1, 0, "s", "a", 0.0, False, False), (1, 1, "m", "b", 10.0, True, False),
    (2, 0, "s", "c", 0.0, False, False), (2, 1, "m", "e", 0.0, True, False),
    (3, 0, "s", "f", 0.0, False, False), (3, 1, "d", "g", 0.0, False, True),
    (4, 0, "s", "a", 0.0, False, False), (4, 1, "m", "b", 10.0, True, False),
]
NAMES = ["t1s", "t1m", "t2s", "t2m", "t3s", "t3d", "t4s", "t4m"]
TOL = 1e-5


def _batch() -> StepBatch:
    return StepBatch.from_lists(
        uid=["task"] * len(ROWS), traj_id=[r[0] for r in ROWS], step_index=[r[1] for r in ROWS],
        anchor_obs=[r[2] for r in ROWS], action=[r[3] for r in ROWS], reward=[r[4] for r in ROWS],
        terminated=[r[5] for r in ROWS], truncated=[r[6] for r in ROWS], invalid=[False] * len(ROWS),
        prefix_key=[f"{r[0]}|{r[1]}" for r in ROWS],
    )


def _run(cfg: AdvantageConfig) -> dict[str, float]:
    return dict(zip(NAMES, compute_advantages(_batch(), cfg).advantages.tolist()))


def _check(got: dict[str, float], want: dict[str, float]) -> None:
    for name, value in want.items():
        assert got[name] == pytest.approx(value, rel=TOL, abs=TOL), name


def test_pgpo_hand_computed():
    # eta = 0.95 (eq. 1): G = 9.5, 10 on t1 and t4; 0 elsewhere.
    # A^S (eq. 3, sample std): at s, G = [9.5, 0, 0, 9.5] -> +-4.75 / (4.75 * 2/sqrt3) = +-sqrt3/2;
    #   at m, G = [10, 0, 10]: mean 20/3, deviations 10/3, -20/3, sample std sqrt(100/3) -> 1/sqrt3, -2/sqrt3;
    #   d is a singleton -> 0.
    # Phi (eq. 6): Phi(s) = 4.75, Phi(m) = 20/3, Phi(d) = 0.
    # delta (eq. 7, gamma = 1): s->m: 20/3 - 4.75 = 23/12 (t1, t2, t4); s->d: 0 - 4.75;
    #   last steps use r_final: t1, t4: 10 - 20/3 = 10/3; t2: 0 - 20/3; t3: 0 - 0 = 0.
    # A^phi (eq. 8): at s, [x, x, y, x] -> deviations d, d, -3d (x 3 times), sample std 2d -> 0.5, -1.5;
    #   at m, [10/3, -20/3, 10/3] -> 1/sqrt3, -2/sqrt3; d singleton -> 0.
    # w (eqs. 9-10): p_succ = 2/4, w = 1 * (1 - 0.5)^2 = 0.25.  A = A^S + w A^phi (eq. 11), no episode term.
    got = _run(config_from_preset("pgpo", estimator="pgpo"))
    h, r3 = sqrt(3) / 2, 1 / sqrt(3)
    want = {"t1s": h + 0.25 * 0.5, "t1m": r3 + 0.25 * r3, "t2s": -h + 0.25 * 0.5, "t2m": -2 * r3 - 0.25 * 2 * r3,
            "t3s": -h - 0.25 * 1.5, "t3d": 0.0, "t4s": h + 0.25 * 0.5, "t4m": r3 + 0.25 * r3}
    _check(got, want)
    # the two failed first steps are told apart by where they lead (the paper's point): c reaches m, f a dead end
    assert got["t2s"] - got["t3s"] == pytest.approx(0.25 * 2.0, rel=TOL)


def test_pgpo_weight_follows_alpha_and_beta():
    # alpha = 1, beta = 2: w = 2 * 0.5 = 1; only the A^phi share changes
    got = _run(config_from_preset("pgpo", estimator="pgpo", pgpo_alpha=1.0, pgpo_beta=2.0))
    _check(got, {"t3s": -sqrt(3) / 2 - 1.5, "t1m": 2 / sqrt(3)})


def test_crbc_hand_computed():
    # beta = 0.98. Counts (eq. 5): s: a x2 -> m, c -> m, f -> d (N(s) = 4); m: b x2 -> z+, e -> z- (N(m) = 3);
    # d: g -> z- (t3 was cut by the step limit: a failure, Sec. 3).
    # V (eqs. 8-9): V(d) = 0; V(m) = 0.98 * 2/3; V(s) = 0.98 * (3/4) V(m) = 0.4802.
    # Q = beta sum_x P V(x): Q(s,a) = Q(s,c) = 0.98 V(m) = 0.640266..; Q(s,f) = 0; Q(m,b) = 0.98; Q(m,e) = 0.
    # Q - V at s: a, c: x = 0.16006..; f: -0.4802 = -3x. sigma^2 = (3/4) x^2 + (1/4) 9x^2 = 3x^2 (eq. 13's
    #   sigma, Prop. 2) -> credit x / (sqrt3 x) = 1/sqrt3, f: -sqrt3.
    # at m: b: y = 0.98/3, e: -2y; sigma^2 = (2/3) y^2 + (1/3) 4y^2 = 2y^2 -> 1/sqrt2, -sqrt2.
    # d: one action -> 0 (eq. 13's gate). Both sigmas exceed sigma_min = 0.1.
    # A^G (eq. 3): R = [10, 0, 0, 10], mean 5, sample std sqrt(100/3) -> +-sqrt3/2.
    # A = 1 * A^G + 5 * A^S (eq. 14).
    got = _run(config_from_preset("crbc", estimator="crbc"))
    g = sqrt(3) / 2
    want = {"t1s": g + 5 / sqrt(3), "t1m": g + 5 / sqrt(2), "t2s": -g + 5 / sqrt(3), "t2m": -g - 5 * sqrt(2),
            "t3s": -g - 5 * sqrt(3), "t3d": -g, "t4s": g + 5 / sqrt(3), "t4m": g + 5 / sqrt(2)}
    _check(got, want)


def test_crbc_sigma_floor_caps_small_credit():
    # sigma_min = 1: sigma(s) = sqrt3 x = 0.2772.. and sigma(m) = sqrt2 * 0.98/3 = 0.4620.. are below it, so
    # the credit is Q - V itself: s: a, c: x = 0.98 * 0.98 * 2/3 - 0.4802 = 0.160066..; m, b: 0.98/3.
    got = _run(config_from_preset("crbc", estimator="crbc", crbc_sigma_min=1.0, beta_episode=0.0, omega=1.0))
    x = 0.98 * 0.98 * 2 / 3 - 0.98 * 0.75 * 0.98 * 2 / 3
    _check(got, {"t1s": x, "t3s": -3 * x, "t1m": 0.98 / 3, "t2m": -2 * 0.98 / 3, "t3d": 0.0})


# GRAFT, gamma = 0.99: sinks z+ (t1, t4: value 1) and z- (t2, t3: value 0) (Sec. 3.1).
# V (eq. 5): V(m) = 0.99 * 2/3 = 0.66, V(d) = 0, V(s) = 0.99 * (3/4) * 0.66 = 0.49005.
# TD (eq. 8): s -a/c-> m: 0.99 * 0.66 - 0.49005 = 0.16335; s -f-> d: -0.49005; m -b-> z+: 0.99 - 0.66 = 0.33;
#   m -e-> z-: -0.66; d -g-> z-: 0.
# Graph GAE (eqs. 9-10): a first step has one later step (k = 1): the mean TD over the distinct edges leaving
#   its head; leaving m: (m,b,z+) and (m,e,z-): (0.33 - 0.66) / 2 = -0.165; leaving d: 0. So
#   s -> m: 0.16335 + 0.99 * lam * (-0.165); s -> d: -0.49005. Last steps have no tail.
X0, Y0 = 0.16335, -0.49005


def _graft_first_step(lam: float) -> float:
    return X0 + 0.99 * lam * (-0.165)


def test_graft_hand_computed():
    # eq. 11 inside each node's step group: at s the values are [x, x, y, x] -> deviations d, d, -3d, sample
    #   std 2d -> 0.5, 0.5, -1.5, 0.5 (whatever lam); at m [0.33, -0.66, 0.33] -> 1/sqrt3, -2/sqrt3;
    #   d: one edge: mean 0, std |A| -> A / |A| = 0 here (A = 0).
    got = _run(config_from_preset("graft", estimator="graft"))
    r3 = 1 / sqrt(3)
    _check(got, {"t1s": 0.5, "t2s": 0.5, "t3s": -1.5, "t4s": 0.5, "t1m": r3, "t2m": -2 * r3, "t4m": r3, "t3d": 0.0})


@pytest.mark.parametrize("lam", [0.0, 0.95, 0.8])
def test_graft_graph_gae_mean_norm(lam):
    # mean_norm keeps the scale, so the GAE tail shows: at s the mean of [x, x, y, x] is subtracted
    x = _graft_first_step(lam)
    mu = (3 * x + Y0) / 4
    got = _run(config_from_preset("graft", estimator="graft", graft_lambda=lam, gigpo_mode="mean_norm"))
    _check(got, {"t1s": x - mu, "t3s": Y0 - mu, "t1m": 0.33, "t2m": -0.66, "t3d": 0.0})
    if lam == 0.0:  # TD(0): the mean TD of a node's visits is 0 at the fixed point (eq. 5), so nothing is subtracted
        assert got["t1s"] == pytest.approx(X0, rel=TOL)


def test_presets_need_their_own_estimator():
    with pytest.raises(ValueError, match="preset 'crbc'.*crbc"):
        config_from_preset("crbc", estimator="gigpo")


def test_graft_one_edge_node_is_normalised_by_its_own_size():
    # t1, t4: s -a-> k -c-> m -e-> success; t2: s -b-> m -f-> failure; t3: s -b-> m -e-> success (gamma 0.99).
    # V(m) = 0.99 * 3/4; V(k) = 0.99 V(m), so k's own TD is 0; its tail (one hop): the distinct edges leaving m,
    # (m,e,z+): 0.99 - V(m) = 0.99/4 and (m,f,z-): -V(m) = -0.99 * 3/4, mean -0.99/4, so
    # A^GAE(k) = 0.99 * lam * (-0.99/4) < 0 on both visits. k has one out-edge (k,c,m): eq. 11's mean 0, std |A|
    # -> -1 on each visit (0 when lam = 0), where standardising its two equal visits would give 0.
    rows = [(1, 0, "s", "a", 0.0, False), (1, 1, "k", "c", 0.0, False), (1, 2, "m", "e", 10.0, True),
            (2, 0, "s", "b", 0.0, False), (2, 1, "m", "f", 0.0, True),
            (3, 0, "s", "b", 0.0, False), (3, 1, "m", "e", 10.0, True),
            (4, 0, "s", "a", 0.0, False), (4, 1, "k", "c", 0.0, False), (4, 2, "m", "e", 10.0, True)]
    batch = StepBatch.from_lists(
        uid=["u"] * 10, traj_id=[r[0] for r in rows], step_index=[r[1] for r in rows],
        anchor_obs=[r[2] for r in rows], action=[r[3] for r in rows], reward=[r[4] for r in rows],
        terminated=[r[5] for r in rows], truncated=[False] * 10, invalid=[False] * 10,
        prefix_key=[str(k) for k in range(10)])
    for lam, want in ((0.95, -1.0), (0.0, 0.0)):
        got = compute_advantages(batch, config_from_preset("graft", graft_lambda=lam)).advantages
        assert got[1] == pytest.approx(want, abs=TOL) and got[8] == pytest.approx(want, abs=TOL)
    got = compute_advantages(batch, config_from_preset("graft", graft_lambda=0.5, gigpo_mode="mean_norm")).advantages
    assert got[1] == pytest.approx(0.99 * 0.5 * (-0.99 / 4), rel=TOL)


@pytest.mark.parametrize("seed", range(20))
def test_closure_is_the_linear_solve_of_crbc_eq_9(seed):
    # the value iteration stops at the fixed point that CRBC's one linear solve gives: (I - beta M) V = beta m+
    import numpy as np

    from progpo.advantages._prep import prepare
    from progpo.advantages.closure import closure
    from benchmarks.synthetic_batches import random_batch

    p = prepare(random_batch(seed), AdvantageConfig(estimator="crbc"))
    for beta in (0.5, 0.98, 1.0):
        g = closure(p, beta)
        m = np.zeros((g.n, g.n))
        inner = g.succ < g.n
        np.add.at(m, (g.node[inner], g.succ[inner]), 1.0)
        visits = np.bincount(g.node, minlength=g.n)
        m /= visits[:, None]
        plus = np.bincount(g.node, weights=(g.succ == g.n).astype(float), minlength=g.n) / visits
        np.testing.assert_allclose(g.values[:g.n], np.linalg.solve(np.eye(g.n) - beta * m, beta * plus),
                                   rtol=1e-12, atol=1e-12)
        assert g.values[g.n] == 1.0 and g.values[g.n + 1] == 0.0
