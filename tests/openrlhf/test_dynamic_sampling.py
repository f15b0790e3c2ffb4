"""``--rollout.dynamic_sampling`` on the OpenRLHF path: our samples generator drops the groups without a
return signal and draws new prompts for them (real OpenRLHF ``generate_samples``; the engines are a stand-in)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from progpo.agents.types import Episode, StepRecord
from progpo.openrlhf.launch import RayArgs, RayRun
from progpo.run.settings import RolloutSettings

EOS = 99


@pytest.fixture(scope="module")
def mods(cpu_compat):
    with cpu_compat.import_shims():
        from progpo.openrlhf import agent, samples

        return SimpleNamespace(samples=samples, agent=agent)


def _episode(uid: str, traj: int, rewards: list[float], index: int) -> Episode:
    ep = Episode(uid=uid, traj_id=traj, split="train", task_index=index)
    for t, r in enumerate(rewards):
        ep.steps.append(StepRecord(
            prompt_ids=[1, 2, t + 3], response_ids=[10 + t, EOS], logprobs=[-0.5, -0.1], response_text="x",
            action="a", invalid=False, env_reward=r, reward=r, terminated=t == len(rewards) - 1, truncated=False,
            anchor_obs=f"o{t}", prefix_key=f"{uid}{t}"))
    return ep


def _args(rounds, batch_size=2, n=2, advantage=None):
    return SimpleNamespace(
        rollout=SimpleNamespace(batch_size=batch_size, n_samples_per_prompt=n, vllm_generate_batch_size=None,
                                micro_batch_size=1),
        algo=SimpleNamespace(dynamic_filtering_enable=False, advantage=SimpleNamespace(
            estimator="progpo", is_correction_level="off"), kl=SimpleNamespace(init_coef=0.0)),
        train=SimpleNamespace(batch_size=1, micro_batch_size=1, async_enable=False),  # no padding rows: counts stay the step counts
        actor=SimpleNamespace(num_nodes=1, num_gpus_per_node=1), ref=SimpleNamespace(num_nodes=1, num_gpus_per_node=1),
        ds=SimpleNamespace(ring_attn_size=1, tensor_parallel_size=1),
        vllm=SimpleNamespace(enable_sleep=False), progpo=RayRun(settings=RayArgs(rollout=RolloutSettings(
            dynamic_sampling=rounds is not None, dynamic_sampling_max_rounds=2 if rounds is None else rounds)),
            advantage=advantage),
    )


def _generator(mods, args, signal: set[int], prompts: int, failed: bool = False, rewards=None):
    """A generator whose engines play prompt ``k`` twice: returns (1, 0) if ``k`` in ``signal``, else (0, 0);
    with ``failed`` every episode failed (env unreachable) instead. ``rewards``: the step rewards of every
    episode of a prompt instead (one list per episode)."""
    gen = mods.samples.StepSamplesGenerator(
        strategy=SimpleNamespace(args=args), prompts_dataloader=[[k] for k in range(prompts)], eval_dataloader=None,
        tokenizer=SimpleNamespace(eos_token_id=EOS, pad_token_id=0), vllm_engines=[])
    asked: list[int] = []

    def fake_vllm(dataloader_iter, num_prompts, dynamic_filtering, **kw):
        asked.append(num_prompts)
        out, consumed, exhausted = [], 0, False
        for _ in range(num_prompts):
            try:
                (k,) = next(dataloader_iter)
            except StopIteration:
                exhausted = True
                break
            consumed += 1
            played = rewards or [[0.0, r] for r in ((1.0, 0.0) if k in signal else (0.0, 0.0))]
            for j, steps in enumerate(played):
                ep = _episode(f"train:{k}", len(played) * k + j, steps, k)
                if failed:
                    ep.steps.clear()
                    ep.failed, ep.failure_kind, ep.failure_message = True, "env_unreachable", "refused"
                resp = mods.agent.transcript_response(ep, prompt=f"p{k}", label=f"train:{k}", with_logprobs=None)
                out.append(gen._process_response_into_experience(resp, **kw))
        return out, consumed, exhausted

    gen._generate_vllm = fake_vllm
    return gen, asked


def _prompts(rows) -> list[str]:
    return [r.prompts[0] for r in rows]


def test_zero_signal_groups_are_replaced_by_new_draws(mods):
    gen, asked = _generator(mods, _args(rounds=3), signal={1, 3}, prompts=10)
    rows, _, consumed, exhausted = gen.generate_samples(max_len=64)
    # first draw: prompts 0 (flat) and 1; round 1: prompt 2 (flat); round 2: prompt 3 -> two groups kept
    assert asked == [2, 1, 1] and consumed == 4 and not exhausted
    assert _prompts(rows) == ["p1"] * 4 + ["p3"] * 4  # 2 episodes x 2 steps per kept group
    s = gen.last_stats
    assert (s["rollout/dynamic_dropped_frac"], s["rollout/dynamic_extra_groups"], s["rollout/dynamic_rounds"]) == (
        0.5, 2.0, 2.0)
    assert s["rollout/num_episodes"] == 4.0  # the expanded batch: kept groups only


def test_round_cap_and_nothing_left_gives_an_empty_batch(mods):
    gen, asked = _generator(mods, _args(rounds=1), signal=set(), prompts=10)
    rows, _, consumed, _ = gen.generate_samples(max_len=64)
    assert rows == [] and asked == [2, 2] and consumed == 4  # OpenRLHF's trainer then skips and draws again


def test_an_all_failed_draw_stops_the_job_instead_of_being_dropped_as_flat(mods):
    """Failed episodes have no return signal: without the threshold on the whole draw, dynamic sampling
    would drop them all and OpenRLHF would skip the empty batch (no update, exit 0 at the end)."""
    gen, asked = _generator(mods, _args(rounds=3), signal={0, 1}, prompts=10, failed=True)
    from progpo.run.failures import RolloutFailed

    with pytest.raises(RolloutFailed, match="4 of 4 episodes failed"):
        gen.generate_samples(max_len=64)
    assert asked == [2]  # stopped before any extra draw


def test_a_short_dataloader_ends_the_draws(mods):
    gen, asked = _generator(mods, _args(rounds=5), signal={0}, prompts=3)
    rows, _, consumed, exhausted = gen.generate_samples(max_len=64)
    # the last draw finds the loader empty (OpenRLHF learns of the end only from StopIteration)
    assert _prompts(rows) == ["p0"] * 4 and consumed == 3 and exhausted and asked == [2, 1, 1]


def test_off_keeps_every_group(mods):
    gen, asked = _generator(mods, _args(rounds=None), signal=set(), prompts=10)
    rows, _, consumed, _ = gen.generate_samples(max_len=64)
    assert len(rows) == 8 and asked == [2] and consumed == 2
    assert not any(k.startswith("rollout/dynamic_") for k in gen.last_stats)


# Every episode returns R = -0.1; the penalty falls at step 0 in two of them and at step 1 in the other two, so
# with gamma 0.95 their discounted returns differ: G_0 = -0.1 and 0.95 x -0.1 = -0.095 (hand values).
TIMING_ONLY = [[-0.1, 0.0], [0.0, -0.1], [-0.1, 0.0], [0.0, -0.1]]


def test_signal_blocks_judge_a_group_on_its_discounted_return(mods):
    """``_signal_blocks`` with gamma 0.95 keeps a group whose returns differ only in timing (4 kept, 0 dropped);
    on the episode return (gamma None, OpenRLHF's own estimators) the same group is flat and dropped."""
    from progpo.run.dynamic_sampling import DynamicSamplingStats, signal_return

    gen, _ = _generator(mods, _args(rounds=1, batch_size=1, n=4), signal=set(), prompts=1, rewards=TIMING_ONLY)
    block, _, _ = gen._generate_vllm(iter(gen.prompts_dataloader), 1, False)
    episodes = [getattr(e, mods.samples.EPISODE_ATTR) for e in block]
    assert [signal_return(ep) for ep in episodes] == pytest.approx([-0.1] * 4)
    assert [signal_return(ep, 0.95) for ep in episodes] == pytest.approx([-0.1, -0.095, -0.1, -0.095], abs=1e-12)
    stats = DynamicSamplingStats()
    kept = mods.samples.StepSamplesGenerator._signal_blocks(block, 4, stats, 0.95)
    assert kept == block and (stats.drawn_groups, stats.dropped_groups) == (1, 0)
    flat = DynamicSamplingStats()
    assert mods.samples.StepSamplesGenerator._signal_blocks(block, 4, flat, None) == []
    assert (flat.drawn_groups, flat.dropped_groups) == (1, 1)


def test_a_progpo_run_keeps_a_group_whose_returns_differ_only_in_timing(mods):
    """The generator takes gamma from the run's ProGPO settings (``signal_discount``: the discounted return is
    the one ProGPO's default judges "no return signal" on): the timing-only group is kept, nothing redrawn."""
    from progpo.advantages import AdvantageConfig

    args = _args(rounds=2, batch_size=1, n=4, advantage=AdvantageConfig(estimator="progpo", max_steps=2))
    gen, asked = _generator(mods, args, signal=set(), prompts=10, rewards=TIMING_ONLY)
    rows, _, consumed, _ = gen.generate_samples(max_len=64)
    assert asked == [1] and consumed == 1 and _prompts(rows) == ["p0"] * 8  # 4 episodes x 2 steps
    s = gen.last_stats
    assert (s["rollout/dynamic_kept_groups"], s["rollout/dynamic_dropped_groups"], s["rollout/dynamic_rounds"]) == (
        1.0, 0.0, 0.0)
    gen, asked = _generator(mods, _args(rounds=2, batch_size=1, n=4, advantage=AdvantageConfig(
        estimator="grpo", max_steps=2)), signal=set(), prompts=10, rewards=TIMING_ONLY)
    assert gen.generate_samples(max_len=64)[0] == [] and asked == [1, 1, 1]  # GRPO judges on R: flat, redrawn


# ---- the flag on train_ray ---------------------------------------------------------------------------
BASE = ["--actor.model_name_or_path", "/models/qwen", "--env.name", "webshop", "--env.url", "http://10.0.0.1:3000",
        "--env.num_tasks", "16", "--rollout.n_samples_per_prompt", "8", "--rollout.batch_size", "16"]


@pytest.fixture(scope="module")
def train_ray(cpu_compat):
    with cpu_compat.import_shims():
        from progpo.cli import train_ray

        train_ray.build_parser()
        return train_ray


def _finalize(train_ray, argv, tmp_path):
    parser = train_ray.build_parser()
    return train_ray.finalize(parser, parser.parse_args(argv + ["--ckpt.path", str(tmp_path / "ckpt")]))


def test_train_ray_hands_the_round_cap_to_the_samples_generator(train_ray, tmp_path, capsys):
    assert _finalize(train_ray, BASE, tmp_path).progpo.dynamic_sampling_max_rounds is None
    ns = _finalize(train_ray, BASE + ["--rollout.dynamic_sampling", "true", "--rollout.dynamic_sampling_max_rounds",
                                      "4"], tmp_path)
    assert ns.progpo.dynamic_sampling_max_rounds == 4 and getattr(ns, "algo.dynamic_filtering_enable") is False
    assert not any(k.startswith("rollout.dynamic_sampling") for k in vars(ns))
    with pytest.raises(SystemExit):  # OpenRLHF's own estimators have their own filter
        _finalize(train_ray, BASE + ["--algo.advantage.estimator", "reinforce_baseline", "--algo.kl.use_loss",
                                     "--rollout.dynamic_sampling", "true"], tmp_path)
    assert "--rollout.dynamic_sampling" in capsys.readouterr().err
