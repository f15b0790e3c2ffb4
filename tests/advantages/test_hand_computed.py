"""Hand-computed advantages for every estimator on one small batch (2 tasks x 3 trajectories).

The batch has unequal trajectory lengths (3/4/2 and 1/2/2), a revisited state (a2 sees "bed" twice,
b2 sees "hall" twice), one invalid action (a2 t1, penalty -0.1) and one truncated trajectory (a2).
gamma = 0.5 keeps the returns-to-go simple. Expected values are written out with the spec's formulas
using only Python's ``statistics`` module (sample mean/stdev), never our estimator code.
"""

from math import sqrt
from statistics import mean, stdev, variance

import numpy as np
import pytest

from progpo.advantages import AdvantageConfig, compute_advantages, config_from_preset
from progpo.advantages.batch import StepBatch

EPS = 1e-6
GAMMA = 0.5

# (uid, traj, t, obs, action, reward, terminated, truncated, invalid, prefix_key)
ROWS = [
    ("A", 1, 0, "room", "go desk", 0.0, False, False, False, "A|0|room"),
    ("A", 1, 1, "desk", "take pen", 0.0, False, False, False, "A|1|room>go desk>desk"),
    ("A", 1, 2, "holding pen", "go shelf", 10.0, True, False, False, "A|2|room>go desk>desk>take pen>holding pen"),
    ("A", 2, 0, "room", "go bed", 0.0, False, False, False, "A|0|room"),
    ("A", 2, 1, "bed", "jump around", -0.1, False, False, True, "A|1|room>go bed>bed"),
    ("A", 2, 2, "bed", "go desk", 0.0, False, False, False, "A|2|room>go bed>bed>jump around>bed"),
    ("A", 2, 3, "desk", "look", 0.0, False, True, False, "A|3|bed>jump around>bed>go desk>desk"),
    ("A", 3, 0, "room", "go desk", 0.0, False, False, False, "A|0|room"),
    ("A", 3, 1, "desk", "take pen", 0.0, True, False, False, "A|1|room>go desk>desk"),
    ("B", 4, 0, "hall", "open door", 10.0, True, False, False, "B|0|hall"),
    ("B", 5, 0, "hall", "wait", 0.0, False, False, False, "B|0|hall"),
    ("B", 5, 1, "hall", "open door", 10.0, True, False, False, "B|1|hall>wait>hall"),
    ("B", 6, 0, "hall", "go kitchen", 0.0, False, False, False, "B|0|hall"),
    ("B", 6, 1, "kitchen", "eat", 0.0, True, False, False, "B|1|hall>go kitchen>kitchen"),
]
NAMES = ["a1t0", "a1t1", "a1t2", "a2t0", "a2t1", "a2t2", "a2t3", "a3t0", "a3t1",
         "b1t0", "b2t0", "b2t1", "b3t0", "b3t1"]

# Returns-to-go G_t = r_t + 0.5 G_{t+1}:
G = {"a1t2": 10.0, "a1t1": 0 + 0.5 * 10, "a1t0": 0 + 0.5 * 5,
     "a2t3": 0.0, "a2t2": 0.0, "a2t1": -0.1 + 0.5 * 0, "a2t0": 0 + 0.5 * -0.1,
     "a3t1": 0.0, "a3t0": 0.0,
     "b1t0": 10.0, "b2t1": 10.0, "b2t0": 0 + 0.5 * 10, "b3t1": 0.0, "b3t0": 0.0}
# Episode returns R_i:
R = {"a1": 10.0, "a2": -0.1, "a3": 0.0, "b1": 10.0, "b2": 10.0, "b3": 0.0}
TASK_R = {"A": [10.0, -0.1, 0.0], "B": [10.0, 10.0, 0.0]}


def _batch(order=None) -> StepBatch:
    rows = ROWS if order is None else [ROWS[k] for k in order]
    return StepBatch.from_lists(
        uid=[r[0] for r in rows], traj_id=[r[1] for r in rows], step_index=[r[2] for r in rows],
        anchor_obs=[r[3] for r in rows], action=[r[4] for r in rows], reward=[r[5] for r in rows],
        terminated=[r[6] for r in rows], truncated=[r[7] for r in rows], invalid=[r[8] for r in rows],
        prefix_key=[r[9] for r in rows],
    )


def _run(**kw) -> dict[str, float]:
    # the paper's one-step credit unless a test asks for credit_lambda (the product default is 0.8), and the
    # spec's (7) unscaled unless a test asks for rms_cap (the product default caps the RMS at 1)
    kw = {"credit_lambda": 0.0, "rms_cap": 0.0, **kw}
    out = compute_advantages(_batch(), AdvantageConfig(gamma=GAMMA, eps=EPS, **kw))
    return dict(zip(NAMES, out.advantages.tolist()))


