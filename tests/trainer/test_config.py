"""Flag parsing: dotted flags build the frozen configs; bad values name the flag."""

from __future__ import annotations

import dataclasses

import pytest

from progpo.advantages import AdvantageConfig
from progpo.trainer.config import build_parser, config_from_args


def test_defaults_and_dotted_flags():
    cfg = config_from_args(["--env.name", "alfworld", "--rollout.n_samples_per_prompt", "6", "--ds.zero_stage", "3",
                            "--actor.adam.lr", "2e-5", "--algo.kl.init_coef", "0.05", "--algo.advantage.estimator", "gigpo"])
    assert cfg.env.max_steps == 50 and cfg.env.eval_split == "valid_unseen"
    assert cfg.rollout.n_samples_per_prompt == 6
    assert cfg.ds.zero_stage == 3 and cfg.actor.adam.lr == 2e-5 and cfg.actor_config(1).use_ref
    assert (cfg.actor_config(1).ds.zero_stage, cfg.actor_config(1).actor.adam.lr) == (3, 2e-5)
    assert cfg.algo.kl.init_coef == 0.05 and cfg.update_config().kl.init_coef == 0.05
    assert cfg.progpo.estimator == "gigpo" == cfg.algo.advantage.estimator
    assert cfg.progpo.max_steps == 50  # estimator horizon follows --env.max_steps
    assert cfg.save_path == "runs/alfworld_gigpo"
    assert not config_from_args(["--algo.kl.init_coef", "0"]).actor_config(1).use_ref
    assert (cfg.update_config().kl.estimator, cfg.update_config().actor.dual_clip) == ("k3", None)  # defaults
    loss_flags = config_from_args(["--algo.kl.estimator", "k2", "--actor.dual_clip", "3"]).update_config()
    assert (loss_flags.kl.estimator, loss_flags.actor.dual_clip) == ("k2", 3.0)


def test_every_advantage_field_has_a_flag():
    flags = {a.dest for a in build_parser()._actions}
    for f in dataclasses.fields(AdvantageConfig):
        if f.name != "estimator":
            assert f"progpo.{f.name}" in flags


def test_progpo_flags_reach_the_config():
    cfg = config_from_args(["--progpo.kappa", "3", "--progpo.use_peer", "false", "--progpo.fusion", "ivw_bias",
                            "--progpo.depths", "1", "--progpo.max_steps", "9"])
    assert cfg.progpo.kappa == 3.0 and cfg.progpo.use_peer is False
    assert cfg.progpo.fusion == "ivw_bias" and cfg.progpo.depths == 1 and cfg.progpo.max_steps == 9


@pytest.mark.parametrize("argv, flag", [
    (["--rollout.batch_size", "0"], "--rollout.batch_size"),
    (["--rollout.n_samples_per_prompt", "0"], "--rollout.n_samples_per_prompt"),
    (["--rollout.temperature", "0"], "--rollout.temperature"),
    (["--rollout.top_p", "1.5"], "--rollout.top_p"),
    (["--train.batch_size", "0"], "--train.batch_size"),
    (["--train.micro_batch_size", "0"], "--train.micro_batch_size"),
    (["--train.num_iterations", "0"], "--train.num_iterations"),
    (["--actor.adam.lr", "-1"], "--actor.adam.lr"),
    (["--ds.zero_stage", "4"], "--ds.zero_stage"),
    (["--algo.kl.init_coef", "-0.1"], "--algo.kl.init_coef"),
    (["--algo.kl.estimator", "k4"], "--algo.kl.estimator"),
    (["--actor.dual_clip", "1.0"], "--actor.dual_clip"),
    (["--actor.eps_clip_low_high", "1.5", "0.2"], "--actor.eps_clip_low_high"),
    (["--env.train_split", "valid_seen"], "--env.train_split"),
    (["--env.pool", "http"], "--env.pool"),
    (["--env.max_steps", "0"], "--env.max_steps"),
    (["--env.history_length", "-1"], "--env.history_length"),
    (["--progpo.kappa", "-1"], "--progpo.kappa"),
    (["--progpo.tau", "2"], "--progpo.tau"),
    (["--progpo.zero_signal_return", "sum", "--progpo.timing_scale", "spread"],
     "--progpo.timing_scale"),  # no effect with zero_signal_return=sum
    (["--algo.advantage.estimator", "gigpo", "--progpo.zero_signal_return", "discounted", "--progpo.timing_scale",
      "spread"], "--progpo.timing_scale"),  # no effect outside ProGPO
    (["--ckpt.save_steps", "0"], "--ckpt.save_steps"),
])
def test_bad_values_name_the_flag(argv, flag, capsys):
    with pytest.raises((ValueError, SystemExit)) as err:  # a value check, or argparse's choices/type check
        config_from_args(argv)
    message = str(err.value) if err.type is not SystemExit else capsys.readouterr().err
    assert flag in message
    if err.type is SystemExit:
        assert err.value.code == 2


@pytest.mark.parametrize("abbrev", ["--train.num_iter", "--progpo.zero_signal_ret", "--progpo.timing", "--ds.mixed",
                                    "--env.max_st"])
