"""Learning benchmark: policy-gradient sanity, row specs, regimes, and the quick pipeline end to end."""

from __future__ import annotations

import pickle
import re

import numpy as np
import pytest

from research import learning
from progpo.envs.synthetic.families import FAMILIES
from research.fidelity_core import parse_row, select_variants
from research.learner import RunSpec, build_source, make_context, train_run
from research.learning_probe import LogLinearPolicy


def test_update_raises_the_probability_of_a_positive_advantage_action():
    pol = LogLinearPolicy()
    acts = ["a", "b", "c"]
    p = pol.probs("u", "o", acts)
    assert np.allclose(p, 1 / 3)
    pol.update([("u", "o", acts, p, 1, 1.0)], lr=1.0, n_traj=1)
    q = pol.probs("u", "o", acts)
    assert q[1] > p[1] and q[0] < p[0]


def test_steps_to_target():
    assert learning.steps_to_target([10, 20, 30, 40], [0.1, 0.9, 0.9, 0.9], 0.8, window=2) == 30
    assert np.isnan(learning.steps_to_target([10, 20], [0.1, 0.2], 0.8))


def test_bad_flags_name_the_flag():
    with pytest.raises(ValueError, match="--lr"):
        learning.parse_args(["--lr", "0"])
    with pytest.raises(ValueError, match="--lr_sweep"):
        learning.parse_args(["--lr_sweep", "3,x"])
    with pytest.raises(ValueError, match="unknown task family"):
        learning.parse_args(["--family", "nope"])
    with pytest.raises(ValueError, match="row 'nope'"):
        learning.run(learning.parse_args(["--quick", "--encoder", "none", "--estimators", "nope"]))
    with pytest.raises(ValueError, match="fresh needs --policy features"):
        build_source(FAMILIES["alfworld"], FAMILIES["alfworld"].learn_cfg, "fresh", "tabular", 2, 1, 4, 1)


def test_row_specs_are_generic_over_config_fields():
    row = parse_row("gigpo state_key=obs_inventory gamma=0.9 use_peer=false")
    cfg = row.config({"max_steps": 30})
    assert (cfg.estimator, cfg.state_key, cfg.gamma, cfg.use_peer, cfg.max_steps) == \
        ("gigpo", "obs_inventory", 0.9, False, 30)
    assert not row.needs_encoder and parse_row("progpo").needs_encoder
    assert not parse_row("progpo semantic_expansion=false").needs_encoder
    with pytest.raises(ValueError, match=r"row 'progpo not_a_field=1'.*no field 'not_a_field'"):
        parse_row("progpo not_a_field=1")
    with pytest.raises(ValueError, match=r"row 'progpo omega=x'"):
        parse_row("progpo omega=x")
    with pytest.raises(ValueError, match=r"row 'progpo state_key=bad'"):
        parse_row("progpo state_key=bad")
    names = [v.name for v in select_variants(["progpo state=obs_inv", "hgpo state_key=obs_inventory", "gigpo"])]
    assert names == ["progpo state=obs_inv", "hgpo state_key=obs_inventory", "gigpo"]


def test_closure_potential_is_a_row_spec():
    # bench learning's --estimators takes ProGPO with closure potentials as a row; a baseline with it is refused
    rows = learning.parse_rows("gigpo,progpo potential_target=closure,oracle")
    cfg = rows[1].config({"max_steps": 30, "gamma": 0.9, "success_reward": 5.0})
    assert (rows[1].name, cfg.estimator, cfg.potential_target, cfg.gamma) == (
        "progpo potential_target=closure", "progpo", "closure", 0.9)
    assert rows[1].needs_encoder
    with pytest.raises(ValueError, match=r"row 'gigpo potential_target=closure'.*estimator='progpo'"):
        learning.parse_rows("gigpo potential_target=closure")


