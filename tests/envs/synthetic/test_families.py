"""Task families: one interface, shared features that are functions of text only, config overrides."""

from __future__ import annotations

import pytest

from progpo.lab import engine
from progpo.envs.synthetic.families import FAMILIES, family_config, get_family, make_tasks


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_features_are_shared_and_text_only(name):
    fam = FAMILIES[name]
    tasks = make_tasks(fam, fam.learn_cfg, 12, 2)
    vocab = set()
    for task in tasks:
        ct = engine.compile_task(task, features=fam.features)
        assert ct.sa_feat_names is not None and len(ct.sa_feat_names) == ct.sa_node.shape[0]
        for feats in ct.sa_feat_names:
            vocab.update(feats)
    # every observation was recognised, and no feature names a task's objects, places or prices
    assert not any(f.startswith(("other|", "other-")) for f in vocab)
    assert not any(ch.isdigit() for f in vocab for ch in f.replace("p1", "").replace("p2", ""))
    assert len(vocab) < 400  # a small vocabulary that 12 different tasks share


def test_same_text_gives_same_features_across_tasks():
    fam = FAMILIES["alfworld"]
    a, b = make_tasks(fam, fam.learn_cfg, 2, 7)
    fa = fam.features(a.goal_text, a.initial()[0][2], a.admissible(a.initial()[0][1])[0])
    assert fa == fam.features(a.goal_text, a.initial()[0][2], a.admissible(a.initial()[0][1])[0])
    fb = fam.features(b.goal_text, b.initial()[0][2], "look")
    assert fb[0].startswith("start|") and fb[1] == "act|look"


def test_unknown_family_and_fields_are_named():
    with pytest.raises(ValueError, match="unknown task family 'nope'"):
        get_family("nope")
    with pytest.raises(ValueError, match="no field 'bogus'"):
        family_config(FAMILIES["webshop"], "learn", ["bogus=1"])
    assert family_config(FAMILIES["webshop"], "learn", ["horizon=9"]).horizon == 9
