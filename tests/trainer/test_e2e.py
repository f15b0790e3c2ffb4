"""End to end: 2 iterations with the tiny random model, 4 tasks x 4 rollouts, max 5 steps.

WebShop runs against one shared server on the real 87 products; ALFWorld on the real games.
progpo, gigpo and grpo go through the same code path (only ``--algo.advantage.estimator`` differs).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from progpo.run.metrics import NAMESPACES, read_metrics
from progpo.trainer.update import _micro_tensors

CASES = [("webshop", "progpo"), ("webshop", "gigpo"), ("webshop", "grpo"),
         pytest.param("alfworld", "progpo", marks=pytest.mark.slow)]


@pytest.mark.parametrize("env, estimator", CASES)
def test_two_iterations(e2e_runs, env, estimator):
    trainer = e2e_runs.get(env, estimator)
    history = trainer.history
    assert [m["iteration"] for m in history] == [1, 2]
    for k, m in enumerate(history):
        # an update is skipped exactly when every advantage is 0 and the policy still equals the reference
        # (GRPO on the tiny model's flat batches); otherwise it runs
        at_reference = all(h["loss/update_skipped"] == 1.0 for h in history[:k])
        assert m["loss/update_skipped"] == float(m["adv/frac_zero"] == 1.0 and at_reference)
        if m["loss/update_skipped"]:
            assert m["loss/optimizer_steps"] == 0 and "loss/total" not in m
        else:
            assert math.isfinite(m["loss/total"]) and math.isfinite(m["loss/policy"]) and math.isfinite(m["loss/kl"])
            assert m["loss/optimizer_steps"] >= 1
        assert m["rollout/num_episodes"] == 16 and 16 <= m["rollout/num_steps"] <= 80
        assert m["env/failed_frac"] == 0.0
        assert 0.0 <= m["env/success_rate"] <= 1.0
        for name in m:
            assert name == "iteration" or name.split("/")[0] in NAMESPACES
    if history[0]["adv/std"] > 0 and not history[1]["loss/update_skipped"]:  # the policy moved away from the reference
        assert history[1]["loss/kl"] > 0
    assert any(k.startswith("adv/frac_peer") for k in history[0])  # estimator diagnostics are logged

    # metrics written: JSONL records and TensorBoard events
    records = read_metrics(trainer.save_path)
    assert [r["iteration"] for r in records] == [1, 2]
    assert records[0]["perf/iteration_s"] > 0
    assert list((trainer.save_path / "tensorboard").glob("events.out.tfevents.*"))
    assert json.loads((trainer.save_path / "config.json").read_text())["progpo"]["estimator"] == estimator

    # checkpoint written, complete, loadable as a HF model
    ckpt = trainer.ckpt.latest()
    assert ckpt is not None and ckpt.name == "iter_000002"
    state = json.loads((ckpt / "trainer_state.json").read_text())
    assert state["iteration"] == 2 and state["sampler"]["pos"] == 8 % state["sampler"]["num_tasks"]
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(ckpt / "hf")
    live = trainer.actor.model.state_dict()
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, live[name]), name


@pytest.mark.parametrize("env, estimator", CASES[:1] + CASES[3:])
def test_advantages_only_on_action_tokens(e2e_runs, env, estimator):
    trainer = e2e_runs.get(env, estimator)
    samples = trainer.last_samples
    assert samples and any(s.advantage != 0.0 for s in samples)
    pad = trainer.actor.tokenizer.pad_token_id
    t = _micro_tensors(samples, pad)
    for k, s in enumerate(samples):
        p, r = len(s.prompt_ids), len(s.response_ids)
        adv_row, mask_row = t["adv"][k], t["action_mask"][k]
        assert torch.all(adv_row[:p] == 0) and torch.all(mask_row[:p] == 0)  # prompt/observation tokens
        assert torch.all(adv_row[p + r:] == 0) and torch.all(mask_row[p + r:] == 0)  # padding
        assert torch.allclose(adv_row[p:p + r], torch.full((r,), float(s.advantage)))
        assert torch.all(mask_row[p:p + r] == 1)
        assert t["input_ids"][k, p:p + r].tolist() == s.response_ids
    assert np.isfinite([s.advantage for s in samples]).all()