def test_fresh_regime_draws_new_tasks_the_same_for_every_row():
    fam = FAMILIES["webshop"]
    src = build_source(fam, fam.learn_cfg, "fresh", "features", 3, 1, 12, 1)
    order = src.order(seed=4, iterations=4)
    assert order.shape == (4, 3) and len(set(order.ravel().tolist())) == 12  # pool 12 = 4 x 3: no repeats
    assert np.array_equal(order, src.order(seed=4, iterations=4))
    ctx = make_context(src)
    runs = [train_run(ctx, RunSpec(row, 10.0, 4, 4, 4, probe_every=2)) for row in select_variants(["gigpo", "hgpo"])]
    again = train_run(ctx, RunSpec(select_variants(["gigpo"])[0], 10.0, 4, 4, 4, probe_every=2))
    assert np.array_equal(runs[0].success, again.success) and np.array_equal(runs[0].steps, again.steps)
    assert runs[0].probe_it.tolist() == [0, 2, 3]
    assert np.all(np.isfinite(runs[0].probes["spearman"])) and np.all(runs[0].probes["J"] >= 0)


@pytest.mark.parametrize("argv", [["--encoder", "none", "--lr_sweep", "5,10"],
                                  ["--family", "webshop", "--regime", "fresh", "--estimators", "gigpo,progpo,hgpo"]])
def test_quick_pipeline_runs(argv, tmp_path, capsys):
    assert learning.main(["--quick", "--out", str(tmp_path), *argv]) == 0
    text = capsys.readouterr().out
    assert "| gigpo |" in text and "| progpo |" in text
    for part in ("**Learning**", "**On-policy fidelity**", "**Matched-policy fidelity**", "**Fixed-policy fidelity**",
                 "predicts learning", "matched-policy Spearman", "Cost:"):
        assert part in text
    if "--lr_sweep" in argv:
        assert "**Learning-rate sweep**" in text
    assert list(tmp_path.glob("*.png")) and list(tmp_path.glob("learning*-quick.md"))
    runs = pickle.loads(next(tmp_path.glob("learning*-quick-runs.pkl")).read_bytes())
    assert set(runs["final"]) >= {"gigpo", "progpo"} and runs["final"]["gigpo"][0].steps.size == 4


def test_row_specs_accept_presets():
    from progpo.advantages import PRESETS

    env = {"max_steps": 30, "gamma": 0.9, "success_reward": 5.0}
    paper = parse_row("progpo preset=paper").config(env)
    for name, value in PRESETS["paper"].items():
        want = env[name] if name in env else value  # the family's env fields hold for every row
        assert getattr(paper, name) == want, name
    cand = parse_row("progpo preset=candidate").config(env)
    assert (cand.state_key, cand.credit_lambda, cand.zero_signal) == ("obs_inventory", 0.8, "task")
    # fields after the preset win; the estimator stays the row's
    row = parse_row("gigpo preset=paper sigma2_floor_ref=batch").config(env)
    assert (row.estimator, row.sigma2_floor_ref, row.state_key) == ("gigpo", "batch", "obs")
    with pytest.raises(ValueError, match=r"row 'progpo preset=nope': unknown preset 'nope'"):
        parse_row("progpo preset=nope")


def test_oracle_advantages_are_the_truth_over_its_batch_std():
    from research.learner import oracle_advantages

    # A* = [3, -1, 0, -2]: population std = sqrt((9 + 1 + 0 + 4) / 4 - 0**2) = sqrt(3.5)
    got = oracle_advantages(np.array([3.0, -1.0, 0.0, -2.0]))
    assert np.allclose(got, np.array([3.0, -1.0, 0.0, -2.0]) / np.sqrt(3.5))
    assert np.array_equal(oracle_advantages(np.zeros(5)), np.zeros(5))  # nothing to prefer: no update


