"""Task families: one interface, shared features that are functions of text only, config overrides."""

from __future__ import annotations

import pytest

from research import engine
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


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_hard_preset_is_longer_with_more_distractors(name):
    fam = FAMILIES[name]
    base, hard = fam.learn_cfg, family_config(fam, "learn", preset="hard")
    for field, value in fam.presets["hard"].items():  # every declared override holds, nothing else moves
        assert getattr(hard, field) == value, field
    assert {f: getattr(hard, f) for f in base.field_names() if f not in fam.presets["hard"]} == \
        {f: getattr(base, f) for f in base.field_names() if f not in fam.presets["hard"]}
    assert hard.horizon > base.horizon and hard.n_variants > base.n_variants
    if name == "alfworld":  # more receptacles; every goal processed and every object closed in
        assert hard.n_locations > base.n_locations and hard.process_prob == hard.closed_prob == 1.0
    else:  # a longer search through look-alikes, more option values to get wrong, a success or nothing
        assert hard.n_items > base.n_items and (hard.n_colors, hard.n_sizes) > (base.n_colors, base.n_sizes)
        assert hard.win_only and not base.win_only
    # --task_config still applies on top of the preset
    assert family_config(fam, "learn", ["horizon=9"], preset="hard").horizon == 9
    task = make_tasks(fam, hard, 1, 3)[0]
    assert task.horizon == hard.horizon


def test_unknown_preset_is_named():
    with pytest.raises(ValueError, match=r"webshop has no task preset 'hrad'; presets: \['hard'\]"):
        family_config(FAMILIES["webshop"], "learn", preset="hrad")
    with pytest.raises(ValueError, match="presets apply to the learning config"):
        family_config(FAMILIES["webshop"], "fidelity", preset="hard")


def test_alfworld_like_state_extra_shows_the_processed_object_as_the_real_env_does() -> None:
    """The inventory sentence hides whether the held object was processed; ``state_extra`` says it, in the real
    env's words (progpo.envs.alfworld.alfworld_state_extra), so states before and after the transition differ."""
    from progpo.envs.synthetic.families import FAMILIES

    fam = FAMILIES["alfworld"]
    task = next(t for t in (fam.make_task(fam.learn_cfg, s) for s in range(50)) if t.verb == "cool")
    loc = task.tool
    assert task.state_extra((loc, 0, 0)) == task.inventory((loc, 0, 0)) == "You are not carrying anything."
    assert task.state_extra((loc, 0, 1)) == task.inventory((loc, 0, 1)) == f"You are carrying: a {task.obj}."
    assert task.inventory((loc, 0, 2)) == f"You are carrying: a {task.obj}."
    assert task.state_extra((loc, 0, 2)) == f"You are carrying: a {task.obj}. The {task.obj} is cool."
