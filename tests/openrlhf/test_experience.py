"""Our experience maker on synthetic OpenRLHF ``Experience`` objects (CPU, real OpenRLHF code paths)."""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from progpo.advantages import AdvantageConfig, StepBatch, compute_advantages
from progpo.agents.types import Episode, StepRecord


@pytest.fixture(scope="module")
def mods(cpu_compat):
    with cpu_compat.import_shims():
        from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker
        from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController

        from progpo.openrlhf import agent as openrlhf_agent, experience as openrlhf_experience, samples as openrlhf_samples

        return SimpleNamespace(samples=openrlhf_samples, agent=openrlhf_agent, exp=openrlhf_experience,
                               Parent=RemoteExperienceMaker, KL=FixedKLController)


EOS = 2


def synthetic_episodes(n_tasks=3, n_rollouts=4, seed=0) -> list[list[Episode]]:
    """Groups of episodes on a small corridor: shared prefixes at step 0, some repeated states."""
    rng = random.Random(seed)
    groups = []
    for u in range(n_tasks):
        eps = []
        for k in range(n_rollouts):
            steps, pos, history = [], 0, ""
            length = rng.randint(1, 5)
            for t in range(length):
                act = rng.choice(["fwd", "look"])
                obs = f"task{u} room{pos}"
                won = t == length - 1 and rng.random() < 0.5
                reward = (10.0 if won else 0.0) - (0.1 if act == "look" and rng.random() < 0.3 else 0.0)
                prompt = [5 + u, 10 + pos, 20 + t] + [30 + (hash(history) % 7)]
                resp = [40 + (act == "fwd"), 41, EOS] if rng.random() < 0.8 else [40, 42]
                steps.append(StepRecord(
                    prompt_ids=prompt, response_ids=resp, logprobs=[-1.0] * len(resp), response_text=act,
                    action=act, invalid=reward < 0, env_reward=reward + 0.1 * (reward < 0), reward=reward,
                    terminated=won, truncated=(t == length - 1 and not won), anchor_obs=obs,
                    prefix_key=f"{u}|{history}|{obs}", state_extra=f"inv{pos % 2}",
                ))
                history += f"{obs}>{act};"
                pos += act == "fwd"
            eps.append(Episode(uid=f"u{u}", traj_id=u * n_rollouts + k, split="train", task_index=u,
                               steps=steps, won=steps[-1].terminated))
        groups.append(eps)
    return groups


def _args(estimator, n, kl_use_loss=True):
    return SimpleNamespace(
        rollout=SimpleNamespace(batch_size=3, n_samples_per_prompt=n, micro_batch_size=4, vllm_generate_batch_size=None),
        algo=SimpleNamespace(dynamic_filtering_enable=False, kl=SimpleNamespace(use_loss=kl_use_loss),
                             advantage=SimpleNamespace(estimator=estimator, is_correction_level="off", gamma=1.0,
                                                       lambd=1.0, no_std_norm=False)),
        train=SimpleNamespace(dynamic_batch_enable=False),
        reward=SimpleNamespace(clip_range=(-10, 10), stop_properly_penalty_coef=None, overlong_buffer_len=None),
        vllm=SimpleNamespace(enable_sleep=False),
    )


def _rows(mods, groups, args, n):
    """Expanded per-step samples, micro-batched by OpenRLHF's own split_rollout_samples, with a fake forward."""
    gen = mods.samples.StepSamplesGenerator(
        strategy=SimpleNamespace(args=args), prompts_dataloader=[], eval_dataloader=None,
        tokenizer=SimpleNamespace(eos_token_id=EOS, pad_token_id=0), vllm_engines=[])
    samples = []
    for eps in groups:
        prompt = f'{{"split": "train", "index": {eps[0].task_index}}}'
        for ep in eps:
            r = mods.agent.transcript_response(ep, prompt=prompt, label=eps[0].uid, with_logprobs=None)
            samples.append(gen._process_response_into_experience(r, max_len=64))
    return gen, samples


def _maker(mods, args, cfg=None, kl=0.0):
    return mods.exp.StepExperienceMaker(
        None, None, None, None, mods.KL(kl), SimpleNamespace(args=args),
        SimpleNamespace(pad_token_id=0), advantage_config=cfg)


def _forward(experiences, kl_value=0.0):
    for e in experiences:  # what make_experience attaches (actor forward); kl as OpenRLHF sets it
        e.action_log_probs = torch.zeros_like(e.action_mask, dtype=torch.float32)
        e.kl = torch.full_like(e.action_mask, kl_value, dtype=torch.float32) * e.action_mask
    return experiences


