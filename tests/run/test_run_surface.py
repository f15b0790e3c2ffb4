"""One run surface: every CLI builds its flags from the same settings dataclasses, env and estimator names
come from their registries, a setting has the same flag on ``train`` and ``train_ray``, and the
dataclasses are the only source of defaults."""

from __future__ import annotations

import argparse
import ast
import dataclasses
from pathlib import Path

import numpy as np
import pytest

from progpo.advantages import ESTIMATORS, AdvantageConfig, Estimator, StepBatch
from progpo.envs import env_ids, spec
from progpo.paths import REPO_ROOT
from progpo.run import flags
from progpo.run.settings import EnvSettings, RolloutSettings


def _choices(parser: argparse.ArgumentParser, option: str) -> list:
    return list(next(a for a in parser._actions if option in a.option_strings).choices)  # noqa: SLF001


@pytest.fixture(scope="module")
def parsers(cpu_compat_module):
    from progpo.cli import evaluate, sft
    from progpo.trainer import config

    with cpu_compat_module.import_shims():
        from progpo.cli import train_ray

        ray = train_ray.build_parser()
    return {"train": config.build_parser(), "sft": sft.build_parser(), "evaluate": evaluate.build_parser(),
            "train_ray": ray}


@pytest.fixture(scope="module")
def cpu_compat_module():
    from progpo.openrlhf import cpu

    return cpu


def test_every_cli_offers_exactly_the_registered_envs(parsers):
    for name, parser in parsers.items():
        assert sorted(_choices(parser, "--env.name")) == sorted(env_ids()), name


def test_estimator_names_are_written_once(parsers):
    names = [e.value for e in Estimator]
    assert set(ESTIMATORS) == set(Estimator) and len(names) == len(set(names))
    assert list(AdvantageConfig.choices("estimator")) == names
    assert sorted(_choices(parsers["train"], "--algo.advantage.estimator")) == sorted(names)
    ray = _choices(parsers["train_ray"], "--algo.advantage.estimator")
    assert ray[: len(names)] == names  # ours first, then OpenRLHF's own critic-free estimators
    assert "gae" not in ray and "rloo" not in ray[len(names):]
    from progpo.openrlhf import experience, samples

    for module in (samples, experience):  # both backends route on the registry itself, not a copy of it
        assert "OUR_ESTIMATORS" not in vars(module)


def test_no_module_lists_env_or_estimator_names_by_hand():
    """Outside the registries, no tuple or list of two or more env ids / estimator names appears in the product
    package's code (the lab, whose synthetic families are not envs, lives outside it in ``research/``)."""
    envs, ests = set(env_ids()), {e.value for e in Estimator}
    offenders = []
    for path in (REPO_ROOT / "progpo").rglob("*.py"):
        if path.name == "config.py" and path.parent.name == "advantages":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                values = {e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
                if len(values & envs) >= 2 or len(values & ests) >= 2:
                    offenders.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno}")
    assert not offenders, offenders


def _visible(parser: argparse.ArgumentParser) -> set[str]:
    """Flags shown in --help (deprecated old names are hidden)."""
    return {o for a in parser._actions if a.help is not argparse.SUPPRESS for o in a.option_strings}  # noqa: SLF001


