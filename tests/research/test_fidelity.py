"""Fidelity benchmark: batches, metrics, config validation and the quick pipeline end to end."""

from __future__ import annotations

import numpy as np
import pytest

from research import fidelity, report
from research.fidelity_core import fidelity_metrics, mean_ci, peer_fragmentation, sample_truth_batch
from research.oracle import ExactOracle
from progpo.envs.synthetic.alfworld_like import MDPConfig, make_tasks


def test_truth_batch_is_a_valid_training_batch():
    cfg = MDPConfig(n_locations=4, horizon=6, n_variants=2)
    tasks = make_tasks(cfg, 3, seed=5)
    orcs = [ExactOracle(t) for t in tasks]
    tb = sample_truth_batch(tasks, orcs, 4, np.random.default_rng(1))
    b = tb.batch
    assert len(set(b.uid)) == 3 and len(set(b.traj_id)) == 12
    assert tb.true_adv.shape == tb.td_oracle.shape == (b.num_steps,)
    # every trajectory ends terminated or truncated at the horizon
    for tid in set(b.traj_id.tolist()):
        rows = np.flatnonzero(b.traj_id == tid)
        last = rows[np.argmax(b.step_index[rows])]
        assert b.terminated[last] or (b.truncated[last] and b.step_index[last] == cfg.horizon - 1)
    # t = 0 steps of one task with the same wording share a prefix key; fragmentation is a share
    fr = peer_fragmentation(b)
    assert 0.0 <= fr["frac_peer_ge2_t>0"] <= 1.0
    assert 0.0 < fr["frac_peer_ge2"] <= 1.0


def test_metrics_on_known_cases():
    truth = np.array([1.0, -2.0, 0.5, 0.0, 3.0])
    same = fidelity_metrics(2.0 * truth, truth, sign_threshold=0.1)
    assert same["sign"] == 1.0 and same["spearman"] == pytest.approx(1.0) and same["nmse"] == pytest.approx(0.0)
    flipped = fidelity_metrics(-truth, truth, sign_threshold=0.1)
    assert flipped["sign"] == 0.0 and flipped["pearson"] == pytest.approx(-1.0) and flipped["nmse"] == 1.0
    const = fidelity_metrics(np.zeros(5), truth, sign_threshold=0.1)
    assert const["sign"] == 0.0 and const["spearman"] == 0.0 and const["nmse"] == 1.0
    m, h = mean_ci([1.0, 2.0, 3.0])
    assert m == 2.0 and h == pytest.approx(4.303 * 1.0 / np.sqrt(3), rel=1e-3)


def test_bad_flags_name_the_flag():
    with pytest.raises(ValueError, match="--batches"):
        fidelity.parse_args(["--batches", "0"])
    with pytest.raises(ValueError, match="--n_rollouts"):
        fidelity.parse_args(["--n_rollouts", "4,x"])
    with pytest.raises(ValueError, match="n_variants"):
        MDPConfig(n_variants=0)


@pytest.mark.parametrize("family", ["alfworld", "webshop"])
def test_quick_pipeline_runs(family, tmp_path, capsys):
    assert fidelity.main(["--quick", "--family", family, "--encoder", "none", "--out", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    for row in ("| grpo |", "| gigpo |", "| progpo |", "| progpo graph+action (E1+E2) |", "| TD oracle (true V) |"):
        assert row in text
    assert "Fragmentation sweep" in text and f"({family} family)" in text
    prefix = "fidelity" if family == "alfworld" else f"fidelity_{family}"  # one figure set per family
    assert (tmp_path / f"{prefix}_spearman.png").stat().st_size > 0
    block = "fidelity-quick" if family == "alfworld" else f"fidelity-{family}-quick"
    assert (tmp_path / f"{block}.md").read_text().startswith("`python -m research fidelity --quick")


def test_docs_block_is_replaced_not_duplicated(tmp_path):
    docs = tmp_path / "fidelity.md"
    docs.write_text("# Title\n\nprose\n")
    report.write_docs_block("x", "cmd a", "table 1", docs)
    report.write_docs_block("x", "cmd b", "table 2", docs)
    text = docs.read_text()
    assert text.count("BEGIN x") == 1 and "table 2" in text and "table 1" not in text and "prose" in text
