"""Failed episodes on the distributed path: each error fails its episode only, counted by kind; a batch
with too many failed episodes stops the job with one line naming the cause (exit 3).

Cheap: a scripted engine, scripted env pools, the tiny tokenizer, no Ray cluster. The same failure
on a real CPU job (OpenRLHF's trainer, a WebShop URL on a closed port) runs in
``test_cpu_job.py::test_job_pointed_at_a_closed_port_stops_with_one_line``.
"""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

from progpo.agents.types import Episode, StepRecord
from progpo.envs.base import EnvUnreachable, StepResult
from progpo.openrlhf.launch import RayRun
from progpo.run.settings import EnvSettings

TASK = json.dumps({"split": "test", "index": 0})


@pytest.fixture(scope="module")
def mods(cpu_compat):
    with cpu_compat.import_shims():
        from progpo.cli import train_ray
        from progpo.openrlhf import agent, samples, trainer
        from progpo.run import failures

        return SimpleNamespace(agent=agent, failures=failures, samples=samples, train_ray=train_ray, trainer=trainer,
                               VllmParams=cpu_compat.SamplingParams)


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from progpo.run.tiny_model import tiny_model_path

    return AutoTokenizer.from_pretrained(str(tiny_model_path()))


class Engine:
    """vLLM engine stand-in: a fixed answer, finishing with ``reason``, or raising ``error``."""

    def __init__(self, tok, reason="stop", error=None):
        self.tok, self.reason, self.error = tok, reason, error

    async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None):
        if self.error:
            raise self.error
        ids = self.tok("<think>x</think><action>search[shoes]</action>", add_special_tokens=False)["input_ids"]
        out = SimpleNamespace(token_ids=ids, text="", finish_reason=self.reason,
                              logprobs=[{t: SimpleNamespace(logprob=-1.0)} for t in ids])
        return SimpleNamespace(outputs=[out])


class Pool:
    """Env pool stand-in: ``reset`` raises ``error`` (when given), else a one-step WebShop-like episode."""

    def __init__(self, error=None):
        self.error, self.released = error, 0

    async def reset(self, episode_id, *, split, index=None, seed=None):
        if self.error:
            raise self.error
        return "Search", {"task": "find shoes", "task_id": "0", "anchor_observation": "Search",
                          "admissible_actions": ["search[<query>]"], "won": False, "invalid_action": False}

    async def step(self, episode_id, action):
        return StepResult("done", 1.0, True, False, {"task": "find shoes", "task_id": "0", "anchor_observation": "done",
                                                      "admissible_actions": [], "won": True, "invalid_action": False})

    async def release(self, episode_id):
        self.released += 1

    async def close(self):
        pass


@pytest.mark.parametrize("engine_kw, pool_error, kind", [
    ({}, EnvUnreachable("WebShop server at http://127.0.0.1:9 unreachable: refused"), "env_unreachable"),
    ({}, ValueError("WebShop server rejected /api/sessions: 400 bad split"), "env_rejected"),
    ({"reason": "abort"}, None, "engine_abort"),
    ({"error": ValueError("prompt of 9000 tokens is longer than the maximum model length")}, None, "engine_rejected"),
])
def test_an_episode_error_fails_that_episode_only(mods, tokenizer, engine_kw, pool_error, kind):
    cfg = mods.agent.AgentConfig(env=EnvSettings(name="webshop", pool="local", max_steps=3))
    pool = Pool(pool_error)
    executor = mods.agent.AgentExecutor(cfg, env_pool=pool)
    response = asyncio.run(executor.execute(prompt=TASK, label="l", sampling_params=mods.VllmParams(max_tokens=32),
                                            max_length=2048, hf_tokenizer=tokenizer,
                                            llm_engine=Engine(tokenizer, **engine_kw)))
    ep = response[mods.agent.RESPONSE_EPISODE_KEY]
    assert ep.failed and ep.failure_kind == kind and "\n" not in ep.failure_message
    assert pool.released == 1  # the episode id is always released (no env left behind)
    ok = asyncio.run(mods.agent.AgentExecutor(cfg, env_pool=Pool()).execute(
        prompt=TASK, label="l", sampling_params=mods.VllmParams(max_tokens=32), max_length=2048,
        hf_tokenizer=tokenizer, llm_engine=Engine(tokenizer)))[mods.agent.RESPONSE_EPISODE_KEY]
    assert not ok.failed and ok.won  # the same executor path without the error plays the episode


