"""Our OpenRLHF agent executor on real ALFWorld games through our Ray env actors (``env.pool = ray``).

Only the vLLM engine is replaced (a script that answers each step with the game's expert walkthrough
command); the envs are ``progpo.envs.ray_pool.RayEnvPool`` actors in an in-process Ray cluster.
"""

from __future__ import annotations

import asyncio
import json
import re
from types import SimpleNamespace

import pytest

from progpo.run.settings import EnvSettings

alfworld = pytest.importorskip("progpo.envs.alfworld")

SPLIT, INDEX = "valid_seen", 0


@pytest.fixture(scope="module")
def mods(cpu_compat):
    with cpu_compat.import_shims():
        from progpo.openrlhf import agent as openrlhf_agent

        return SimpleNamespace(agent=openrlhf_agent, VllmParams=cpu_compat.SamplingParams)


@pytest.fixture(scope="module")
def walkthrough(shared_data) -> list[str]:
    env = alfworld.AlfWorldEnv()
    _, info = env.reset(split=SPLIT, index=INDEX)
    with open(info["game_file"]) as f:
        plan = json.load(f)["walkthrough"]
    env.close()
    return plan


class ExpertEngine:
    """vLLM engine stand-in: answers step t with the walkthrough's t-th command (real token ids)."""

    def __init__(self, tokenizer, plan: list[str]) -> None:
        self.tok, self.plan, self.calls = tokenizer, plan, 0

    async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None):
        self.calls += 1
        await asyncio.sleep(0)
        m = re.search(r"You are now at step (\d+)", self.tok.decode(prompt_token_ids))
        step = int(m.group(1)) if m else 1
        text = f"<think>plan step {step}</think><action>{self.plan[step - 1]}</action>"
        ids = self.tok(text, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
        out = SimpleNamespace(token_ids=ids, text=text, finish_reason="stop",
                              logprobs=[{t: SimpleNamespace(logprob=0.0)} for t in ids])
        return SimpleNamespace(outputs=[out])


@pytest.mark.slow
def test_executor_plays_alfworld_in_ray_env_actors(mods, qwen3_tokenizer, walkthrough):
    import ray

    started = not ray.is_initialized()
    env = EnvSettings(name="alfworld", pool="ray", max_steps=len(walkthrough) + 5, num_env_actors=2,
                      num_cpus_per_actor=0.5)
    cfg = mods.agent.AgentConfig(env=env)
    executor = mods.agent.AgentExecutor(cfg)
    engine = ExpertEngine(qwen3_tokenizer, walkthrough)
    params = mods.VllmParams(max_tokens=128, logprobs=1)

    async def run():
        try:
            return await asyncio.gather(*[
                executor.execute(prompt=json.dumps({"split": SPLIT, "index": INDEX}), label="g0",
                                 sampling_params=params, max_length=4096, hf_tokenizer=qwen3_tokenizer,
                                 llm_engine=engine)
                for _ in range(2)])
        finally:
            await executor._pool.close()

    try:
        responses = asyncio.run(run())
        assert type(executor._pool).__name__ == "RayEnvPool"
    finally:
        if started:
            ray.shutdown()
    for r in responses:
        ep = r[mods.agent.RESPONSE_EPISODE_KEY]
        assert not ep.failed and ep.won and ep.steps[-1].terminated
        assert [s.action for s in ep.steps] == walkthrough[: len(ep.steps)]
        assert r["reward"] == pytest.approx(ep.episode_return) and ep.steps[-1].reward > 0
        assert all(s.state_extra is not None for s in ep.steps)  # inventory travels as extra state
        assert len(r["rollout_log_probs"]) == len(r["observation_tokens"])