def _ae(name: str) -> float:
    """Episode term (1): (R_i - mean_u R) / (stdev_u R + eps)."""
    traj, task = name[:2], name[0].upper()
    return (R[traj] - mean(TASK_R[task])) / (stdev(TASK_R[task]) + EPS)


def _z(x: float, group: list[float]) -> float:
    """(x - mean) / (sample std + eps) inside a group of >= 2."""
    return (x - mean(group)) / (stdev(group) + EPS)


def _check(got: dict[str, float], want: dict[str, float]) -> None:
    for name in want:
        assert got[name] == pytest.approx(want[name], rel=1e-9, abs=1e-9), name


def test_returns_to_go_are_what_the_table_says():
    # sanity of the hand table itself: R_A = [10, -0.1, 0] has mean 3.3 and sample variance 33.67
    assert mean(TASK_R["A"]) == pytest.approx(3.3)
    assert variance(TASK_R["A"]) == pytest.approx((6.7**2 + 3.4**2 + 3.3**2) / 2)


def test_grpo_hand_computed():
    got = _run(estimator="grpo")
    # Task A: (10 - 3.3)/(sqrt(33.67)+eps), (-0.1 - 3.3)/(...), (0 - 3.3)/(...)
    # Task B: mean 20/3, stdev 10/sqrt(3): b1, b2 -> (10/3)/(10/sqrt3+eps); b3 -> (-20/3)/(...)
    sa, sb = sqrt(33.67), 10 / sqrt(3)
    want = {n: 6.7 / (sa + EPS) for n in ("a1t0", "a1t1", "a1t2")}
    want.update({n: -3.4 / (sa + EPS) for n in ("a2t0", "a2t1", "a2t2", "a2t3")})
    want.update({n: -3.3 / (sa + EPS) for n in ("a3t0", "a3t1")})
    want.update({n: (10 / 3) / (sb + EPS) for n in ("b1t0", "b2t0", "b2t1")})
    want.update({n: (-20 / 3) / (sb + EPS) for n in ("b3t0", "b3t1")})
    _check(got, want)


def test_grpo_mean_norm():
    got = _run(estimator="grpo", episode_norm="mean_norm")
    _check(got, {"a1t0": 10 - 3.3, "a2t3": -0.1 - 3.3, "b3t1": 0 - 20 / 3})


def test_rloo_hand_computed():
    got = _run(estimator="rloo")
    # A_i = R_i - mean of the other two returns of the task
    want = {"a1t0": 10 - (-0.1 + 0) / 2, "a2t2": -0.1 - (10 + 0) / 2, "a3t1": 0 - (10 - 0.1) / 2,
            "b1t0": 10 - (10 + 0) / 2, "b2t1": 10 - (10 + 0) / 2, "b3t0": 0 - (10 + 10) / 2}
    _check(got, want)


# Anchor-state groups (depth 0) with their G:
ROOM = [2.5, -0.05, 0.0]        # a1t0, a2t0, a3t0
DESK = [5.0, 0.0, 0.0]          # a1t1, a2t3 (other history), a3t1
BED = [-0.1, 0.0]               # a2t1, a2t2: the revisited state, same trajectory
HALL = [10.0, 5.0, 10.0, 0.0]   # b1t0, b2t0, b2t1 (revisit), b3t0
# singletons: "holding pen" (a1t2), "kitchen" (b3t1) -> A^S = 0


def test_gigpo_hand_computed():
    got = _run(estimator="gigpo")
    want = {
        "a1t0": _ae("a1t0") + _z(2.5, ROOM), "a2t0": _ae("a2t0") + _z(-0.05, ROOM),
        "a3t0": _ae("a3t0") + _z(0.0, ROOM),
        "a1t1": _ae("a1t1") + _z(5.0, DESK), "a2t3": _ae("a2t3") + _z(0.0, DESK),
        "a3t1": _ae("a3t1") + _z(0.0, DESK),
        "a1t2": _ae("a1t2") + 0.0,
        "a2t1": _ae("a2t1") + _z(-0.1, BED), "a2t2": _ae("a2t2") + _z(0.0, BED),
        "b1t0": _ae("b1t0") + _z(10.0, HALL), "b2t0": _ae("b2t0") + _z(5.0, HALL),
        "b2t1": _ae("b2t1") + _z(10.0, HALL), "b3t0": _ae("b3t0") + _z(0.0, HALL),
        "b3t1": _ae("b3t1") + 0.0,
    }
    _check(got, want)