def test_oracle_row_trains_on_the_exact_advantage_of_its_own_policy():
    from research import engine
    from research.fidelity_core import oracle_variant

    fam = FAMILIES["alfworld"]
    src = build_source(fam, fam.learn_cfg, "fixed", "tabular", 2, 1, 0, 1)
    ctx = make_context(src)
    spec = RunSpec(oracle_variant(), 5.0, 3, 1, 4, probe_every=1)
    res = train_run(ctx, spec)
    # the same first iteration by hand: same rng stream, A* of the all-zero policy, REINFORCE update
    g = src.graph(None, 0)
    p = engine.policy_probs(g, np.zeros(src.n_params))
    roll = engine.rollout(g, p, 4, np.random.default_rng([3, 4242]), ctx.history)
    astar, _ = engine.exact_advantages(g, p, roll)
    assert res.steps[0] == roll.env_steps
    # the row's own probe compares A*/std(A*) with A*: a perfect rank and sign agreement
    assert res.probes["spearman"][0] == pytest.approx(1.0)
    assert res.probes["cosine"][0] == pytest.approx(1.0)
    assert np.std(astar) > 0


def test_quick_pipeline_with_the_oracle_row(tmp_path, capsys):
    assert learning.main(["--quick", "--out", str(tmp_path), "--encoder", "none",
                          "--estimators", "gigpo,oracle,progpo"]) == 0
    text = capsys.readouterr().out
    assert "| oracle |" in text.split("**On-policy fidelity**")[0]  # a learning row
    fixed = text.split("**Fixed-policy fidelity**")[1].split("**Which fidelity")[0]
    assert "| oracle |" not in fixed and "| gigpo |" in fixed  # nothing to measure against the truth
    matched = text.split("**Matched-policy fidelity**")[1].split("**Fixed-policy")[0]
    assert "| oracle |" not in matched
    with pytest.raises(ValueError, match="row 'oracle'"):
        parse_row("oracle")  # only the learning benchmark knows the oracle row


def test_a_bad_row_is_one_line_and_runs_nothing(tmp_path, capsys):
    assert learning.main(["--quick", "--out", str(tmp_path), "--estimators", "gigpo,orcale"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "row 'orcale'" in err[0] and "'oracle'" in err[0] and "--estimators" in err[0]
    assert not any(tmp_path.iterdir())  # nothing written
    assert learning.main(["--quick", "--lr", "0", "--out", str(tmp_path)]) == 2
    assert "--lr must be > 0" in capsys.readouterr().err


def test_hard_preset_is_selectable_and_writes_its_own_block(tmp_path, capsys):
    args = learning.parse_args(["--family", "webshop", "--regime", "fresh", "--task_preset", "hard"])
    assert learning._block(args) == "learning-webshop-fresh-hard"
    assert learning._block(learning.parse_args(["--regime", "fresh"])) == "learning-alfworld-fresh"
    assert learning.main(["--quick", "--out", str(tmp_path), "--encoder", "none", "--task_preset", "hard",
                          "--estimators", "gigpo,oracle"]) == 0
    text = capsys.readouterr().out
    first, head = text.split("\n\n")[:2]
    # the oracle's headroom opens the block: oracle / gigpo steps to 80% with its interval, gigpo's final success
    assert re.fullmatch(r"\*\*Oracle headroom\*\*: oracle's env steps to 80% / gigpo's = \*\*\d+\.\d\d \[\d+\.\d\d, "
                        r"\d+\.\d\d\]\*\* .*gigpo's final success \d\.\d{3} ± \d\.\d{3}\.", first), first
    assert "preset **hard**" in head and "horizon=40" in head and "n_locations=12" in head
    assert list(tmp_path.glob("learning-hard-quick.md"))
    assert learning.main(["--quick", "--out", str(tmp_path), "--encoder", "none", "--estimators", "gigpo"]) == 0
    assert capsys.readouterr().out.startswith("**Oracle headroom**: not measured")


def test_an_unknown_preset_is_one_line_naming_the_flag(tmp_path, capsys):
    assert learning.main(["--quick", "--out", str(tmp_path), "--family", "webshop", "--task_preset", "hrad"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--task_preset" in err[0] and "'hrad'" in err[0] and "['hard']" in err[0]
    assert not any(tmp_path.iterdir())
