"""Our OpenRLHF agent executor on the REAL WebShop server; only the vLLM engine is replaced by a script.

The executor is driven exactly as OpenRLHF's ``RolloutRayActor.generate_responses`` drives it:
``execute(prompt, label, sampling_params, max_length, hf_tokenizer, llm_engine)`` for every rollout,
all gathered concurrently on one event loop. The scripted engine answers ``generate`` with real
token ids of the real Qwen3 tokenizer; the env traffic is real async HTTP to a server subprocess.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from types import SimpleNamespace

import pytest

from progpo.run.settings import EnvSettings

from envs.webshop_server.process import WebShopServerProcess
from progpo_tests.patience import PATIENCE_S


@pytest.fixture(scope="module")
def mods(cpu_compat):
    with cpu_compat.import_shims():
        from progpo.openrlhf import agent as openrlhf_agent, experience as openrlhf_experience
        from progpo.openrlhf import samples as openrlhf_samples

        return SimpleNamespace(agent=openrlhf_agent, samples=openrlhf_samples, experience=openrlhf_experience,
                               VllmParams=cpu_compat.SamplingParams)


@pytest.fixture(scope="module")
def webshop(shared_data):
    from envs.webshop_server.reward import get_reward
    from envs.webshop_server.shop import Shop, ShopConfig

    data = shared_data / "webshop"
    shop = Shop(ShopConfig(data_dir=str(data)))
    lo, hi = shop.splits.range("train")
    winnable = []  # train goals whose goal product with the goal options scores 1.0 (oracle)
    for gi in range(lo, hi):
        goal = shop.goals[gi]
        score, _ = get_reward(shop.catalog.by_asin[goal["asin"]], goal, shop.catalog.prices[goal["asin"]],
                              goal["goal_options"])
        if score == 1.0:
            winnable.append((gi - lo, goal))
    with WebShopServerProcess(data_dir=data, port=0, threads=16, start_timeout_s=PATIENCE_S) as server:
        yield SimpleNamespace(url=server.url, winnable=winnable)


class ScriptedEngine:
    """Stands in for OpenRLHF's vLLM engine actor: ``await generate(prompt_token_ids, sampling_params)``.

    The script reads the step prompt (task, admissible actions, last action of the history window)
    and buys the goal product with the goal options; ``wrong`` tasks buy the first result instead.
    """

    OVERLAP = 8
    """Generate calls the executor must have in flight at once."""

    def __init__(self, tokenizer, goals: dict[str, dict], wrong: set[str]) -> None:
        self.tok, self.goals, self.wrong = tokenizer, goals, wrong
        self.in_flight = self.peak_in_flight = self.calls = 0
        self.overlapped = asyncio.Event()  # set once OVERLAP calls were in flight together

    def policy(self, prompt: str) -> str:
        task = re.search(r"Your task is to: ([^\n]*)\.\n", prompt).group(1)
        goal = self.goals[task]
        actions_block = prompt.split("admissible actions in the current situation are:")[-1]
        admissible = re.findall(r"'((?:search|click)\[[^\]]*\])'", actions_block)
        history = re.findall(r"Action \d+: '(.*?)'\]", prompt)
        last = history[-1] if history else ""
        target = f"click[{goal['asin'].lower()}]"
        options = [f"click[{v}]" for v in goal["goal_options"].values()]
        if "search[<your query>]" in admissible:
            return f"search[{goal['name'].lower()}]"
        items = [a for a in admissible if re.fullmatch(r"click\[b0[0-9a-z]{8}\]", a)]
        if task in self.wrong and items:
            return items[-1] if items[-1] != target else items[0]
        if target in admissible:
            return target
        if "click[buy now]" in admissible:
            if task in self.wrong:
                return "click[buy now]"
            nxt = 0 if last == target else options.index(last) + 1 if last in options else len(options)
            return options[nxt] if nxt < len(options) else "click[buy now]"
        return "click[next >]" if "click[next >]" in admissible else admissible[0]

    async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None):
        self.calls += 1
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            if self.in_flight >= self.OVERLAP:
                self.overlapped.set()
            if not self.overlapped.is_set():  # hold the first calls until OVERLAP are in flight, so the overlap
                with contextlib.suppress(asyncio.TimeoutError):  # does not hang on the machine's timing (each
                    await asyncio.wait_for(self.overlapped.wait(), 30.0)  # episode resets over HTTP first); after
                self.overlapped.set()  # 30 s (serial calls) stop holding any
            await asyncio.sleep(0.001)  # a real engine yields while it decodes
            text = f"<think>step {self.calls}</think><action>{self.policy(self.tok.decode(prompt_token_ids))}</action>"
            ids = self.tok(text, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
            ids = ids[: sampling_params.max_tokens]
            logprobs = [{t: SimpleNamespace(logprob=-0.25)} for t in ids]
            out = SimpleNamespace(token_ids=ids, text=self.tok.decode(ids, skip_special_tokens=True),
                                  logprobs=logprobs if sampling_params.logprobs else None, finish_reason="stop")
            return SimpleNamespace(outputs=[out])
        finally:
            self.in_flight -= 1


def test_executor_plays_real_webshop_episodes_concurrently(mods, qwen3_tokenizer, webshop):
    tasks = webshop.winnable[:6]
    n_rollouts = 4
    wrong = {tasks[0][1]["instruction_text"]}
    engine = ScriptedEngine(qwen3_tokenizer, {g["instruction_text"]: g for _, g in tasks}, wrong)
    cfg = mods.agent.AgentConfig(env=EnvSettings(name="webshop", pool="http", max_steps=15),
                                 env_kwargs={"base_url": webshop.url, "timeout_s": PATIENCE_S})
    executor = mods.agent.AgentExecutor(cfg)
    params = mods.VllmParams(temperature=1.0, top_p=1.0, max_tokens=96, logprobs=None)

    async def run_all():
        coros = [executor.execute(prompt=json.dumps({"split": "train", "index": i}), label=f"train:{i}",
                                  sampling_params=params, max_length=4096, hf_tokenizer=qwen3_tokenizer,
                                  llm_engine=engine)
                 for i, _ in tasks for _ in range(n_rollouts)]
        try:
            return await asyncio.gather(*coros)
        finally:
            pool = executor._pool
            await pool.close()

    responses = asyncio.run(run_all())
    pool = executor._pool
    assert type(pool).__name__ == "AsyncWebShopPool"
    assert len(responses) == len(tasks) * n_rollouts
    # many episodes in flight at once: generation and HTTP requests overlapped on the one event loop
    assert engine.peak_in_flight >= ScriptedEngine.OVERLAP
    assert pool.stats.peak_in_flight >= 4 and pool.stats.in_flight == 0
    for k, r in enumerate(responses):
        ep = r[mods.agent.RESPONSE_EPISODE_KEY]
        task_text = tasks[k // n_rollouts][1]["instruction_text"]
        assert not ep.failed and ep.steps[-1].terminated
        assert ep.won == (task_text not in wrong)
        assert r["reward"] == pytest.approx(ep.episode_return)
        assert (ep.steps[-1].reward == 10.0) == ep.won
        assert ep.steps[0].action.startswith("search[") and ep.steps[-1].action == "click[buy now]"
        assert all(s.logprobs == [-0.25] * len(s.response_ids) for s in ep.steps)
        assert r["action_ranges"][0][0] == len(ep.steps[0].prompt_ids)
        # the prompt of step t shows at most K = 2 earlier steps
        assert all(qwen3_tokenizer.decode(s.prompt_ids).count("Action ") <= 2 for s in ep.steps)

    # the recorded episodes expand into per-step samples with shared uids per task
    gen = mods.samples.StepSamplesGenerator(
        strategy=SimpleNamespace(args=SimpleNamespace(
            rollout=SimpleNamespace(n_samples_per_prompt=n_rollouts),
            algo=SimpleNamespace(advantage=SimpleNamespace(estimator="progpo", is_correction_level="off")),
            train=SimpleNamespace(async_enable=False)),
        ), prompts_dataloader=[], eval_dataloader=None, tokenizer=qwen3_tokenizer, vllm_engines=[])
    samples = [gen._process_response_into_experience(r, max_len=4096) for r in responses]
    rows = gen.expand(samples, n_samples_per_prompt=n_rollouts, max_len=4096)
    assert len(rows) == sum(len(r[mods.agent.RESPONSE_EPISODE_KEY].steps) for r in responses)
    assert len({e.info["progpo/uid"][0] for e in rows}) == len(tasks)
    assert gen.last_stats["env/success_rate"] == pytest.approx((len(tasks) - 1) / len(tasks))
    first = rows[0]
    assert first.info["progpo/anchor_obs"] == ["Search"]
    # the chosen options (WebShop's state_extra) reach the StepBatch the estimators read
    batch = mods.experience.step_batch_from_experiences(rows)
    assert batch.state_extra is not None and batch.state_extra[0] == "Selected options: none."
    # ProGPO's product default keys its anchor states on them (state_key auto -> obs_inventory, issue 10)
    from progpo.advantages import AdvantageConfig
    from progpo.advantages._prep import prepare
    assert prepare(batch, AdvantageConfig()).cfg.state_key == "obs_inventory"
    k = 0
    for r in responses:
        ep = r[mods.agent.RESPONSE_EPISODE_KEY]
        task_text = ep.steps[0] and next(g for _, g in tasks if g["instruction_text"] in
                                         qwen3_tokenizer.decode(ep.steps[0].prompt_ids))
        buy = batch.state_extra[k + len(ep.steps) - 1]
        if ep.won and task_text["goal_options"]:
            assert all(str(v) in buy for v in task_text["goal_options"].values()), buy
        k += len(ep.steps)
    assert qwen3_tokenizer.decode(first.sequences[0][first.action_mask[0].nonzero()[0, 0] + 1:]).startswith("<think>")


def test_agent_config_and_task_errors_name_the_field(mods):
    with pytest.raises(ValueError, match="--env.pool"):
        mods.agent.AgentConfig(env={"name": "webshop", "pool": "grpc"})
    with pytest.raises(ValueError, match="--env.max_steps"):
        mods.agent.AgentConfig(env=EnvSettings(name="alfworld", max_steps=0))
    with pytest.raises(ValueError, match="--env.name"):
        mods.agent.AgentConfig.from_json('{"env": {"name": "sokoban"}}')
    with pytest.raises(ValueError, match=r"unknown fields \['colour'\]"):
        mods.agent.AgentConfig.from_json('{"env": {"name": "webshop"}, "colour": 1}')
    with pytest.raises(ValueError, match=r"unknown fields \['env.colour'\]"):
        mods.agent.AgentConfig.from_json('{"env": {"name": "webshop", "colour": 1}}')
    cfg = mods.agent.AgentConfig(env=EnvSettings(name="alfworld", pool="ray"), env_kwargs={"data_dir": "/d"})
    assert cfg.env.max_steps == 50 and cfg.env.eval_split == "valid_unseen"  # resolved from the spec
    assert mods.agent.AgentConfig.from_json(cfg.to_json()) == cfg
    with pytest.raises(ValueError, match="'index'"):
        mods.agent.parse_task('{"split": "train"}')
    with pytest.raises(ValueError, match="JSON"):
        mods.agent.parse_task("find me a red shirt")