def test_gigpo_mean_norm_and_omega():
    got = _run(estimator="gigpo", gigpo_mode="mean_norm", omega=0.5)
    _check(got, {"a1t1": _ae("a1t1") + 0.5 * (5.0 - mean(DESK)), "b2t0": _ae("b2t0") + 0.5 * (5.0 - mean(HALL))})


def test_hgpo_hand_computed():
    got = _run(estimator="hgpo", depths=1, hgpo_alpha=1.0)
    # Level 0 = anchor groups above (weight (0+1)^1 = 1); level 1 adds the previous (o, a):
    #   t=0 steps: (start, o_0) -> same members as level 0 at t=0 (room: 3 steps, hall: b1t0, b2t0, b3t0)
    #   a1t1, a3t1: (room, go desk, desk) -> [5, 0]; every other level-1 group is a singleton.
    # A^S = sum_k w_k A_k / sum_k w_k over levels with >= 2 members, w_1 = 2.
    hall0 = [10.0, 5.0, 0.0]
    want = {
        "a1t0": _ae("a1t0") + (1 * _z(2.5, ROOM) + 2 * _z(2.5, ROOM)) / 3,
        "a1t1": _ae("a1t1") + (1 * _z(5.0, DESK) + 2 * _z(5.0, [5.0, 0.0])) / 3,
        "a3t1": _ae("a3t1") + (1 * _z(0.0, DESK) + 2 * _z(0.0, [5.0, 0.0])) / 3,
        "a2t3": _ae("a2t3") + _z(0.0, DESK),          # level 1 (bed, go desk, desk) singleton
        "a2t2": _ae("a2t2") + _z(0.0, BED),
        "a1t2": _ae("a1t2"),                          # no level with a partner
        "b2t0": _ae("b2t0") + (1 * _z(5.0, HALL) + 2 * _z(5.0, hall0)) / 3,
        "b2t1": _ae("b2t1") + _z(10.0, HALL),         # level 1 (hall, wait, hall) singleton
        "b3t1": _ae("b3t1"),
    }
    _check(got, want)



# G2PO (arXiv 2606.22995). Graph nodes = the anchor groups above; node value V(n) = mean G over the visits:
#   task A: V(room) = (2.5 - 0.05 + 0)/3 = 2.45/3, V(desk) = (5 + 0 + 0)/3 = 5/3, V(holding pen) = 10,
#           V(bed) = (-0.1 + 0)/2 = -0.05;  task B: V(hall) = (10 + 5 + 10 + 0)/4 = 6.25, V(kitchen) = 0.
V_ROOM, V_DESK, V_PEN, V_BED, V_HALL, V_KITCHEN = 2.45 / 3, 5 / 3, 10.0, -0.05, 6.25, 0.0
# Edge value Q = r_t + gamma V(next node), V = 0 after a trajectory's last step (terminated or truncated):
G2PO_Q = {
    "a1t0": 0 + 0.5 * V_DESK,     # room -> desk            = 5/6
    "a1t1": 0 + 0.5 * V_PEN,      # desk -> holding pen     = 5
    "a1t2": 10.0 + 0.0,           # holding pen -> done     = 10
    "a2t0": 0 + 0.5 * V_BED,      # room -> bed             = -0.025
    "a2t1": -0.1 + 0.5 * V_BED,   # bed -> bed (invalid)    = -0.125
    "a2t2": 0 + 0.5 * V_DESK,     # bed -> desk             = 5/6
    "a2t3": 0.0 + 0.0,            # desk -> cut (truncated) = 0
    "a3t0": 0 + 0.5 * V_DESK,     # room -> desk            = 5/6
    "a3t1": 0.0 + 0.0,            # desk -> done            = 0
    "b1t0": 10.0 + 0.0,           # hall -> done            = 10
    "b2t0": 0 + 0.5 * V_HALL,     # hall -> hall            = 3.125
    "b2t1": 10.0 + 0.0,           # hall -> done            = 10
    "b3t0": 0 + 0.5 * V_KITCHEN,  # hall -> kitchen         = 0
    "b3t1": 0.0 + 0.0,            # kitchen -> done         = 0
}
G2PO_NODE_OF = {"a1t0": V_ROOM, "a2t0": V_ROOM, "a3t0": V_ROOM, "a1t1": V_DESK, "a2t3": V_DESK, "a3t1": V_DESK,
                "a1t2": V_PEN, "a2t1": V_BED, "a2t2": V_BED, "b1t0": V_HALL, "b2t0": V_HALL, "b2t1": V_HALL,
                "b3t0": V_HALL, "b3t1": V_KITCHEN}
