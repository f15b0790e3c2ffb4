"""``bench clone``: per-decision agreement of a policy with the expert along the expert's trajectory."""

from __future__ import annotations

import pytest

from progpo.envs import make_env
from research import clone_probe
from progpo.run.agent_model import AgentModelConfig, agent_model_path

SMALL = AgentModelConfig(corpus_tasks=4)


@pytest.fixture(scope="module")
def agent_dir(tmp_path_factory):
    return agent_model_path(SMALL, models_dir=tmp_path_factory.mktemp("models"))


def test_webshop_like_names_its_decisions():
    env = make_env("webshop_like")
    env.reset(split="test", index=3)
    task = env.task("test", 3)
    title = task.items[0].title
    assert task.decision_kind(("search",), "search[x]") == "search"
    assert task.decision_kind(("results", 0, 0, 1), f"click[{title}]") == "results: item"
    assert task.decision_kind(("results", 0, 0, 1), "click[next >]") == "results: page"
    assert task.decision_kind(("results", 0, 0, 1), "click[back to search]") == "results: back"
    assert task.decision_kind(("item", 0, -1, -1), f"click[{task.color}]") == "item: option"
    assert task.decision_kind(("item", 0, 0, 0), "click[buy now]") == "item: buy"
    # a family without its own kinds falls back to the action's verb
    assert clone_probe.decision_kind(object(), None, "go to shelf 2") == "go"


def test_the_expert_trajectory_visits_every_webshop_decision_once_per_task(agent_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(agent_dir)
    steps = clone_probe.expert_steps("webshop_like", tok, split="test", tasks=4, history=1, max_steps=8)
    kinds = [s.kind for s in steps]
    assert kinds.count("search") == kinds.count("item: buy") == 4  # one search and one purchase per task
    assert all(s.action in s.admissible and s.prompt_ids for s in steps)


def test_the_table_counts_expert_and_admissible_answers():
    steps = [clone_probe.ProbeStep("a", "go to x", ["go to x", "go to y"], [1]),
             clone_probe.ProbeStep("a", "go to x", ["go to x", "go to y"], [1]),
             clone_probe.ProbeStep("b", "take z", ["take z"], [1])]
    table = clone_probe.table(steps, ["Go to X", "go to y", "take w"])
    assert "| a | 2 | 0.50 [0.09, 0.91] | 1.00 [0.34, 1.00] |" in table  # normalised match; Wilson intervals
    assert "| b | 1 | 0.00 [0.00, 0.79] | 0.00 [0.00, 0.79] |" in table
    assert "| all | 3 | 0.33" in table


def test_the_probe_runs_on_an_untrained_policy(agent_dir, capsys):
    assert clone_probe.main(["--env.name", "alfworld_like", "--actor.model_name_or_path", str(agent_dir),
                             "--eval.num_tasks", "2"]) == 0
    out = capsys.readouterr().out
    assert "| all |" in out and "| go |" in out


M = "--actor.model_name_or_path"


@pytest.mark.parametrize("argv, flag", [
    (["--env.name", "webshop", M, "tiny-agent"], "--env.name"), ([M, "tiny-agent", "--eval.num_tasks", "0"], "--eval.num_tasks"),
    ([M, "tiny-agent", "--rollout.temperature", "0"], "--rollout.temperature"), ([M, "/nonexistent"], M),
    ([M, "tiny-agent", "--env.eval_split", "valid"], "--env.eval_split"),
    ([M, "tiny-agent", "--eval.num_tasks", "10000000"], "--eval.num_tasks"),
])
def test_bad_input_is_named(argv, flag, capsys):
    assert clone_probe.main(argv) == 2
    assert flag in capsys.readouterr().err


def test_the_trainer_s_flags_fill_the_probe_s_settings():
    """Each setting is the trainer's own (its flag, type and checks), read back under the probe's names."""
    args = clone_probe.parse_args(["--env.name", "alfworld_like", "--actor.model_name_or_path", "tiny-agent",
                                   "--eval.num_tasks", "3", "--env.history_length", "2", "--env.max_steps", "5",
                                   "--rollout.temperature", "0.5", "--rollout.max_new_tokens", "9", "--eval.seed", "4",
                                   "--env.eval_split", "train"])
    assert (args.env, args.model, args.tasks, args.history, args.max_steps, args.temperature, args.max_new_tokens,
            args.seed, args.split) == ("alfworld_like", "tiny-agent", 3, 2, 5, 0.5, 9, 4, "train")
    assert isinstance(args.settings, clone_probe.CloneArgs)
