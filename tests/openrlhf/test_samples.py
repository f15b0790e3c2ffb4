"""Per-step expansion of multi-turn episodes by our OpenRLHF samples generator (CPU, real OpenRLHF code)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from progpo.agents.types import Episode, StepRecord


@pytest.fixture(scope="module")
def mods(cpu_compat):
    with cpu_compat.import_shims():
        from progpo.openrlhf import agent as openrlhf_agent, experience as openrlhf_experience, samples as openrlhf_samples

        return SimpleNamespace(samples=openrlhf_samples, agent=openrlhf_agent, experience=openrlhf_experience)


EOS = 99


def _step(prompt, resp, reward, *, term=False, trunc=False, invalid=False, obs="o", key="k", extra=None):
    return StepRecord(
        prompt_ids=list(prompt), response_ids=list(resp), logprobs=[-0.5 - 0.1 * i for i in range(len(resp))],
        response_text="x", action=f"act{len(resp)}", invalid=invalid, env_reward=reward, reward=reward,
        terminated=term, truncated=trunc, anchor_obs=obs, prefix_key=key, state_extra=extra,
        finish_reason="stop" if resp[-1] == EOS else "length",  # what the engine reports
    )


def recorded_episodes() -> list[Episode]:
    """Two rollouts of one task: a 3-step win and a 2-step truncated loss (token ids written by hand)."""
    win = Episode(uid="u", traj_id=0, split="train", task_index=3, won=True, steps=[
        _step([1, 2, 3], [10, 11, EOS], 0.0, obs="start", key="p0"),
        _step([1, 2, 4, 5], [12, EOS], -0.1, invalid=True, obs="room", key="p1"),
        _step([1, 2, 6], [13, 14, 15, EOS], 10.0, term=True, obs="shelf", key="p2", extra="keys"),
    ])
    loss = Episode(uid="u", traj_id=1, split="train", task_index=3, final_obs="garden", steps=[
        _step([1, 2, 3], [10, 16], 0.0, obs="start", key="p0"),
        _step([1, 2, 7], [17, EOS], 0.0, trunc=True, obs="hall", key="p3"),
    ])
    return [win, loss]


def _args(n=2, correction="off", train_batch=1, async_enable=False):
    return SimpleNamespace(
        rollout=SimpleNamespace(batch_size=1, n_samples_per_prompt=n, vllm_generate_batch_size=None, micro_batch_size=1),
        algo=SimpleNamespace(dynamic_filtering_enable=False, advantage=SimpleNamespace(
            estimator="progpo", is_correction_level=correction), kl=SimpleNamespace(init_coef=0.0)),
        train=SimpleNamespace(batch_size=train_batch, micro_batch_size=1, async_enable=async_enable),
        actor=SimpleNamespace(num_nodes=1, num_gpus_per_node=1), ref=SimpleNamespace(num_nodes=1, num_gpus_per_node=1),
        ds=SimpleNamespace(ring_attn_size=1, tensor_parallel_size=1),
        vllm=SimpleNamespace(enable_sleep=False),
    )


def _generator(mods, args, loader=()):
    return mods.samples.StepSamplesGenerator(
        strategy=SimpleNamespace(args=args), prompts_dataloader=list(loader), eval_dataloader=None,
        tokenizer=SimpleNamespace(eos_token_id=EOS, pad_token_id=0), vllm_engines=[],
    )


def _responses(mods, episodes, prompt='{"split": "train", "index": 3}'):
    return [mods.agent.transcript_response(ep, prompt=prompt, label="train:3", with_logprobs=1) for ep in episodes]


def test_expansion_gives_one_sample_per_step_with_metadata(mods):
    gen = _generator(mods, _args(correction="token"))
    episodes = recorded_episodes()
    samples = [gen._process_response_into_experience(r, max_len=64) for r in _responses(mods, episodes)]
    steps = gen.expand(samples, n_samples_per_prompt=2, max_len=64)
    assert len(steps) == 5
    flat = [(ep, t, s) for ep in episodes for t, s in enumerate(ep.steps)]
    for exp, (ep, t, s) in zip(steps, flat):
        p, r = len(s.prompt_ids), len(s.response_ids)
        assert exp.sequences.tolist() == [s.prompt_ids + s.response_ids]
        assert exp.attention_mask.shape == (1, p + r)
        # OpenRLHF convention: action_mask[j] covers token j+1 -> responses at p-1 .. p+r-2
        assert exp.action_mask.tolist() == [[False] * (p - 1) + [True] * r]
        assert exp.rollout_log_probs[0, p - 1 :].tolist() == pytest.approx(s.logprobs)
        assert exp.rollout_log_probs[0, : p - 1].abs().sum() == 0
        assert exp.rewards.tolist() == [pytest.approx(s.reward)]
        assert exp.response_length.tolist() == [r]
        assert exp.truncated.tolist() == [s.finish_reason == "length"]  # cut at the token limit
        assert exp.info["response_clip_ratio"].tolist() == [s.finish_reason == "length"]
        info = exp.info
        assert info["progpo/uid"] == ["b1g0:train:3"]
        assert info["progpo/traj_id"].tolist() == [ep.traj_id]
        assert info["progpo/step_index"].tolist() == [t]
        assert info["progpo/terminated"].tolist() == [s.terminated]
        assert info["progpo/truncated"].tolist() == [s.truncated]
        assert info["progpo/invalid"].tolist() == [s.invalid]
        assert info["progpo/anchor_obs"] == [s.anchor_obs]
        assert info["progpo/prefix_key"] == [s.prefix_key]
        assert info["progpo/action"] == [s.action]
        assert info["progpo/state_extra"] == [s.state_extra or ""]
        # the final observation sits on the last step of a truncated episode only, as in the local loop
        assert info["progpo/final_obs"] == [ep.final_obs if s.truncated else ""]
    assert [e.info["progpo/final_obs"][0] for e in steps] == ["", "", "", "", "garden"]
    assert gen.last_stats["env/success_rate"] == 0.5
    assert gen.last_stats["rollout/num_steps"] == 5
    assert gen.last_stats["rollout/truncated_response_frac"] == pytest.approx(1 / 5)  # one response hit the limit


def test_each_step_carries_its_policy_version_and_async_mode_keeps_behaviour_logprobs(mods):
    """Async mode attaches the behaviour log-probs even with the correction off; every step row carries the
    version its response was sampled under (``StepRecord.policy_version`` / ``_end``)."""
    episodes = recorded_episodes()
    for k, ep in enumerate(episodes):
        for t, step in enumerate(ep.steps):
            step.policy_version, step.policy_version_end = 4 + k, 4 + k + (t == 1)
    for async_enable in (False, True):
        gen = _generator(mods, _args(async_enable=async_enable))
        samples = [gen._process_response_into_experience(r, max_len=64) for r in _responses(mods, episodes)]
        steps = gen.expand(samples, n_samples_per_prompt=2, max_len=64)
        assert all((e.rollout_log_probs is not None) == async_enable for e in steps)
        flat = [s for ep in episodes for s in ep.steps]
        assert [e.info[mods.samples.POLICY_VERSION_KEY].tolist() for e in steps] == [[s.policy_version] for s in flat]
        assert [e.info[mods.samples.POLICY_VERSION_END_KEY].tolist() for e in steps] == \
            [[s.policy_version_end] for s in flat]


def test_step_rows_equal_the_local_loops_step_batch(mods):
    """The OpenRLHF path's per-step columns are the local loop's ``episodes_to_step_batch`` rows."""
    from progpo.agents.batching import episodes_to_step_batch

    gen = _generator(mods, _args())
    episodes = recorded_episodes()
    samples = [gen._process_response_into_experience(r, max_len=64) for r in _responses(mods, episodes)]
    ours = mods.experience.step_batch_from_experiences(gen.expand(samples, n_samples_per_prompt=2, max_len=64))
    for ep, k in zip(episodes, range(2)):
        ep.uid, ep.traj_id = "b1g0:train:3", k
    local = episodes_to_step_batch(episodes)
    for name in ("uid", "traj_id", "step_index", "reward", "terminated", "truncated", "invalid", "anchor_obs",
                 "prefix_key", "action", "state_extra", "final_obs"):
        assert getattr(ours, name).tolist() == getattr(local, name).tolist(), name


def test_generate_samples_expands_after_openrlhf_batching(mods):
    """The parent's generate_samples (buffer, chunking) runs unchanged; only its output is expanded."""
    args = _args()
    episodes = recorded_episodes()
    gen = _generator(mods, args, loader=[0])

    def fake_vllm(dataloader_iter, num_prompts, dynamic_filtering, **kw):
        next(dataloader_iter)
        return [gen._process_response_into_experience(r, **kw) for r in _responses(mods, episodes)], 1, True

    gen._generate_vllm = fake_vllm
    rows, _, consumed, exhausted = gen.generate_samples(max_len=64)
    assert (len(rows), consumed, exhausted) == (5, 1, True)
    assert [e.info["progpo/step_index"].item() for e in rows] == [0, 1, 2, 0, 1]
    gen = _generator(mods, _args(train_batch=4), loader=[0])  # batches of 4 step samples: 5 rows + 3 padding
    gen._generate_vllm = fake_vllm
    rows, *_ = gen.generate_samples(max_len=64)
    assert len(rows) == 8 and gen.last_stats["rollout/pad_rows"] == 3
    assert [e.action_mask.any().item() for e in rows] == [True] * 5 + [False] * 3