# Node-relative term: Q normalised within each node's visits (singletons "holding pen", "kitchen" -> 0):
G2PO_NODES = [["a1t0", "a2t0", "a3t0"], ["a1t1", "a2t3", "a3t1"], ["a2t1", "a2t2"],
              ["b1t0", "b2t0", "b2t1", "b3t0"]]


def _g2po_want(edge: str, mode: str = "mean_std_norm", omega: float = 1.0, episode=_ae) -> dict[str, float]:
    """A = A^E + omega (A^node + A^edge); A^edge = TD error normalised over the task's steps (its graph).

    ``edge='td'``: delta = Q - V(node) (the textbook TD error r + gamma V(n') - V(n)); ``'progress'``:
    delta = Q - gamma V(node) (the released code's V(next) - V(node), both values discounted to the outcome).
    Task A, td:       a1t0 5/6 - 2.45/3 = 0.016667, a1t1 5 - 5/3 = 3.333333, a1t2 10 - 10 = 0,
                      a2t0 -0.025 - 2.45/3 = -0.841667, a2t1 -0.125 + 0.05 = -0.075, a2t2 5/6 + 0.05 = 0.883333,
                      a2t3 0 - 5/3, a3t0 0.016667, a3t1 -5/3;  task B: 10 - 6.25 = 3.75, 3.125 - 6.25 = -3.125,
                      3.75, -6.25, 0 - 0 = 0.
    Task A, progress: a1t0 5/6 - 0.5 * 2.45/3 = 0.425, a1t1 5 - 5/6 = 4.166667, a1t2 10 - 5 = 5, a2t0 -0.433333,
                      a2t1 -0.125 + 0.025 = -0.1, a2t2 0.858333, a2t3 -5/6, a3t0 0.425, a3t1 -5/6;
                      task B: 10 - 3.125 = 6.875, 0, 6.875, -3.125, 0.
    """
    base = 1.0 if edge == "td" else 0.5
    delta = {n: G2PO_Q[n] - base * G2PO_NODE_OF[n] for n in NAMES}
    norm = (lambda x, g: x - mean(g)) if mode == "mean_norm" else _z
    a_node = {n: 0.0 for n in NAMES}
    for group in G2PO_NODES:
        for n in group:
            a_node[n] = norm(G2PO_Q[n], [G2PO_Q[m] for m in group])
    a_edge = {}
    for task in "ab":
        members = [n for n in NAMES if n[0] == task]
        for n in members:
            a_edge[n] = norm(delta[n], [delta[m] for m in members])
    return {n: episode(n) + omega * (a_node[n] + a_edge[n]) for n in NAMES}


def test_g2po_hand_computed():
    got = _run(estimator="g2po", g2po_reading="text")
    _check(got, _g2po_want("td"))
    # spot-check one row written out in full: b2t0 (hall -> hall, Q = 3.125, delta = -3.125)
    want_b2t0 = (_ae("b2t0") + _z(3.125, [10.0, 3.125, 10.0, 0.0])
                 + _z(-3.125, [3.75, -3.125, 3.75, -6.25, 0.0]))
    assert got["b2t0"] == pytest.approx(want_b2t0, rel=1e-9, abs=1e-9)
    # the end of a one-visit chain: holding pen -> done has Q = V(node) = 10, so td gives it no edge credit
    # beyond the task's mean, and no node-relative term (singleton)
    assert got["a1t2"] == pytest.approx(_ae("a1t2") + _z(0.0, [5 / 6 - 2.45 / 3, 10 / 3, 0.0, -0.025 - 2.45 / 3,
                                                                 -0.075, 5 / 6 + 0.05, -5 / 3, 5 / 6 - 2.45 / 3,
                                                                 -5 / 3]), rel=1e-9)


def test_g2po_progress_edge_mean_norm_and_omega():
    _check(_run(estimator="g2po", g2po_reading="text", g2po_edge="progress"), _g2po_want("progress"))
    got = _run(estimator="g2po", g2po_reading="text", g2po_edge="progress", gigpo_mode="mean_norm",
               episode_norm="mean_norm", omega=0.5)
    want = _g2po_want("progress", mode="mean_norm", omega=0.5,
                      episode=lambda n: R[n[:2]] - mean(TASK_R[n[0].upper()]))
    # mean_norm drops every division: a1t2 = (10 - 3.3) + 0.5 * (0 + (5 - mean of task A's progress deltas))
    deltas_a = [0.425, 5 - 5 / 6, 5.0, -0.025 - 2.45 / 6, -0.1, 5 / 6 + 0.025, -5 / 6, 0.425, -5 / 6]
    assert want["a1t2"] == pytest.approx((10 - 3.3) + 0.5 * (5.0 - mean(deltas_a)))
    _check(got, want)

