"""Our experience maker on synthetic OpenRLHF ``Experience`` objects (CPU, real OpenRLHF code paths)."""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from progpo.advantages import ESTIMATORS, AdvantageConfig, StepBatch, compute_advantages
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


def _args(estimator, n, kl_use_loss=True, ranks=1, train_batch=8, train_micro=2, rollout_micro=4):
    return SimpleNamespace(
        rollout=SimpleNamespace(batch_size=3, n_samples_per_prompt=n, micro_batch_size=rollout_micro,
                                vllm_generate_batch_size=None),
        algo=SimpleNamespace(dynamic_filtering_enable=False, kl=SimpleNamespace(use_loss=kl_use_loss, init_coef=0.01),
                             advantage=SimpleNamespace(estimator=estimator, is_correction_level="off", gamma=1.0,
                                                       lambd=1.0, no_std_norm=False)),
        train=SimpleNamespace(dynamic_batch_enable=False, async_enable=False, batch_size=train_batch, micro_batch_size=train_micro),
        actor=SimpleNamespace(num_nodes=1, num_gpus_per_node=ranks), ref=SimpleNamespace(num_nodes=1, num_gpus_per_node=ranks),
        ds=SimpleNamespace(ring_attn_size=1, tensor_parallel_size=1),
        reward=SimpleNamespace(clip_range=(-10, 10), stop_properly_penalty_coef=None, overlong_buffer_len=None),
        vllm=SimpleNamespace(enable_sleep=False),
    )


def _rows(mods, groups, args, n, max_len=64):
    """The generator and the episode-level samples it receives from the engines (one transcript each)."""
    gen = mods.samples.StepSamplesGenerator(
        strategy=SimpleNamespace(args=args), prompts_dataloader=[], eval_dataloader=None,
        tokenizer=SimpleNamespace(eos_token_id=EOS, pad_token_id=0), vllm_engines=[])
    samples = []
    for eps in groups:
        prompt = f'{{"split": "train", "index": {eps[0].task_index}}}'
        for ep in eps:
            r = mods.agent.transcript_response(ep, prompt=prompt, label=eps[0].uid, with_logprobs=None)
            samples.append(gen._process_response_into_experience(r, max_len=max_len))
    return gen, samples


def _maker(mods, args, cfg=None, kl=0.0, gen=None):
    return mods.exp.StepExperienceMaker(
        None, None, None, None, mods.KL(kl), SimpleNamespace(args=args),
        SimpleNamespace(pad_token_id=0), advantage_config=cfg,
        episodes_source=None if gen is None else (lambda: gen.last_episodes))


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


# every registry entry, none named here; and ProGPO's options that change the estimator's arithmetic
@pytest.mark.parametrize("estimator, options", [(e, {}) for e in sorted(ESTIMATORS)]
                         + [("progpo", {"potential_target": "closure"})])
def test_step_advantages_equal_registry_on_action_tokens(mods, estimator, options):
    groups, n = synthetic_episodes(), 4
    args = _args(estimator, n)
    cfg = AdvantageConfig(estimator=estimator, semantic_expansion=False, max_steps=5, **options)
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


def test_flip_advantages_negates_every_step_advantage(mods):
    """``--debug.flip_advantages`` (a learning check's negative control): the same batch gets exactly the negated
    step advantages on its action tokens."""
    from progpo.openrlhf.launch import DebugSettings, RayArgs, RayRun

    groups, n = synthetic_episodes(), 4
    cfg = AdvantageConfig(estimator="progpo", semantic_expansion=False, max_steps=5)
    out = {}
    for flip in (False, True):
        args = _args("progpo", n)
        args.progpo = RayRun(settings=RayArgs(debug=DebugSettings(flip_advantages=flip)))
        gen, samples = _rows(mods, groups, args, n)
        maker = _maker(mods, args, cfg)
        done = maker.compute_advantages_and_returns(_forward(gen.expand(samples, n_samples_per_prompt=n, max_len=64)))
        out[flip] = torch.cat([e.advantages.flatten() for e in done])
    assert out[False].abs().max() > 0.1 and torch.equal(out[True], -out[False])


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


def _transcript_advantages(mods, groups, args, n, max_len):
    """OpenRLHF's own path: one transcript sample per episode, its estimator on them; ``[E]`` per-token values."""
    _, samples = _rows(mods, groups, args, n, max_len=max_len)
    theirs = mods.Parent(None, None, None, None, mods.KL(0.0), SimpleNamespace(args=args), SimpleNamespace(pad_token_id=0))
    out = theirs.compute_advantages_and_returns(_forward(theirs.split_rollout_samples(samples)))
    values = []
    for e in out:
        for b in range(e.sequences.size(0)):
            vals = e.advantages[b][e.action_mask[b].bool()]
            assert torch.allclose(vals, vals[0].expand_as(vals))  # gamma 1, KL as a loss: one value per transcript
            values.append(float(vals[0]))
    return values