def test_long_prompt_loses_oldest_tokens_and_failed_episodes_are_dropped(mods):
    gen = _generator(mods, _args())
    episodes = recorded_episodes()
    episodes[1].failed = True
    samples = [gen._process_response_into_experience(r, max_len=6) for r in _responses(mods, episodes)]
    steps = gen.expand(samples, n_samples_per_prompt=2, max_len=6)
    assert len(steps) == 3 and gen.last_stats["rollout/failed_episodes"] == 1
    assert gen.last_stats["env/failed_frac"] == 0.5 and gen.last_stats["rollout/num_episodes"] == 2
    last = steps[2]  # prompt [1,2,6] + response of 4 tokens -> one prompt token cut
    assert last.sequences.tolist() == [[2, 6, 13, 14, 15, EOS]]
    assert last.info["progpo/prompt_cut_tokens"].tolist() == [1.0]


def test_groups_must_be_whole_and_single_prompt(mods):
    gen = _generator(mods, _args(n=2))
    resp = _responses(mods, recorded_episodes())
    samples = [gen._process_response_into_experience(r, max_len=64) for r in resp]
    with pytest.raises(ValueError, match="n_samples_per_prompt"):
        gen.expand(samples[:1], n_samples_per_prompt=2, max_len=64)
    other = gen._process_response_into_experience(
        _responses(mods, recorded_episodes()[:1], prompt='{"split": "train", "index": 4}')[0], max_len=64)
    with pytest.raises(ValueError, match="mixes prompts"):
        gen.expand([samples[0], other], n_samples_per_prompt=2, max_len=64)


def test_openrlhf_estimators_get_the_same_per_step_samples(mods):
    """Comparison mode (``group_norm``, ...): the engines still send each episode's transcript (OpenRLHF's
    multi-turn format, used by its evaluation), but training gets one sample per step, as for ours."""
    args = _args()
    args.algo.advantage.estimator = "group_norm"
    gen = _generator(mods, args, loader=[0])
    episodes = recorded_episodes()
    transcripts = [gen._process_response_into_experience(r, max_len=64) for r in _responses(mods, episodes)]
    tokens = [t for s in episodes[0].steps for t in s.prompt_ids + s.response_ids]
    assert transcripts[0].sequences.tolist() == [tokens]
    assert transcripts[0].rewards.item() == pytest.approx(episodes[0].episode_return)
    gen._generate_vllm = lambda dataloader_iter, num_prompts, dynamic_filtering, **kw: (transcripts, 1, True)
    rows, *_ = gen.generate_samples(max_len=64)
    assert len(rows) == 5 and [e.info["progpo/step_index"].item() for e in rows] == [0, 1, 2, 0, 1]
    assert gen.last_episodes == episodes