# G2PO, the released code's reading (g2po_reading = released), gamma = 0.95 as the code hard-codes:
# episode outcomes without the penalty O = a1 10, a2 0, a3 0, b1 10, b2 10, b3 0; node values = mean over visits
# of 0.95^(T - t) O: room (a1t0 0.95^3 10 = 8.57375, a2t0 0, a3t0 0) -> 8.57375/3; desk (a1t1 0.95^2 10 = 9.025,
# a2t3 0, a3t1 0) -> 9.025/3; holding pen 9.5; bed 0; hall (9.5, 9.025, 9.5, 0) -> 7.00625; kitchen 0.
V_REL = {"room": 8.57375 / 3, "desk": 9.025 / 3, "holding pen": 9.5, "bed": 0.0, "hall": 28.025 / 4, "kitchen": 0.0}
NODE_OF = {"a1t0": "room", "a1t1": "desk", "a1t2": "holding pen", "a2t0": "room", "a2t1": "bed", "a2t2": "bed",
           "a2t3": "desk", "a3t0": "room", "a3t1": "desk", "b1t0": "hall", "b2t0": "hall", "b2t1": "hall",
           "b3t0": "hall", "b3t1": "kitchen"}
# next node's value, or after the last step 10 for a success (a1, b1, b2) and 0 otherwise (a2 cut, a3, b3)
NEXT_REL = {"a1t0": V_REL["desk"], "a1t1": 9.5, "a1t2": 10.0, "a2t0": 0.0, "a2t1": 0.0, "a2t2": V_REL["desk"],
            "a2t3": 0.0, "a3t0": V_REL["desk"], "a3t1": 0.0, "b1t0": 10.0, "b2t0": V_REL["hall"], "b2t1": 10.0,
            "b3t0": 0.0, "b3t1": 0.0}
PEN = {n: (0.1 if n == "a2t1" else 0.0) for n in NAMES}  # the one invalid step
OUTCOME = {"a1": 10.0, "a2": 0.0, "a3": 0.0, "b1": 10.0, "b2": 10.0, "b3": 0.0}
# The released code's output on this group (github Nala-YN/G2PO b8ffaf5, g2po/core_g2po.py, its functions run
# unchanged on this batch, mean_std_norm, step_advantage_w 1; 2026-12-05): a cross-check of the derivation.
RELEASED_CODE = {"a1t0": 1.908068, "a1t1": 4.522404, "a1t2": 1.443014, "a2t0": -2.786973, "a2t1": -1.441303,
                 "a2t2": 0.959236, "a2t3": -2.257941, "a3t0": -0.088563, "a3t1": -2.257941, "b1t0": 2.201360,
                 "b2t0": 0.834146, "b2t1": 2.201360, "b3t0": -4.191278, "b3t1": -1.045588}


def _g2po_released_want(mode: str = "mean_std_norm") -> dict[str, float]:
    """A = A^E + A^node + A^edge, the released code's terms:
    A^node: (next - penalty) normalised among the node's visits (singletons 0);
    A^edge: (next - V(node)) normalised over the task's steps, no penalty;
    A^E: (O - penalty) per step, normalised over the task's *steps* (a1's three steps weigh three times)."""
    norm = (lambda x, g: x - mean(g)) if mode == "mean_norm" else _z
    out = {}
    for task in "ab":
        members = [n for n in NAMES if n[0] == task]
        z = {n: OUTCOME[n[:2]] - PEN[n] for n in members}
        gain = {n: NEXT_REL[n] - V_REL[NODE_OF[n]] for n in members}
        for n in members:
            peers = [m for m in members if NODE_OF[m] == NODE_OF[n]]
            a_node = norm(NEXT_REL[n] - PEN[n], [NEXT_REL[m] - PEN[m] for m in peers]) if len(peers) > 1 else 0.0
            out[n] = norm(z[n], list(z.values())) + a_node + norm(gain[n], list(gain.values()))
    return out


@pytest.mark.parametrize("mode", ["mean_std_norm", "mean_norm"])
def test_g2po_released_reading_hand_computed(mode):
    got = compute_advantages(_batch(), AdvantageConfig(estimator="g2po", gamma=0.95, eps=EPS, gigpo_mode=mode,
                                                       episode_norm=mode))
    got = dict(zip(NAMES, got.advantages.tolist()))
    _check(got, _g2po_released_want(mode))
    # one row in full: b1t0 = A^E (10 - 6) / stdev(10, 10, 10, 0, 0) + node (10 in hall's [10, 7.00625, 10, 0])
    #   + edge (10 - 7.00625 among the gains [2.99375, 0, 2.99375, -7.00625, 0])
    b1 = (_z(10.0, [10.0, 10.0, 10.0, 0.0, 0.0]) + _z(10.0, [10.0, 28.025 / 4, 10.0, 0.0])
          + _z(10.0 - 28.025 / 4, [10.0 - 28.025 / 4, 0.0, 10.0 - 28.025 / 4, -28.025 / 4, 0.0]))
    if mode == "mean_std_norm":
        assert got["b1t0"] == pytest.approx(b1, rel=1e-9)
        for name, value in RELEASED_CODE.items():  # the released code's float32 arithmetic: 1e-5
            assert got[name] == pytest.approx(value, abs=1e-5), name


