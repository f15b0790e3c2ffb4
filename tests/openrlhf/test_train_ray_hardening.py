"""``python -m progpo.cli.train_ray`` values that used to be taken silently (and fail later, on the
cluster, per episode) exit 2 naming the flag."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest


@pytest.fixture(scope="module")
def cli(cpu_compat):
    with cpu_compat.import_shims():
        from progpo.cli import train_ray
        from progpo.openrlhf import launch

        train_ray.build_parser()
        return SimpleNamespace(train_ray=train_ray, launch=launch)


BASE = ["--actor.model_name_or_path", "/models/qwen", "--env.name", "webshop", "--env.url", "http://10.0.0.1:3000",
        "--env.num_tasks", "16", "--rollout.n_samples_per_prompt", "8", "--rollout.batch_size", "16"]


def _finalize(cli, argv, tmp_path):
    parser = cli.train_ray.build_parser()
    return cli.train_ray.finalize(parser, parser.parse_args(argv + ["--ckpt.path", str(tmp_path / "ckpt")]))


@pytest.mark.parametrize("argv, flag", [
    (["--env.max_steps", "0"], "--env.max_steps"),                 # was replaced by the default 15
    (["--env.invalid_penalty", "inf"], "--env.invalid_penalty"),   # -inf rewards reach the estimator
    (["--env.num_cpus_per_actor", "inf"], "--env.num_cpus_per_actor"),
    (["--env.train_split", "nope"], "--env.train_split"),                      # every episode would fail on reset
    (["--env.train_split", "valid_seen"], "--env.train_split"),                # an ALFWorld split for WebShop
    (["--env.name", "alfworld", "--env.train_split", "test"], "--env.train_split"),
    (["--env.eval_split", "nope", "--eval.num_tasks", "2"], "--env.eval_split"),
    (["--env.url", "http://a b"], "--env.url"),
])
def test_values_that_would_fail_later_exit_now(cli, capsys, tmp_path, argv, flag):
    with pytest.raises(SystemExit) as exc:
        _finalize(cli, BASE + argv, tmp_path)
    assert exc.value.code == 2
    assert flag in capsys.readouterr().err


def test_good_splits_still_pass(cli, tmp_path):
    args = _finalize(cli, BASE + ["--env.train_split", "train", "--env.eval_split", "test", "--eval.num_tasks", "2"],
                     tmp_path)
    assert Path(args.__dict__["eval.dataset"]).is_file()
    args = _finalize(cli, BASE + ["--env.name", "alfworld", "--env.train_split", "valid_unseen"], tmp_path)
    assert '"valid_unseen"' in Path(args.__dict__["data.prompt_dataset"]).read_text().replace('\\"', '"')


def test_task_list_is_never_left_half_written(cli, tmp_path):
    """An error while writing (here: an index json cannot encode) keeps the previous list intact."""
    path = tmp_path / "tasks" / "train.jsonl"
    cli.launch.write_tasks(path, "train", range(3))
    before = path.read_text()

    def indices():
        yield from range(10)
        yield object()  # json.dumps fails on the 11th row

    with pytest.raises(TypeError):
        cli.launch.write_tasks(path, "train", indices())
    assert path.read_text() == before
    assert sorted(p.name for p in path.parent.iterdir()) == ["train.jsonl"]


@pytest.mark.parametrize("argv, says", [
    (["--vllm.num_engines", "-1"], "--vllm.num_engines: must be >= 1"),   # was taken (only 0 refused)
    (["--actor.num_nodes", "0"], "--actor.num_nodes: must be >= 1, got 0"),
    (["--actor.num_gpus_per_node", "-1"], "--actor.num_gpus_per_node: must be >= 1, got -1"),
    (["--debug.dump_dir", "{file}"], "--debug.dump_dir {file} is a file, not a folder"),  # failed in the workers
    (["--debug.dump_dir", "{file}/sub"], "--debug.dump_dir {file}/sub: {file} is a file, not a folder"),
    (["--env.task_dir", "{file}"], "--env.task_dir {file} is a file, not a folder"),  # was a traceback
    (["--ckpt.path", "{file}"], "--ckpt.path {file}/progpo_tasks: {file} is a file, not a folder"),
])
def test_cpu_values_refused_before_ray_starts(cli, capsys, tmp_path, argv, says):
    blocker = tmp_path / "notes.txt"
    blocker.write_text("keep me")
    argv = [a.replace("{file}", str(blocker)) for a in argv]
    parser = cli.train_ray.build_parser()
    with pytest.raises(SystemExit) as exc:  # --ckpt.path given last wins over the default below
        cli.train_ray.finalize(parser, parser.parse_args(
            ["--rollout.backend", "hf", "--cpu.engine", "hf", "--vllm.num_engines", "1", *BASE, "--ckpt.path",
             str(tmp_path / "ckpt"), *argv]))  # the stand-in: BASE's model is no folder, which vllm's head check names first
    assert exc.value.code == 2
    assert f"argument {says.replace('{file}', str(blocker))}" in capsys.readouterr().err
    assert blocker.read_text() == "keep me"


@pytest.mark.parametrize("model, says, fix", [
    ("uncased_model", "the answer '<think>", "tokenizer.add_tokens"),
    # issue 44: a turn end in plain text leaves the stop set no token to stop an answer at
    ("plain_turn_end_model", "the chat template ends an assistant turn with '###'", "tokenizer.add_special_tokens"),
])
def test_a_tokenizer_that_breaks_the_answer_format_exits_before_ray(cli, capsys, tmp_path, monkeypatch, request, model,
                                                                    says, fix):
    """The start-up check of both backends (``progpo.run.answer_format``, tests/run/test_answer_format.py) runs
    in ``train_ray`` before Ray starts: exit 2, one line naming the flag, the model and what to change."""
    from progpo.openrlhf import cpu

    def never(*_args):
        raise AssertionError("Ray started with a tokenizer that breaks the answer format")

    folder = request.getfixturevalue(model)
    monkeypatch.setattr(cpu, "install", lambda: None)  # its torch changes are for Ray workers
    monkeypatch.setattr(cli.launch, "init_ray", never)
    argv = ["--rollout.backend", "hf", "--actor.model_name_or_path", str(folder), "--env.name", "alfworld_like",
            "--env.num_tasks", "2", "--rollout.batch_size", "2", "--rollout.n_samples_per_prompt", "4",
            "--rollout.micro_batch_size", "4", "--train.batch_size", "8", "--train.micro_batch_size", "2",
            "--actor.num_gpus_per_node", "1", "--ref.num_gpus_per_node", "1", "--vllm.num_engines", "1",
            "--cpu.engine", "hf", "--ckpt.path", str(tmp_path / "ckpt")]  # hf: these head_dim-16 models vllm refuses first
    with pytest.raises(SystemExit) as exc:
        cli.train_ray.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2
    assert err[0].startswith(f"python -m progpo.cli.train_ray: error: argument --actor.model_name_or_path "
                             f"{folder}: {says}")
    assert fix in err[0] and err[1].startswith("  hint: ")