def _episode(k, kind=""):
    step = StepRecord(prompt_ids=[5, 6], response_ids=[7, 2], logprobs=[-1.0, -1.0], response_text="a", action="a",
                      invalid=False, env_reward=0.0, reward=0.0, terminated=True, truncated=False, anchor_obs="o",
                      prefix_key=f"k{k}")
    return Episode(uid="u", traj_id=k, split="test", task_index=0, steps=[] if kind else [step], failed=bool(kind),
                   failure_kind=kind, failure_message=f"{kind}: message {k}" if kind else "")


def test_threshold_stops_a_batch_that_mostly_failed_and_always_an_all_failed_one(mods):
    f = mods.failures
    five = [_episode(0, "env_unreachable"), _episode(1, "env_unreachable"), _episode(2, "engine_abort"),
            _episode(3), _episode(4)]
    assert f.failure_metrics(five) == {"rollout/failed_episodes": 3.0, "rollout/failed/engine_abort": 1.0,
                                       "rollout/failed/env_unreachable": 2.0}
    f.check_failures(five, max_failed_frac=0.6, batch=1)  # 3 of 5 = 0.6: not more than the threshold
    with pytest.raises(f.RolloutFailed) as exc:
        f.check_failures(five, max_failed_frac=0.5, batch=7)
    line = str(exc.value)
    assert "\n" not in line and line.startswith("rollout batch 7: 3 of 5 episodes failed (--env.max_failed_frac 0.5)")
    assert "cause: env_unreachable (2 of 3 failed): env_unreachable: message 0" in line
    with pytest.raises(f.RolloutFailed, match="2 of 2 episodes failed"):
        f.check_failures([_episode(0, "env_not_started"), _episode(1, "env_not_started")], max_failed_frac=1.0, batch=1)


def test_generator_counts_failures_by_kind_and_stops_on_the_threshold(mods):
    cfg = mods.agent.AgentConfig(env=EnvSettings(name="webshop", max_failed_frac=0.25), env_kwargs={"base_url": "http://h:1"})
    args = SimpleNamespace(progpo=RayRun(agent=cfg),
                           algo=SimpleNamespace(advantage=SimpleNamespace(estimator="progpo", is_correction_level="off")),
                           train=SimpleNamespace(async_enable=False))
    gen = mods.samples.StepSamplesGenerator(strategy=SimpleNamespace(args=args), prompts_dataloader=[],
                                            eval_dataloader=None, tokenizer=SimpleNamespace(pad_token_id=0),
                                            vllm_engines=[])
    assert gen.max_failed_frac == 0.25

    def samples(kinds):
        out = []
        for k, kind in enumerate(kinds):
            r = mods.agent.transcript_response(_episode(k, kind), prompt=TASK, label="u", with_logprobs=None)
            out.append(gen._process_response_into_experience(r, max_len=64))
        return out

    rows = gen.expand(samples(["", "", "", "env_actor_died"]), n_samples_per_prompt=4, max_len=64)
    assert len(rows) == 3 and gen.last_stats["rollout/failed/env_actor_died"] == 1.0  # 1 of 4: at the threshold
    with pytest.raises(mods.failures.RolloutFailed, match="2 of 4 episodes failed.*cause: env_data_missing"):
        gen.expand(samples(["", "", "env_data_missing", "env_data_missing"]), n_samples_per_prompt=4, max_len=64)


def test_train_ray_turns_the_failure_into_one_line_and_exit_3(mods, train_ray_stopped_by, capsys):
    """What ``ray.get`` raises in the driver when the trainer actor raised RolloutFailed: a RayTaskError
    that is also a RolloutFailed; ``main`` prints one line and exits 3, nothing else runs."""
    cause = mods.failures.RolloutFailed("rollout batch 1: 8 of 8 episodes failed (--env.max_failed_frac 0.5); "
                                        "cause: env_unreachable (8 of 8 failed): WebShop server at http://127.0.0.1:9 "
                                        "unreachable")
    assert train_ray_stopped_by(cause) == mods.failures.EXIT_ROLLOUT_FAILED == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"python -m progpo.cli.train_ray: error: {cause}"]