def test_g2po_text_reading_is_not_the_released_code():
    # the project's first reading differs from the code on this group: penalty inside G, td edge error,
    # episode term over trajectories (a1t0: 1.742 there against the code's 1.908)
    text = compute_advantages(_batch(), AdvantageConfig(estimator="g2po", gamma=0.95, g2po_reading="text")).advantages
    assert abs(text[0] - RELEASED_CODE["a1t0"]) > 0.1


def _pool(pool: list[float], sigma2: float, m0: float = 2.0) -> tuple[float, float]:
    """Spec (3) for one pool: (mu_d, e_d) with s2~ = ((n-1) s2 + m0 sigma2_u)/(n-1+m0), e = s2~/n."""
    n = len(pool)
    ssd = (n - 1) * variance(pool) if n > 1 else 0.0
    return mean(pool), ((ssd + m0 * sigma2) / (n - 1 + m0)) / n


def _ivw(*est: tuple[float, float], eta: float) -> float:
    """Spec (5): sum_d w_d mu_d / sum_d w_d, w_d = 1/(e_d + eta)."""
    w = [1 / (e + eta) for _, e in est]
    return sum(wi * mu for wi, (mu, _) in zip(w, est)) / sum(w)


# Trajectories of the batch, in step order (for the credit accumulation of credit_lambda).
TRAJS = [["a1t0", "a1t1", "a1t2"], ["a2t0", "a2t1", "a2t2", "a2t3"], ["a3t0", "a3t1"],
         ["b1t0"], ["b2t0", "b2t1"], ["b3t0", "b3t1"]]
# The batch's largest |r| (sigma2_floor_ref = batch): the fusion measures variances in units of 10**2,
# so eta = 1e-6 (in those units) is 1e-6 * 10**2 in reward units squared; the paper reading
# (sigma2_floor_ref = success_reward) keeps eta = 1e-6 in reward units.
SCALE = 10.0


def _progpo_want(eta: float, lam: float = 0.0) -> tuple[dict[str, float], dict[str, float]]:
    """Expected ProGPO advantages (depths = 1) and raw transition credits, by the spec's formulas.

    ``eta``: the ivw regulariser in reward units squared; ``lam``: credit_lambda, the normalised credit
    accumulated as A^C_t = sum_k (gamma lam)^k C^_{t+k} over the rest of the trajectory.
    """
    # sigma2_u: sample variance of G over the task's steps (both far above the floor 1e-2 * 10^2 = 1)
    s2a = variance([2.5, 5.0, 10.0, -0.05, -0.1, 0.0, 0.0, 0.0, 0.0])
    s2b = variance([10.0, 5.0, 10.0, 0.0, 0.0])
    assert min(s2a, s2b) > 1.0
    # Potentials Phi: depth-0 pool = anchor group, depth-1 pool = (o_{t-1}, a_{t-1}, o_t) group
    phi = {
        "a1t0": mean(ROOM), "a2t0": mean(ROOM), "a3t0": mean(ROOM),  # both depths = the room pool
        "a1t1": _ivw(_pool(DESK, s2a), _pool([5.0, 0.0], s2a), eta=eta),
        "a3t1": _ivw(_pool(DESK, s2a), _pool([5.0, 0.0], s2a), eta=eta),
        "a2t3": _ivw(_pool(DESK, s2a), _pool([0.0], s2a), eta=eta),
        "a1t2": 10.0,                                                # singleton at both depths: Phi = G
        "a2t1": _ivw(_pool(BED, s2a), _pool([-0.1], s2a), eta=eta),
        "a2t2": _ivw(_pool(BED, s2a), _pool([0.0], s2a), eta=eta),   # invalid action keyed as <invalid>
        "b1t0": _ivw(_pool(HALL, s2b), _pool([10.0, 5.0, 0.0], s2b), eta=eta),
        "b2t0": _ivw(_pool(HALL, s2b), _pool([10.0, 5.0, 0.0], s2b), eta=eta),
        "b3t0": _ivw(_pool(HALL, s2b), _pool([10.0, 5.0, 0.0], s2b), eta=eta),
        "b2t1": _ivw(_pool(HALL, s2b), _pool([10.0], s2b), eta=eta),
        "b3t1": 0.0,
    }
    return _from_potentials(phi, lam)