def _direct(groups, gen_uid_prefix="b1"):
    """The registry input built by hand from the episodes (same uids/ids the generator assigns)."""
    rows = [(g, k, t, s) for g, eps in enumerate(groups) for k, ep in enumerate(eps) for t, s in enumerate(ep.steps)]
    n = len(groups[0])
    return StepBatch.from_lists(
        uid=[f"{gen_uid_prefix}g{g}:{groups[g][0].uid}" for g, _, _, _ in rows],
        traj_id=[g * n + k for g, k, _, _ in rows], step_index=[t for _, _, t, _ in rows],
        reward=[s.reward for *_, s in rows], terminated=[s.terminated for *_, s in rows],
        truncated=[s.truncated for *_, s in rows], invalid=[s.invalid for *_, s in rows],
        anchor_obs=[s.anchor_obs for *_, s in rows], prefix_key=[s.prefix_key for *_, s in rows],
        action=[s.action for *_, s in rows], state_extra=[s.state_extra for *_, s in rows],
    )


@pytest.mark.parametrize("estimator", ["progpo", "gigpo", "grpo", "rloo", "hgpo"])
def test_step_advantages_equal_registry_on_action_tokens(mods, estimator):
    groups, n = synthetic_episodes(), 4
    args = _args(estimator, n)
    cfg = AdvantageConfig(estimator=estimator, semantic_expansion=False, max_steps=5)
    gen, samples = _rows(mods, groups, args, n)
    maker = _maker(mods, args, cfg)
    micro = maker.split_rollout_samples(gen.expand(samples, n_samples_per_prompt=n, max_len=64))
    assert len(micro) > 1 and all(m.sequences.size(0) <= 4 for m in micro)
    out = maker.compute_advantages_and_returns(_forward(micro))

    expected = compute_advantages(_direct(groups), cfg).advantages
    assert np.std(expected) > 0.1 and len(np.unique(np.round(expected, 6))) > 3  # a real, row-dependent signal
    got = []
    for e in out:
        mask = e.action_mask.bool()
        for b in range(e.sequences.size(0)):
            vals = e.advantages[b][mask[b]]
            assert torch.allclose(vals, vals[0].expand_as(vals))  # one value on all the step's tokens
            assert e.advantages[b][~mask[b]].abs().sum() == 0  # nothing on prompt/padding
            got.append(float(vals[0]))
        assert torch.equal(e.returns, e.advantages)
        assert not any(k in e.info for k in mods.samples.STEP_INFO_KEYS)
        assert e.kl is None
        assert all(isinstance(v, torch.Tensor) for v in e.info.values())  # the actor logs every entry as floats
    np.testing.assert_allclose(got, expected.astype(np.float32), rtol=1e-6, atol=1e-6)
    assert any(k.startswith("adv/") for k in maker.last_diagnostics)


def test_kl_reward_penalty_adds_token_reward_to_go(mods):
    groups, n = synthetic_episodes(n_tasks=2, n_rollouts=3, seed=1), 3
    args = _args("grpo", n, kl_use_loss=False)
    cfg = AdvantageConfig(estimator="grpo", semantic_expansion=False)
    gen, samples = _rows(mods, groups, args, n)
    maker = _maker(mods, args, cfg, kl=0.5)
    micro = maker.split_rollout_samples(gen.expand(samples, n_samples_per_prompt=n, max_len=64))
    out = maker.compute_advantages_and_returns(_forward(micro, kl_value=0.2))
    expected = compute_advantages(_direct(groups), cfg).advantages
    e, b = out[0], 0
    m = e.action_mask[b].bool()
    k = int(m.sum())
    # each action token pays -0.5 * 0.2 for itself and every later token of the response
    penalty = torch.tensor([-0.1 * (k - j) for j in range(k)])
    assert torch.allclose(e.advantages[b][m], torch.full((k,), float(expected[0])) + penalty, atol=1e-6)


def test_other_estimators_fall_through_to_openrlhf(mods):
    groups, n = synthetic_episodes(seed=2), 4
    args = _args("group_norm", n)
    gen, samples = _rows(mods, groups, args, n)
    ours, theirs = _maker(mods, args), mods.Parent(None, None, None, None, mods.KL(0.0), SimpleNamespace(args=args),
                                                   SimpleNamespace(pad_token_id=0))
    a = ours.compute_advantages_and_returns(_forward(ours.split_rollout_samples(samples)))
    gen2, samples2 = _rows(mods, groups, args, n)
    b = theirs.compute_advantages_and_returns(_forward(theirs.split_rollout_samples(samples2)))
    assert len(a) == len(b) and sum(e.sequences.size(0) for e in a) == len(samples)
    for x, y in zip(a, b):
        assert torch.equal(x.advantages, y.advantages)


def test_mismatched_config_and_missing_metadata_raise(mods):
    with pytest.raises(ValueError, match="differs"):
        _maker(mods, _args("gigpo", 2), AdvantageConfig(estimator="progpo"))
    with pytest.raises(ValueError, match="AdvantageConfig"):
        _maker(mods, _args("gigpo", 2), None)
    groups, n = synthetic_episodes(n_tasks=1, n_rollouts=2), 2
    args = _args("grpo", n)
    gen, samples = _rows(mods, groups, args, n)  # episode-level samples: no per-step info
    maker = _maker(mods, args, AdvantageConfig(estimator="grpo", semantic_expansion=False))
    with pytest.raises(KeyError, match="StepSamplesGenerator"):
        maker.compute_advantages_and_returns(_forward(maker.split_rollout_samples(samples)))
