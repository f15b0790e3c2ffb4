"""Behaviour cloning: the loss (hand-computed, response tokens only), sample filtering, and with the
tiny model on real WebShop expert steps: the loss falls, and the checkpoint starts ``train``."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import numpy as np
import pytest
import torch

from progpo.agents.types import Episode, StepRecord
from progpo.run.settings import EnvSettings, RolloutSettings, TrainSettings
from progpo.trainer.actor import pack_samples
from progpo.trainer.config import SFTSettings
from progpo.trainer.settings import ActorSettings, AdamSettings
from progpo.trainer.sft import expert_samples, sft_token_loss

SFT_PROTOCOL = ["--env.max_steps", "8", "--env.history_length", "2", "--rollout.max_prompt_tokens", "384",
                "--rollout.max_new_tokens", "160"]


def test_loss_is_the_token_mean_nll_of_response_tokens_only():
    batch = pack_samples([([5, 6, 7], [8, 9]), ([5], [6, 7, 8])], pad_id=0)  # L = 5, second row padded
    lp = torch.tensor([[-9.0, -9.0, -9.0, -1.0, -2.0],
                       [-9.0, -0.5, -0.25, -4.0, -9.0]], requires_grad=True)
    num_tokens = 5.0  # 2 + 3 response tokens
    loss = sft_token_loss(lp, batch["action_mask"], num_tokens)
    assert float(loss.detach()) == pytest.approx((1.0 + 2.0 + 0.5 + 0.25 + 4.0) / 5.0)
    loss.backward()
    expected = torch.tensor([[0, 0, 0, 1, 1], [0, 1, 1, 1, 0]], dtype=torch.float32) * (-1.0 / num_tokens)
    assert torch.equal(lp.grad, expected)  # prompt tokens and padding get no gradient at all
    with pytest.raises(ValueError, match="num_tokens"):
        sft_token_loss(lp, batch["action_mask"], 0)


def _ep(won: bool, failed: bool = False, invalid_at: int | None = None) -> Episode:
    ep = Episode(uid="u", traj_id=0, split="train", task_index=0, won=won, failed=failed)
    for t in range(3):
        ep.steps.append(StepRecord(prompt_ids=[1, t], response_ids=[2, t] if t != 1 else [], logprobs=[0.0],
                                   response_text="", action="a", invalid=False, env_reward=0.0, reward=0.0,
                                   terminated=False, truncated=False, anchor_obs="o", prefix_key="k",
                                   format_invalid=t == invalid_at))
    return ep


def test_expert_samples_keep_won_well_formed_steps():
    eps = [_ep(True), _ep(False), _ep(True, failed=True), _ep(True, invalid_at=2)]
    assert expert_samples(eps) == [([1, 0], [2, 0]), ([1, 2], [2, 2]), ([1, 0], [2, 0])]
    assert len(expert_samples(eps, keep_failed=True)) == 5
    with pytest.raises(ValueError, match="--sft.max_epochs"):
        SFTSettings(max_epochs=0)


@pytest.fixture(scope="module")
def expert_steps(tiny_model, webshop_url, shared_data):
    """Expert episodes of 3 train tasks on the real WebShop server, prompts built by the tiny tokenizer."""
    from transformers import AutoTokenizer

    from progpo.agents.episode import TaskSpec
    from progpo.agents.experts import WebShopExpert, expert_episodes, webshop_goals
    from progpo.envs.webshop import WebShopEnv
    from progpo.envs.local_pool import LocalEnvPool

    tok = AutoTokenizer.from_pretrained(tiny_model)
    goals = webshop_goals(webshop_url)
    pool = LocalEnvPool(lambda: WebShopEnv(webshop_url, max_steps=8), max_envs=3)

    async def go():
        try:
            return await expert_episodes([TaskSpec("train", i) for i in range(3)], env_pool=pool, tokenizer=tok,
                                         env=EnvSettings(name="webshop", max_steps=8),
                                         rollout=RolloutSettings(max_prompt_tokens=384, max_new_tokens=160),
                                         make_expert=lambda: WebShopExpert(goals))
        finally:
            await pool.close()

    return asyncio.run(go())


def test_webshop_expert_wins_and_its_steps_follow_the_rl_protocol(expert_steps, tiny_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    assert sum(ep.won for ep in expert_steps) >= 2
    ep = next(ep for ep in expert_steps if ep.won)
    assert ep.steps[0].action.startswith("search[") and ep.steps[1].action.startswith("click[b")
    assert ep.steps[-1].action == "click[buy now]" and ep.info["score"] == 1.0
    assert all(len(s.prompt_ids) <= 384 for s in ep.steps)  # the context guard of the RL loop
    assert ep.steps[0].response_ids[-1] == tok.eos_token_id  # the answer ends like a sampled one
    assert tok.decode(ep.steps[0].prompt_ids).endswith("<|im_start|>assistant\n")


def test_sft_lowers_the_loss_on_expert_steps(expert_steps, tiny_model):
    from progpo.trainer.actor import Actor, ActorConfig
    from progpo.trainer.sft import mean_nll, sft_epoch

    samples = expert_samples(expert_steps)[:12]
    actor = Actor(ActorConfig(actor=ActorSettings(model_name_or_path=str(tiny_model), adam=AdamSettings(lr=3e-3)),
                              train=TrainSettings(micro_batch_size=4), use_ref=False))
    before = mean_nll(actor, samples)
    rng = np.random.default_rng(0)
    history = [sft_epoch(actor, samples, 6, rng)["loss/sft_nll"] for _ in range(4)]
    after = mean_nll(actor, samples)
    assert after < before - 1.0, (before, history, after)
    assert history[-1] < history[0]


def test_sft_cli_checkpoint_starts_train(tmp_path, webshop_url, capsys):
    from progpo.cli import sft
    from progpo.trainer.config import config_from_args
    from progpo.trainer.loop import Trainer
    from progpo.run.models import resolve_pretrain

    out = tmp_path / "sft"
    rc = sft.main(["--actor.model_name_or_path", "tiny", "--ckpt.path", str(out), "--env.url", webshop_url, *SFT_PROTOCOL,
                   "--sft.num_tasks", "2", "--sft.max_epochs", "1", "--sft.batch_size", "4",
                   "--sft.lr", "1e-3", "--logger.progress_bar", "false"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "expert: won" in text and f"--actor.model_name_or_path {out}" in text
    summary = json.loads((out / "sft_summary.json").read_text())
    assert summary["samples"] > 0 and summary["expert_success"]["n"] == 2 and len(summary["epochs"]) == 1
    hf = resolve_pretrain(str(out))
    assert hf.endswith("iter_000001/hf")
    # a second run refuses to overwrite
    assert sft.main(["--actor.model_name_or_path", "tiny", "--ckpt.path", str(out), "--env.url", webshop_url]) == 2

    cfg = config_from_args(["--actor.model_name_or_path", str(out), "--ckpt.path", str(tmp_path / "rl"), "--env.url", webshop_url,
                            "--rollout.batch_size", "1", "--rollout.n_samples_per_prompt", "2", "--env.max_steps", "2",
                            "--rollout.max_new_tokens", "8", "--rollout.max_prompt_tokens", "384",
                            "--train.num_iterations", "1", "--logger.progress_bar", "false", "--logger.tensorboard_dir", "none"])
    trainer = Trainer(cfg)
    from transformers import AutoModelForCausalLM

    start = AutoModelForCausalLM.from_pretrained(hf).state_dict()
    trainer._build = (lambda build: lambda envs: (build(envs), _same(trainer, start))[0])(trainer._build)
    assert [m["iteration"] for m in trainer.fit()] == [1]

    # the same run cut short before its summary (e.g. killed after the last epoch's checkpoint):
    # its checkpoint is complete, but train/evaluate --actor.model_name_or_path must not take it as a finished SFT
    (out / "sft_summary.json").rename(tmp_path / "summary.json")
    with pytest.raises(ValueError, match=r"did not finish \(stopped after epoch 1 of 1.*iter_000001/hf"):
        resolve_pretrain(str(out))
    assert resolve_pretrain(hf) == hf  # the escape hatch the message names


def _same(trainer, state):
    live = trainer.actor.model.state_dict()
    for name, tensor in state.items():
        assert torch.equal(tensor, live[name]), name


@pytest.mark.parametrize("flag, value", [("--sft.num_tasks", "0"), ("--sft.max_epochs", "0"),
                                         ("--sft.lr", "-1"), ("--rollout.max_prompt_tokens", "0")])
def test_sft_cli_bad_values_name_the_flag(tmp_path, capsys, flag, value):
    from progpo.cli import sft

    assert sft.main(["--actor.model_name_or_path", "tiny", "--ckpt.path", str(tmp_path / "x"), flag, value]) == 2
    assert flag.lstrip("-") in capsys.readouterr().err
    assert not (tmp_path / "x").exists()  # nothing written


@pytest.mark.parametrize("where", ["file", "under_a_file"])
def test_sft_cli_save_path_on_a_file_fails_before_any_work(tmp_path, capsys, where):
    from progpo.cli import sft

    blocker = tmp_path / "notes.txt"
    blocker.write_text("keep me")
    save = blocker if where == "file" else blocker / "run"
    assert sft.main(["--actor.model_name_or_path", "tiny", "--ckpt.path", str(save), "--sft.num_tasks", "1",
                     "--logger.progress_bar", "false"]) == 2
    captured = capsys.readouterr()
    assert "--ckpt.path" in captured.err and str(save) in captured.err
    assert "expert: won" not in captured.out  # refused before the model and the expert episodes
    assert blocker.read_text() == "keep me"


def test_sft_cli_refuses_a_save_path_with_an_earlier_runs_records(tmp_path, capsys):
    """An sft stopped between its first metrics record and its first checkpoint left metrics.jsonl;
    a rerun appended to it (epoch 1 twice)."""
    from progpo.cli import sft

    save = tmp_path / "sft"
    save.mkdir()
    (save / "metrics.jsonl").write_text('{"iteration": 1, "loss/sft_nll": 2.0}\n')
    assert sft.main(["--actor.model_name_or_path", "tiny", "--ckpt.path", str(save), "--sft.num_tasks", "1", "--sft.max_epochs", "1",
                     "--logger.progress_bar", "false"]) == 2
    captured = capsys.readouterr()
    assert f"--ckpt.path {save} holds metrics.jsonl of an earlier run" in captured.err
    assert "expert: won" not in captured.out
    assert (save / "metrics.jsonl").read_text() == '{"iteration": 1, "loss/sft_nll": 2.0}\n'


def test_sft_collect_draws_only_the_task_range_each_task_once_per_pass(tiny_model):
    """``--env.task_offset 5 --env.num_tasks 3``: 7 expert episodes cover tasks 5, 6, 7 (each once in
    every pass of 3, as ``train`` draws them), none outside the range."""
    from transformers import AutoTokenizer

    from progpo.cli import sft
    from progpo.run.env_setup import open_env_pool
    from progpo.trainer.warm_start import collect

    args = sft.parse(["--env.name", "alfworld_like", "--env.max_steps", "12", "--env.task_offset", "5",
                      "--env.num_tasks", "3", "--actor.model_name_or_path", "tiny"])
    env = args.env.resolved(pool="local")
    with open_env_pool(env, max_envs=8) as handle:
        rollout = dataclasses.replace(args.rollout, max_prompt_tokens=2048, max_new_tokens=48)
        episodes, total = collect(env, rollout, AutoTokenizer.from_pretrained(tiny_model), handle, num_tasks=7, seed=0,
                                  progress=False)
    ids = [ep.task_index for ep in episodes]
    assert total == 1_000_000 and len(ids) == 7
    assert sorted(ids[:3]) == sorted(ids[3:6]) == [5, 6, 7] and ids[6] in (5, 6, 7)
    assert all(ep.won for ep in episodes)