def _from_potentials(phi: dict[str, float], lam: float) -> tuple[dict[str, float], dict[str, float]]:
    """Expected ProGPO advantages and raw transition credits from the potentials ``phi`` (spec (6)-(7))."""
    # Transition credit (6): C = r + 0.5 Phi_next - Phi, Phi_next = 0 after the last step
    # (a2t3 is truncated: still no bootstrap).
    c = {
        "a1t0": 0 + 0.5 * phi["a1t1"] - phi["a1t0"], "a1t1": 0 + 0.5 * phi["a1t2"] - phi["a1t1"],
        "a1t2": 10 + 0 - phi["a1t2"],
        "a2t0": 0 + 0.5 * phi["a2t1"] - phi["a2t0"], "a2t1": -0.1 + 0.5 * phi["a2t2"] - phi["a2t1"],
        "a2t2": 0 + 0.5 * phi["a2t3"] - phi["a2t2"], "a2t3": 0 + 0 - phi["a2t3"],
        "a3t0": 0 + 0.5 * phi["a3t1"] - phi["a3t0"], "a3t1": 0 + 0 - phi["a3t1"],
        "b1t0": 10 + 0 - phi["b1t0"], "b2t0": 0 + 0.5 * phi["b2t1"] - phi["b2t0"],
        "b2t1": 10 + 0 - phi["b2t1"], "b3t0": 0 + 0.5 * phi["b3t1"] - phi["b3t0"], "b3t1": 0 - 0.0,
    }
    sd = {"a": stdev([v for k, v in c.items() if k[0] == "a"]), "b": stdev([v for k, v in c.items() if k[0] == "b"])}
    one_step = {k: v / (sd[k[0]] + EPS) for k, v in c.items()}
    # credit_lambda: A^C_t = sum_k (0.5 lam)^k C^_{t+k}, written out term by term
    c_hat = {}
    for traj in TRAJS:
        for k, name in enumerate(traj):
            c_hat[name] = sum((GAMMA * lam) ** j * one_step[later] for j, later in enumerate(traj[k:]))
    # Peers (2): t=0 prompts hold every trajectory of the task -> rho = 0; a1t1/a3t1 share a prompt:
    # |P| = 2, rho = 1/(1+8), A^P = z-score of G in [5, 0]; every other prompt is a singleton.
    rho = 1 / 9
    want = {k: _ae(k) + c_hat[k] for k in c}
    want["a1t1"] = _ae("a1t1") + rho * _z(5.0, [5.0, 0.0]) + (1 - rho) * c_hat["a1t1"]
    want["a3t1"] = _ae("a3t1") + rho * _z(0.0, [5.0, 0.0]) + (1 - rho) * c_hat["a3t1"]
    return want, c


def test_progpo_hand_computed():
    want, c = _progpo_want(eta=1e-6 * SCALE**2)
    _check(_run(estimator="progpo", depths=1), want)
    assert c["a1t2"] == 0.0  # singleton chain end: exact-zero credit


def test_progpo_default_depth0_hand_computed():
    # The product default (depths auto = 0 for progpo, credit_lambda 0.8, zero_signal task: both tasks
    # have a return spread, so nothing is zeroed): Phi is the plain mean of G over the task's steps with
    # the same observation; one depth, so no fusion and no variance terms.
    phi = {"a1t0": mean(ROOM), "a2t0": mean(ROOM), "a3t0": mean(ROOM),
           "a1t1": mean(DESK), "a3t1": mean(DESK), "a2t3": mean(DESK),   # 5/3: other histories pooled too
           "a1t2": 10.0, "b3t1": 0.0,                                  # singletons: Phi = own G
           "a2t1": mean(BED), "a2t2": mean(BED),
           "b1t0": mean(HALL), "b2t0": mean(HALL), "b3t0": mean(HALL), "b2t1": mean(HALL)}  # 6.25
    want, c = _from_potentials(phi, lam=0.8)
    cfg = AdvantageConfig(gamma=GAMMA)
    assert cfg.depths == 0 and cfg.credit_lambda == 0.8 and cfg.rms_cap == 1.0
    # rms_cap = 1: every step keeps an advantage (both tasks have a return spread), so all 14 are scaled by
    # min(1, 1 / sqrt(mean of their squares))
    rms = sqrt(sum(v * v for v in want.values()) / len(want))
    assert len(want) == 14 and rms > 1.0
    got = compute_advantages(_batch(), cfg)
    _check(dict(zip(NAMES, got.advantages.tolist())), {k: v / rms for k, v in want.items()})
    assert got.diagnostics["adv/rms_scale"] == pytest.approx(1.0 / rms)
    unscaled = compute_advantages(_batch(), AdvantageConfig(gamma=GAMMA, rms_cap=0.0))
    _check(dict(zip(NAMES, unscaled.advantages.tolist())), want)
    assert c["a1t0"] == pytest.approx(0.5 * 5 / 3 - 2.45 / 3)  # r + gamma Phi(desk) - Phi(room), by hand
    assert "adv/pool_size_d1_mean" not in got.diagnostics  # one depth reported