def test_shared_settings_have_the_same_flags_on_both_backends(parsers):
    train = _visible(parsers["train"])
    ray = _visible(parsers["train_ray"])
    env_train = {o for o in train if o.startswith("--env.")}
    env_ray = {o for o in ray if o.startswith("--env.")}
    assert env_train - env_ray == set(), env_train - env_ray
    # train_ray-only: where the task list for OpenRLHF's dataset is written, and its wrap-around
    assert env_ray - env_train == {"--env.split_size", "--env.task_dir"}
    for flag in ("--rollout.batch_size", "--rollout.n_samples_per_prompt", "--rollout.temperature", "--rollout.top_p",
                 "--rollout.max_new_tokens", "--rollout.max_prompt_tokens", "--actor.model_name_or_path",
                 "--actor.adam.lr", "--actor.adam.betas", "--actor.adam.weight_decay", "--actor.max_norm",
                 "--actor.eps_clip_low_high", "--actor.dual_clip", "--actor.entropy_coef",
                 "--actor.gradient_checkpointing_enable", "--ds.zero_stage", "--ds.param_dtype",
                 "--algo.kl.init_coef", "--algo.kl.estimator", "--train.batch_size", "--train.micro_batch_size",
                 "--train.max_epochs", "--train.seed", "--ckpt.path", "--ckpt.load_enable", "--ckpt.save_steps",
                 "--ckpt.max_num", "--algo.advantage.estimator", "--progpo.preset", "--progpo.kappa"):
        assert flag in train and flag in ray, flag
    assert {o for o in train if o.startswith("--progpo.")} == {o for o in ray if o.startswith("--progpo.")}


def test_the_dataclass_is_the_only_source_of_defaults(parsers):
    from progpo.trainer.config import TrainConfig, config_from_args

    for parser in parsers.values():
        ours = [a for a in parser._actions if a.dest.startswith(("env.", "progpo.", "cpu.", "debug.", "logger.",  # noqa: SLF001
                                                                  "sft.", "eval."))]
        assert all(a.default is argparse.SUPPRESS for a in ours if a.option_strings[0] not in
                   ("--eval.dataset", "--eval.split", "--eval.temperature", "--eval.n_samples_per_prompt",
                    "--eval.steps", "--logger.logging_steps", "--logger.tensorboard_dir")
                   and not a.option_strings[0].startswith("--logger.wandb")), parser.prog
    built = config_from_args([])
    default = TrainConfig()
    for section in ("rollout", "actor", "ds", "algo", "train", "ckpt", "logger"):
        assert getattr(built, section) == getattr(default, section), section
    assert built.env == default.env.resolved(pool="local")


def test_settings_arrive_as_attributes():
    from progpo.trainer.config import config_from_args

    cfg = config_from_args(["--env.url", "http://h:3000", "--env.invalid_penalty", "0.3", "--ds.param_dtype", "bf16",
                            "--train.seed", "5", "--actor.model_name_or_path", "tiny", "--ckpt.path", "runs/x",
                            "--algo.advantage.estimator", "gigpo"])
    assert (cfg.env.url, cfg.env.invalid_penalty, cfg.ds.param_dtype, cfg.train.seed) == ("http://h:3000", 0.3,
                                                                                          "bf16", 5)
    assert (cfg.actor.model_name_or_path, cfg.save_path) == ("tiny", "runs/x")
    assert cfg.algo.advantage.estimator == "gigpo" == cfg.progpo.estimator


#: former names the product CLIs took before the project's first release: none parses any more.
FORMER_NAMES = {
    "train": ["--advantage_estimator", "--pretrain", "--save_path", "--seed", "--resume", "--env.webshop_url",
              "--rollout.invalid_penalty", "--algo.eps_clip_low_high", "--algo.entropy.coef",
              "--ds.gradient_checkpointing", "--ds.bf16", "--log.tensorboard", "--logger.tensorboard",
              "--log.progress_bar", "--warm_start.num_tasks", "--warm_start.epochs", "--warm_start.lr",
              "--warm_start.batch_size", "--warm_start.keep_failed", "--warm_start.cache_dir"],
    "sft": ["--pretrain", "--save_path", "--seed", "--env.webshop_url", "--ds.gradient_checkpointing", "--ds.bf16",
            "--log.progress_bar", "--actor.adam.lr", "--train.max_epochs", "--train.batch_size"],
    "evaluate": ["--model", "--seed", "--env.webshop_url"],
    "train_ray": ["--advantage_estimator", "--env.split", "--env.max_prompt_tokens", "--env.num_eval_tasks",
                  "--device", "--cpu.engine_batch_size", "--train.num_episodes"],
}