@pytest.mark.parametrize("estimator", ["group_norm", "reinforce_baseline", "dr_grpo", "reinforce", "flash_reinforce"])  # rloo: ours
def test_openrlhf_estimators_put_the_transcripts_advantage_on_every_step(mods, estimator):
    """Comparison mode: each step row carries exactly what OpenRLHF puts on its episode's transcript."""
    groups, n = synthetic_episodes(seed=2), 4
    args = _args(estimator, n)
    expected = _transcript_advantages(mods, groups, args, n, max_len=64)  # short episodes: nothing cut
    assert np.std(expected) > 0.1
    gen, samples = _rows(mods, groups, args, n)
    maker = _maker(mods, args, gen=gen)
    out = maker.compute_advantages_and_returns(
        _forward(maker.split_rollout_samples(gen.step_samples(samples, n_samples_per_prompt=n, max_len=64))))
    n_steps = 0
    for e in out:
        traj = e.info.get("progpo/traj_id")
        assert traj is None  # per-step keys removed before training
        for b in range(e.sequences.size(0)):
            m = e.action_mask[b].bool()
            if not m.any():
                continue  # padding row
            n_steps += 1
    assert n_steps == sum(len(ep.steps) for eps in groups for ep in eps)
    rows = [(g * n + k) for g, eps in enumerate(groups) for k, ep in enumerate(eps) for _ in ep.steps]
    got = [float(v) for e in out for b, v in enumerate(e.info["adv/step_advantage"]) if e.action_mask[b].any()]
    np.testing.assert_allclose(got, [expected[r] for r in rows], rtol=1e-6, atol=1e-6)


def test_comparison_mode_trains_on_every_step_at_realistic_prompt_lengths(mods):
    """10 steps of 2,000-token prompts and 100-token responses, --data.max_len 2560 (the scripts' value):
    OpenRLHF's transcript of an episode is 21,000 tokens and its action mask would reach step 0 only;
    per-step rows put every response under the action mask, each with the episode's advantage."""
    rng = random.Random(3)
    n, max_len, groups = 4, 2560, []
    for u in range(2):
        eps = []
        for k in range(n):
            won = k % 2 == 0
            steps = [StepRecord(prompt_ids=[rng.randrange(3, 900) for _ in range(2000)],
                                response_ids=[rng.randrange(3, 900) for _ in range(99)] + [EOS],
                                logprobs=[-1.0] * 100, response_text="a", action="look", invalid=False,
                                env_reward=10.0 * (won and t == 9), reward=10.0 * (won and t == 9),
                                terminated=won and t == 9, truncated=not won and t == 9, anchor_obs=f"o{t}",
                                prefix_key=f"{u}{k}{t}") for t in range(10)]
            eps.append(Episode(uid=f"u{u}", traj_id=u * n + k, split="train", task_index=u, steps=steps, won=won))
        groups.append(eps)
    args = _args("group_norm", n)
    gen, samples = _rows(mods, groups, args, n, max_len=max_len)
    transcript_mask = samples[0].action_mask[0]
    assert int(transcript_mask.sum()) == 100  # what OpenRLHF alone would train on: step 0's response
    maker = _maker(mods, args, gen=gen)
    out = maker.compute_advantages_and_returns(
        _forward(maker.split_rollout_samples(gen.step_samples(samples, n_samples_per_prompt=n, max_len=max_len))))
    covered = []
    for e in out:
        for b in range(e.sequences.size(0)):
            m = e.action_mask[b].bool()
            if m.any():
                covered.append(int(m.sum()))
                vals = e.advantages[b][m]
                assert torch.allclose(vals, vals[0].expand_as(vals)) and abs(float(vals[0])) > 0.5
    assert covered == [100] * 80  # every step of every episode, its whole response


def test_padding_rows_are_no_steps_and_get_no_advantage(mods):
    groups, n = synthetic_episodes(n_tasks=3, n_rollouts=4, seed=4), 4
    args = _args("progpo", n, ranks=2, train_batch=16, train_micro=2, rollout_micro=4)
    cfg = AdvantageConfig(estimator="progpo", semantic_expansion=False, max_steps=5)
    gen, samples = _rows(mods, groups, args, n)
    steps = gen.step_samples(samples, n_samples_per_prompt=n, max_len=64)
    n_real = sum(len(ep.steps) for eps in groups for ep in eps)
    assert len(steps) % 16 == 0 and len(steps) - n_real == gen.last_stats["rollout/pad_rows"] > 0
    half = len(steps) // 2  # each policy rank's share holds half the real rows (one more on rank 0 if odd)
    real_per_rank = [sum(bool(s.action_mask.any()) for s in steps[r * half:(r + 1) * half]) for r in range(2)]
    assert real_per_rank == [(n_real + 1) // 2, n_real // 2]
    maker = _maker(mods, args, cfg)
    out = maker.compute_advantages_and_returns(_forward(maker.split_rollout_samples(steps)))
    expected = compute_advantages(_direct(groups), cfg).advantages  # the padding changed nothing
    got = [float(v) for e in out for b, v in enumerate(e.info["adv/step_advantage"]) if e.action_mask[b].any()]
    np.testing.assert_allclose(got, expected.astype(np.float32), rtol=1e-6, atol=1e-6)
    for e in out:
        pad = ~e.action_mask.bool().any(-1)
        assert not e.advantages[pad].any() and not e.info["adv/step_advantage"][pad].any()


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