def test_progpo_paper_preset_hand_computed():
    # the paper reading: floor and eta in absolute reward units (sigma2_floor_ref = success_reward)
    want, _ = _progpo_want(eta=1e-6)
    got = compute_advantages(_batch(), config_from_preset("paper", gamma=GAMMA, depths=1))
    _check(dict(zip(NAMES, got.advantages.tolist())), want)


@pytest.mark.parametrize("lam", [0.8, 1.0])
def test_progpo_credit_lambda_hand_computed(lam):
    want, c = _progpo_want(eta=1e-6 * SCALE**2, lam=lam)
    got = _run(estimator="progpo", depths=1, credit_lambda=lam)
    _check(got, want)
    # one value written out in full: a2t1's accumulated credit with lam = 0.8 is
    # (C(a2t1) + 0.4 C(a2t2) + 0.16 C(a2t3)) / (std of task A's nine one-step C + eps), gamma lam = 0.4
    if lam == 0.8:
        task_a = [v for k, v in c.items() if k[0] == "a"]
        acc = (c["a2t1"] + 0.4 * c["a2t2"] + 0.16 * c["a2t3"]) / (stdev(task_a) + EPS)
        assert got["a2t1"] == pytest.approx(_ae("a2t1") + acc, rel=1e-9)


def test_progpo_ablations_hand_computed():
    # use_potential=False: A = A^E + rho A^P (zero where rho = 0)
    got = _run(estimator="progpo", use_potential=False)
    _check(got, {"a1t1": _ae("a1t1") + _z(5.0, [5.0, 0.0]) / 9, "a2t3": _ae("a2t3"), "b1t0": _ae("b1t0")})
    # beta_episode=0, use_peer=False, omega=2: A = 2 * C^ only; a1t2 is a singleton chain end -> 0
    got = _run(estimator="progpo", beta_episode=0.0, use_peer=False, omega=2.0)
    assert got["a1t2"] == 0.0 and got["b3t1"] == 0.0


def test_graph_and_action_credit_hand_computed():
    # E1 on task B, gamma = 0.5, H = max_steps = 4 (task A has a 4-step trajectory).
    # Pairs: (hall, open door) n=2, rbar=10, done -> Q = 10; (hall, wait) -> hall;
    # (hall, go kitchen) -> kitchen; (kitchen, eat) done, r=0 -> Q = 0.
    # pi0(.|hall) = 2/4, 1/4, 1/4. V_t(kitchen) = 0. V_4 = 0; V_t(hall) = 0.5*10 + 0.25*0.5*V_{t+1}(hall).
    kw = dict(estimator="progpo", potential_estimator="graph", max_steps=4, beta_episode=0.0, use_peer=False)
    v3 = 5 + 0.125 * 0.0
    v2 = 5 + 0.125 * v3
    v1 = 5 + 0.125 * v2
    v0 = 5 + 0.125 * v1
    trans = {"b1t0": 10 - v0, "b2t0": 0.5 * v1 - v0, "b2t1": 10 - v1, "b3t0": 0.5 * 0 - v0, "b3t1": 0.0}
    sd = stdev(trans.values())
    got = _run(**kw)
    _check(got, {k: v / (sd + EPS) for k, v in trans.items()})
    # E2: C = Q_t(o, a) - V_t(o); kitchen only ever took one action -> exactly 0
    action = {"b1t0": 10 - v0, "b2t0": 0.5 * v1 - v0, "b2t1": 10 - v1, "b3t0": 0 - v0, "b3t1": 0.0}
    sd = stdev(action.values())
    got = _run(credit="action", **kw)
    _check(got, {k: v / (sd + EPS) for k, v in action.items()})
    assert got["b3t1"] == 0.0


def test_row_order_does_not_matter():
    perm = np.random.default_rng(0).permutation(len(ROWS))
    cfg = AdvantageConfig(gamma=GAMMA)
    base = compute_advantages(_batch(), cfg).advantages
    shuffled = compute_advantages(_batch(perm), cfg).advantages
    np.testing.assert_allclose(shuffled, base[perm], rtol=1e-12, atol=1e-12)
