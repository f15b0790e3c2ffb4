"""A batch where more than half of the answers hit the token limit says so in one warning line, naming the likely
cause, on both backends (issue 44, item 4).

Before, the only sign of answers that never stopped was ``cut=1.00`` in the metrics line.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from progpo.agents.batching import cut_answer_warning
from progpo.agents.types import Episode, StepRecord

FINISHED = "<think>a mug</think><action>take mug 1</action>"
MID_ANSWER = "<think>the mug is on the desk and I"


def _episode(traj: int, answers: list[tuple[str, str]], *, failed: bool = False, limit: int = 16) -> Episode:
    """One trajectory whose steps answered ``(text, finish_reason)``; a cut answer has ``limit`` tokens."""
    ep = Episode(uid="u", traj_id=traj, split="train", task_index=0, failed=failed)
    for t, (text, reason) in enumerate(answers):
        n = limit if reason == "length" else 3
        ep.steps.append(StepRecord(prompt_ids=[1, t], response_ids=[7] * n, logprobs=[-0.5] * n, response_text=text,
                                   action="x", invalid=False, env_reward=0.0, reward=0.0, terminated=False,
                                   truncated=False, anchor_obs="o", prefix_key=f"{traj}:{t}", finish_reason=reason))
    return ep


def test_half_cut_or_less_says_nothing():
    eps = [_episode(0, [(FINISHED, "length"), (FINISHED, "stop")]), _episode(1, [(MID_ANSWER, "length"),
                                                                               (FINISHED, "stop")])]
    assert cut_answer_warning(eps) is None  # 2 of 4: not more than half
    assert cut_answer_warning([]) is None


def test_finished_answers_that_went_on_point_at_the_stop_tokens():
    eps = [_episode(0, [(FINISHED + "<|im_start|>user", "length"), (FINISHED, "length")]),
           _episode(1, [(MID_ANSWER, "length"), (FINISHED, "stop")])]
    line = cut_answer_warning(eps)
    assert line.startswith("3 of 4 answers (75%) hit the token limit (--rollout.max_new_tokens 16); 2 of them closed "
                           "their <action> block and went on")
    assert "stop token" in line and "chat template" in line and "\n" not in line


def test_answers_cut_mid_answer_point_at_the_limit():
    eps = [_episode(0, [(MID_ANSWER, "length"), (MID_ANSWER.upper(), "length")], limit=8),
           _episode(1, [(FINISHED, "length"), (FINISHED, "stop")], limit=8)]
    line = cut_answer_warning(eps)
    assert line == ("3 of 4 answers (75%) hit the token limit (--rollout.max_new_tokens 8); 2 of them stopped "
                    "mid-answer (no </action>), so --rollout.max_new_tokens 8 is likely too small for the answers: "
                    "raise it")


def test_failed_episodes_are_not_counted():
    eps = [_episode(0, [(FINISHED, "stop"), (FINISHED, "stop")]),
           _episode(1, [(FINISHED, "length")] * 3, failed=True)]
    assert cut_answer_warning(eps) is None  # as rollout/truncated_response_frac: 0 of 2


def _cut_batch() -> list[Episode]:
    return [_episode(k, [(FINISHED + " and more", "length")]) for k in range(4)]


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "token limit" in r.getMessage()]


def test_the_local_loop_logs_one_line_per_batch(tmp_path, caplog):
    from progpo.trainer.config import config_from_args
    from progpo.trainer.loop import TaskSampler, Trainer

    cfg = config_from_args(["--actor.model_name_or_path", "tiny", "--ckpt.path", str(tmp_path), "--env.url",
                            "http://127.0.0.1:9", "--rollout.batch_size", "2", "--rollout.n_samples_per_prompt", "2"])
    trainer = Trainer(cfg)
    trainer.generator = SimpleNamespace(stats={"seconds": 0.0, "tokens": 0}, set_seed=lambda seed: None)
    trainer.sampler = TaskSampler(num_tasks=10, seed=0)
    trainer._play = lambda tasks, sampling, start, loop: _cut_batch()
    with caplog.at_level(logging.WARNING):
        roll = trainer.rollout(1, loop=None)
    assert roll.metrics["rollout/truncated_response_frac"] == 1.0
    assert _warnings(caplog) == ["iteration 1: " + cut_answer_warning(_cut_batch())]


def test_the_openrlhf_path_logs_one_line_per_batch(caplog):
    from progpo.openrlhf import cpu as cpu_compat

    with cpu_compat.import_shims():
        from progpo.openrlhf import agent, samples

    args = SimpleNamespace(
        rollout=SimpleNamespace(batch_size=2, n_samples_per_prompt=2, vllm_generate_batch_size=None, micro_batch_size=1),
        algo=SimpleNamespace(dynamic_filtering_enable=False, advantage=SimpleNamespace(
            estimator="progpo", is_correction_level="off"), kl=SimpleNamespace(init_coef=0.0)),
        train=SimpleNamespace(batch_size=1, micro_batch_size=1, async_enable=False),
        actor=SimpleNamespace(num_nodes=1, num_gpus_per_node=1), ref=SimpleNamespace(num_nodes=1, num_gpus_per_node=1),
        ds=SimpleNamespace(ring_attn_size=1, tensor_parallel_size=1), vllm=SimpleNamespace(enable_sleep=False))
    gen = samples.StepSamplesGenerator(strategy=SimpleNamespace(args=args), prompts_dataloader=[],
                                       eval_dataloader=None, tokenizer=SimpleNamespace(eos_token_id=99, pad_token_id=0),
                                       vllm_engines=[])
    prompt = '{"split": "train", "index": 0}'
    responses = [agent.transcript_response(ep, prompt=prompt, label="train:0", with_logprobs=None) for ep in _cut_batch()]
    experiences = [gen._process_response_into_experience(r, max_len=64) for r in responses]
    with caplog.at_level(logging.WARNING):
        gen.expand(experiences, n_samples_per_prompt=2, max_len=64)
    assert gen.last_stats["rollout/truncated_response_frac"] == pytest.approx(1.0)
    assert _warnings(caplog) == ["rollout batch 1: " + cut_answer_warning(_cut_batch())]