@pytest.mark.parametrize("cli, old", [(cli, old) for cli, names in FORMER_NAMES.items() for old in names])
def test_former_names_are_refused(parsers, cli, old, capsys):
    parser = parsers[cli]
    assert old not in flags.option_strings(parser)
    required = ["--actor.model_name_or_path", "m"] if cli == "evaluate" else []
    with pytest.raises(SystemExit) as exc:
        parser.parse_args([*required, old, "1"])
    assert exc.value.code == 2 and f"unrecognized arguments: {old}" in capsys.readouterr().err


def test_help_text_sits_beside_each_field():
    assert "context guard" in flags.field_help(RolloutSettings)["max_prompt_tokens"]
    assert flags.field_help(EnvSettings)["history_length"].startswith("K, earlier")
    assert "peer reliability" in flags.field_help(AdvantageConfig)["kappa"]  # a class-docstring field list works too
    for cls in (EnvSettings, RolloutSettings):
        assert set(flags.field_help(cls)) == {f.name for f in dataclasses.fields(cls)}, cls


def test_flag_errors_name_the_flag():
    with pytest.raises(flags.FlagError) as err:
        flags.build(EnvSettings, {"env.max_steps": 0}, prefix=("env",))
    assert err.value.flag == "--env.max_steps"
    with pytest.raises(flags.FlagError) as err:
        flags.build(EnvSettings, {"env.name": "sokoban"}, prefix=("env",))
    assert err.value.flag == "--env.name"


def test_env_spec_resolves_what_the_settings_leave_open():
    for name in env_ids():
        s = spec(name)
        env = EnvSettings(name=name).resolved()
        assert (env.max_steps, env.train_split, env.eval_split, env.pool) == (s.max_steps, s.splits[0], s.eval_split,
                                                                               s.pool)
        for field in ("entry_point", "template", "syntax"):
            assert s.load(field) is not None, (name, field)


def test_step_batch_rows_are_field_generic():
    from benchmarks.synthetic_batches import random_batch

    batch = random_batch(3)
    again = StepBatch.from_rows(batch.to_rows())
    for name in StepBatch.columns():
        a, b = getattr(batch, name), getattr(again, name)
        assert (a is None and b is None) or np.array_equal(a, b), name

    @dataclasses.dataclass(frozen=True)
    class WithTool(StepBatch):
        tool: np.ndarray | None = dataclasses.field(default=None, metadata={"kind": "str"})

    rows = [dict(r, tool=f"t{k % 2}") for k, r in enumerate(batch.to_rows())]
    extended = WithTool.from_rows(rows)  # a new column is one field: every loop carries it
    assert extended.tool.tolist() == [f"t{k % 2}" for k in range(batch.num_steps)]
    assert WithTool.from_rows(extended.to_rows()).tool.tolist() == extended.tool.tolist()
    with pytest.raises(ValueError, match="no columns"):
        StepBatch.from_lists(**{n: getattr(batch, n) for n in StepBatch.columns()}, tool=["x"] * batch.num_steps)


def test_local_and_openrlhf_rows_come_from_the_same_functions():
    src = {p: (REPO_ROOT / p).read_text() for p in ("progpo/agents/batching.py", "progpo/openrlhf/samples.py",
                                                    "progpo/openrlhf/experience.py", "tests/support/progpo_tests/reference.py")}
    for path, text in src.items():
        assert "anchor_obs=" not in text and '"progpo/anchor_obs"' not in text, path  # no hand-listed columns
    assert "StepBatch.from_rows" in src["progpo/agents/batching.py"]
    assert "StepBatch.from_rows" in src["progpo/openrlhf/experience.py"]
    assert "to_rows()" in src["progpo/openrlhf/samples.py"] and "to_rows()" in src["tests/support/progpo_tests/reference.py"]


def test_generated_flag_tables_in_the_docs_are_current():
    from progpo.cli import docs

    assert docs.stale() == [], "run: python -m progpo.cli.docs --write"