def test_an_abbreviated_flag_is_refused(abbrev, capsys):
    """argparse took any unique prefix of a flag: a renamed flag's old name that is a prefix of another flag
    (train_ray's ``--logger.tensorboard`` of ``--logger.tensorboard_dir``) was silently read as that one."""
    from progpo.cli.sft import build_parser as sft_parser

    value = {"--progpo.zero_signal_ret": "discounted", "--progpo.timing": "unit", "--ds.mixed": "off"}.get(abbrev, "3")
    with pytest.raises(SystemExit) as err:
        config_from_args([abbrev, value])
    assert err.value.code == 2 and f"unrecognized arguments: {abbrev}" in capsys.readouterr().err
    with pytest.raises(SystemExit) as err:
        sft_parser().parse_args(["--sft.num_t", "3"])
    assert err.value.code == 2 and "unrecognized arguments: --sft.num_t" in capsys.readouterr().err


def test_bad_choice_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit):
        config_from_args(["--algo.advantage.estimator", "ppo"])
    assert "--algo.advantage.estimator" in capsys.readouterr().err


def test_cli_exit_code_and_message(capsys):
    from progpo.cli.train import main

    assert main(["--rollout.batch_size", "0"]) == 2
    assert "--rollout.batch_size" in capsys.readouterr().err


def test_a_group_of_one_is_refused_with_the_train_ray_line():
    """N = 1 gives the group estimators nothing to compare: one line naming the flag, the same line
    train_ray prints (tests/openrlhf/test_train_ray.py); ``main`` prints it as ``error: <line>``."""
    from progpo.advantages.registry import group_size_error

    line = group_size_error(1)
    assert line.startswith("--rollout.n_samples_per_prompt must be >= 2")
    with pytest.raises(ValueError) as err:
        config_from_args(["--rollout.n_samples_per_prompt", "1"])
    assert str(err.value) == line
    assert group_size_error(2) is None
    assert config_from_args(["--rollout.n_samples_per_prompt", "2"]).rollout.n_samples_per_prompt == 2


def test_preset_then_flags():
    from progpo.advantages import config_from_preset

    paper = config_from_args(["--progpo.preset", "paper", "--env.name", "alfworld"]).progpo
    assert paper == config_from_preset("paper", estimator="progpo", max_steps=50)
    assert paper.sigma2_floor_ref == "success_reward" and paper.credit_lambda == 0.0
    # a flag overrides the preset; the preset applies to any estimator (fair comparisons)
    cand = config_from_args(["--progpo.preset", "candidate", "--progpo.credit_lambda", "0.5",
                             "--algo.advantage.estimator", "gigpo"]).progpo
    assert (cand.estimator, cand.state_key, cand.zero_signal, cand.credit_lambda) == ("gigpo", "obs_inventory",
                                                                                     "task", 0.5)
    assert config_from_args(["--progpo.preset", "default"]).progpo == config_from_args([]).progpo


def test_peer_paper_presets_on_the_cli(capsys):
    from progpo.cli.train import main

    crbc = config_from_args(["--algo.advantage.estimator", "crbc", "--progpo.preset", "crbc"]).progpo
    assert (crbc.crbc_beta, crbc.omega, crbc.beta_episode, crbc.crbc_sigma_min) == (0.98, 5.0, 1.0, 0.1)
    graft = config_from_args(["--algo.advantage.estimator", "graft", "--progpo.preset", "graft_webshop"]).progpo
    assert (graft.graft_gamma, graft.graft_lambda) == (0.99, 0.8)
    pgpo = config_from_args(["--algo.advantage.estimator", "pgpo", "--progpo.preset", "pgpo"]).progpo
    assert (pgpo.gamma, pgpo.pgpo_alpha, pgpo.pgpo_beta, pgpo.pgpo_gamma) == (0.95, 2.0, 1.0, 1.0)
    # CRBC and GRAFT key anchor states on observation + state_extra (their environment key / state string),
    # PGPO on the exact observation; ProGPO's state key stays an option of the baselines (above)
    assert [config_from_args(["--algo.advantage.estimator", e]).progpo.for_batch(True).state_key
            for e in ("crbc", "graft", "pgpo")] == ["obs_inventory", "obs_inventory", "obs"]
    assert config_from_args(["--algo.advantage.estimator", "crbc", "--progpo.state_key", "obs"]).progpo.state_key == "obs"
    # a paper's preset means nothing for another estimator: one line naming the flag
    assert main(["--algo.advantage.estimator", "gigpo", "--progpo.preset", "crbc"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--progpo.preset: preset 'crbc'" in err[0] and "--algo.advantage.estimator crbc" in err[0]


def test_bad_preset_is_one_line_naming_the_flag(capsys):
    from progpo.cli.train import main

    assert main(["--progpo.preset", "papr"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--progpo.preset" in err[0] and "'paper'" in err[0]


def test_progpo_default_and_baselines_on_the_cli():
    prog = config_from_args([]).progpo
    assert (prog.estimator, prog.state_key, prog.credit_lambda, prog.zero_signal) == ("progpo", "auto", 0.8, "task")
    for est in ("gigpo", "hgpo", "grpo", "rloo", "g2po", "pgpo"):
        cfg = config_from_args(["--algo.advantage.estimator", est]).progpo
        assert cfg.zero_signal == "off" and cfg.for_batch(True).state_key == "obs"  # as published
        opt = config_from_args(["--algo.advantage.estimator", est, "--progpo.state_key", "obs_inventory",
                                "--progpo.zero_signal", "batch"]).progpo
        assert (opt.state_key, opt.zero_signal) == ("obs_inventory", "batch")  # offered as options
