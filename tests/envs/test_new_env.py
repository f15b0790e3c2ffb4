"""Adding an environment takes two files: its module and one ``register(...)`` call.

A throw-away env (a counter: say ``up`` until the count reaches the task's target) is written into a
temporary module that holds the env class, its prompt template, its action-syntax check and its
``register`` call, and nothing else of the package is touched. It then passes the conformance
checker, plays an episode through the episode loop, trains one iteration through ``train`` and is
evaluated through ``evaluate``.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import sys
import textwrap

import pytest

from progpo.envs.conformance import check_env_conformance
from progpo.run.settings import EnvSettings, RolloutSettings

MODULE = textwrap.dedent('''
    """A counter: reach the task's target by saying ``up``; ``stop`` gives up."""

    from progpo.envs.base import StepResult, normalize_action, split_size
    from progpo.envs.spec import PromptTemplate, register

    TEMPLATE = PromptTemplate(
        env_name="counter",
        with_history="Task: {task}\\nAfter {step_count} steps (last {history_length}):\\n{history}\\n"
                     "Step {current_step}: {observation}\\nActions: {actions}",
        no_history="Task: {task}\\n{observation}\\nActions: {actions}",
        history_turn="{step}. {observation} -> {action}", history_separator="\\n",
        action_item="{action}", action_separator=", ")


    def syntax_ok(action: str) -> bool:
        return action in ("up", "stop")


    class CounterEnv:
        SIZES = {"train": 6, "test": 3}

        def __init__(self, max_steps: int = 4) -> None:
            self.max_steps, self.count, self.target, self.t, self.index = max_steps, 0, 1, 0, 0

        def num_tasks(self, split: str) -> int:
            return split_size(self.SIZES, split, "counter")

        def _info(self, invalid: bool = False) -> dict:
            return {"task": f"count to {self.target}", "task_id": f"counter/{self.index}",
                    "anchor_observation": f"count {self.count}", "admissible_actions": ["up", "stop"],
                    "won": self.count >= self.target, "invalid_action": invalid}

        def reset(self, *, split: str, index: int | None = None, seed: int | None = None):
            n = self.num_tasks(split)
            self.index = index if index is not None else (seed or 0) % n
            if not 0 <= self.index < n:
                raise ValueError(f"index {self.index} out of range for {split}")
            self.count, self.target, self.t = 0, 1 + self.index % 2, 0
            return f"count {self.count}", self._info()

        def step(self, action: str) -> StepResult:
            action, self.t = normalize_action(action), self.t + 1
            invalid = action not in ("up", "stop")
            self.count += action == "up"
            won = self.count >= self.target
            info = self._info(invalid)
            return StepResult(f"count {self.count}", float(won), won or action == "stop",
                              self.t >= self.max_steps and not won, info)

        def close(self) -> None:
            pass


    register(id="counter", entry_point=f"{__name__}:CounterEnv", max_steps=4, splits=("train", "test"),
             eval_split="test", template=f"{__name__}:TEMPLATE", syntax=f"{__name__}:syntax_ok")
''')


@pytest.fixture
def counter(tmp_path, monkeypatch):
    """The throw-away env, registered from its one module (unregistered afterwards)."""
    (tmp_path / "counter_env.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("counter_env")
    yield module
    importlib.import_module("progpo.envs.spec")._REGISTRY.pop("counter", None)  # noqa: SLF001 - its own entry
    sys.modules.pop("counter_env", None)


def test_the_new_env_is_known_everywhere_from_its_register_call(counter):
    assert EnvSettings(name="counter").resolved().max_steps == 4  # --env.name accepts it; the spec's limits
    env = counter.CounterEnv()
    check_env_conformance(env, split="train", index=1)
    assert env.num_tasks("test") == 3
    with pytest.raises(ValueError, match="counter"):
        env.num_tasks("valid")
    with pytest.raises(ValueError, match="--env.pool http: counter is not served over HTTP"):
        EnvSettings(name="counter", pool="http")


def test_an_episode_runs_on_it(counter):
    from transformers import AutoTokenizer

    from progpo.agents.episode import EpisodeConfig, run_episodes
    from progpo.agents.types import Generation, SamplingParams
    from progpo.envs.local_pool import LocalEnvPool
    from progpo.run.tiny_model import tiny_model_path

    tok = AutoTokenizer.from_pretrained(str(tiny_model_path()))
    text = "<think>go</think><action>up</action>"
    answer = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]

    async def generate(prompt_ids, sampling):
        return Generation(token_ids=list(answer), logprobs=[0.0] * len(answer), text=text, finish_reason="stop")

    cfg = EpisodeConfig(env=EnvSettings(name="counter", max_steps=4), rollout=RolloutSettings(),
                        sampling=SamplingParams(max_new_tokens=16))
    (episode,) = asyncio.run(run_episodes([("train", 1)], cfg, env_pool=LocalEnvPool(counter.CounterEnv, max_envs=1),
                                          generate=generate, tokenizer=tok))
    assert episode.won and [s.action for s in episode.steps] == ["up", "up"]
    assert not any(s.format_invalid or s.invalid for s in episode.steps)


def test_train_and_evaluate_run_on_it(counter, tmp_path, capsys):
    from progpo.cli import evaluate, train

    run = tmp_path / "run"
    assert train.main(["--env.name", "counter", "--actor.model_name_or_path", "tiny", "--ckpt.path", str(run),
                       "--rollout.batch_size", "2", "--rollout.n_samples_per_prompt", "2", "--train.num_iterations",
                       "1", "--rollout.max_new_tokens", "8", "--logger.progress_bar", "false",
                       "--logger.tensorboard_dir", "none"]) == 0
    (row,) = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]  # the one iteration
    assert row["rollout/num_episodes"] == 4 and row["rollout/num_steps"] >= 4  # 2 tasks x 2 rollouts, >= 1 step each
    assert row["env/failed_frac"] == 0
    capsys.readouterr()
    assert evaluate.main(["--env.name", "counter", "--actor.model_name_or_path", str(run), "--eval.num_tasks", "2",
                          "--rollout.max_new_tokens", "8"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["split"] == "test" and result["tasks_in_split"] == 3 and result["episodes"] == 2
