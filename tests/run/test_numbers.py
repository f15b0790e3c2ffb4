"""Every number a user passes is checked as a kind: each float flag of every command takes a finite number in
the range its settings field declares (``progpo.bounds``), and a value outside it is refused in one line naming
the flag and the value, on ``train``, ``sft``, ``evaluate`` and ``train_ray`` (OpenRLHF's own flags included),
and on the lab commands, which nest the same settings.

The property test draws every float flag of each command with NaN, +-inf, negatives, huge and ordinary values,
passed as ``--flag VALUE`` (so negatives are read in the form argparse took for an unknown option), and checks
that the command refuses exactly the values outside the declared range, with that range's line.
"""

from __future__ import annotations

import contextlib
import io
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from progpo.advantages import AdvantageConfig
from progpo.bounds import ANY_FINITE, Range, number, refusal
from progpo.run import flags

NAN, INF = math.nan, math.inf


# ---- the range notation, by hand ------------------------------------------------------------------------
@pytest.mark.parametrize("text, inside, outside", [
    ("> 0", [1e-300, 1.0, 1e308], [0.0, -1.0, NAN, INF]),
    (">= 0", [0.0, -0.0, 5.0], [-1e-300, NAN, INF, -INF]),
    ("[0, 1]", [0.0, 0.5, 1.0], [-0.1, 1.0000001, NAN, INF]),
    ("[0, 1)", [0.0, 0.999], [1.0, -1.0, NAN]),
    ("(0, 1]", [1e-9, 1.0], [0.0, 1.5, NAN]),
    ("< 2", [-1e308, 1.99], [2.0, -INF, NAN]),
    ("[0, 1e6]", [1e6, 0.0], [1e6 + 1, -1.0, INF]),
])
def test_a_range_holds_the_finite_numbers_its_notation_says(text, inside, outside):
    rng = Range.parse(text)
    assert all(v in rng for v in inside), text
    assert not any(v in rng for v in outside), text
    assert NAN not in ANY_FINITE and INF not in ANY_FINITE and -1e308 in ANY_FINITE


@pytest.mark.parametrize("text", ["0 <", "> zero", "[1, 0]", "(1, 1)", "[0; 1]", ""])
def test_a_range_that_does_not_parse_or_holds_nothing_is_refused_where_it_is_declared(text):
    with pytest.raises(ValueError, match="range"):
        number(0.0, text)


def test_the_words_of_a_refusal_name_the_rule_and_the_value():
    rng = Range.parse("> 0")
    assert refusal(0.5, rng) is None and refusal(None, rng) is None
    assert refusal(-1e-05, rng) == "must be > 0, got -1e-05"
    assert refusal(INF, rng) == "must be a finite number > 0, got inf"
    assert refusal((0.9, NAN), Range.parse("[0, 1)")) == "must be a finite number in [0, 1), got 0.9 nan"
    assert refusal(NAN, ANY_FINITE) == "must be a finite number, got nan"


# ---- every float flag of every command ---------------------------------------------------------------------
def _dataclass_flags(*roots) -> list[flags.Flag]:
    return [f for cls, prefix in roots for f in flags.iter_flags(cls, prefix) if f.bounds is not None]


def _last_line(run, argv) -> str | None:
    """None when ``run(argv)`` accepts; else the refusal's line (a FlagError, or argparse's exit on stderr)."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            run(argv)
    except flags.FlagError as exc:
        return str(exc)
    except SystemExit as exc:
        assert exc.code == 2, err.getvalue()
        return next(line for line in err.getvalue().splitlines() if ": error: " in line)
    return None


@pytest.fixture(scope="module")
def commands(tmp_path_factory):
    """command -> (its float flags: (option, nargs, declared range, inf allowed), argv -> refusal line or None,
    the prefix of its refusal line)."""
    from progpo.cli import evaluate, sft, train_ray
    from progpo.trainer import config

    out = {}
    for name, parse, root in (
        ("train", config.config_from_args, config.TrainConfig),
        ("sft", sft.parse, sft.SFTArgs),
        ("evaluate", lambda argv: flags.build(evaluate.EvaluateArgs, evaluate.build_parser().parse_args(
            ["--actor.model_name_or_path", "tiny", *argv])), evaluate.EvaluateArgs),
    ):
        found = _dataclass_flags((root, ()), *([(AdvantageConfig, ("progpo",))] if name == "train" else []))
        shape = [(f.option, len(f.default) if isinstance(f.default, tuple) else None, f.bounds, False) for f in found]
        out[name] = (shape, lambda argv, parse=parse: _last_line(parse, argv), "")
    parser = train_ray.build_parser()
    declared = train_ray.declared_ranges()
    base = ["--env.name", "alfworld", "--env.num_tasks", "4", "--rollout.n_samples_per_prompt", "2",
            "--ckpt.path", str(tmp_path_factory.mktemp("ray") / "ckpt")]
    shape = []
    for action in parser._actions:  # noqa: SLF001 - every float flag, OpenRLHF's own and ours
        if action.type is float and action.help != "==SUPPRESS==":
            option = action.option_strings[0]
            defaults = action.default if isinstance(action.default, (list, tuple)) else [action.default]
            no_limit = option not in declared and any(isinstance(d, float) and math.isinf(d) for d in defaults)
            shape.append((option, action.nargs if isinstance(action.nargs, int) else None,
                          declared.get(option, ANY_FINITE), no_limit))
    assert {"--actor.adam.lr", "--algo.kl.init_coef", "--actor.max_norm", "--vllm.gpu_memory_utilization",
            "--progpo.gamma", "--env.max_failed_frac"} <= {s[0] for s in shape}
    ray = (lambda argv: _last_line(lambda a: train_ray.finalize(parser, parser.parse_args(base + a)), argv))
    out["train_ray"] = (shape, ray, "python -m progpo.cli.train_ray: error: argument ")
    return out


VALUES = st.one_of(
    st.sampled_from([NAN, INF, -INF, 0.0, -0.0, 1.0, -1e-5, 1e6, 1e308]),
    st.floats(max_value=-1e-12, allow_nan=False, allow_infinity=False),  # negatives
    st.floats(min_value=1e3, allow_nan=False, allow_infinity=False),  # huge
    st.floats(allow_nan=False, allow_infinity=False, width=32),
)


@pytest.mark.parametrize("command", ["train", "sft", "evaluate", "train_ray"])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_float_flag_refuses_exactly_the_values_outside_its_declared_range(commands, command, data):
    shape, run, lead = commands[command]
    option, nargs, rng, no_limit = data.draw(st.sampled_from(shape), label="flag")
    value = data.draw(VALUES, label="value")
    text = repr(value)
    line = run([option, *([text] * (nargs or 1))])  # the --flag -1e-5 form: a value, never an arity error
    shown = " ".join([str(float(text))] * (nargs or 1))
    refused_words = f"{lead}{option} {rng.rule(value)}, got {shown}"
    if value in rng or (no_limit and math.isinf(value)):
        assert line != refused_words, line  # refused only by another rule (a composite one), never by its range
    else:
        assert line == refused_words


@pytest.mark.parametrize("argv, says", [
    # the issue's values: train took inf in both learning rates and NaN or inf in these
    (["--actor.adam.lr", "inf"], "--actor.adam.lr must be a finite number > 0, got inf"),
    (["--sft.lr", "inf"], "--sft.lr must be a finite number > 0, got inf"),
    (["--algo.kl.init_coef", "nan"], "--algo.kl.init_coef must be a finite number >= 0, got nan"),
    (["--actor.max_norm", "inf"], "--actor.max_norm must be a finite number >= 0, got inf"),
    (["--actor.entropy_coef", "nan"], "--actor.entropy_coef must be a finite number >= 0, got nan"),
    (["--actor.adam.weight_decay", "inf"], "--actor.adam.weight_decay must be a finite number >= 0, got inf"),
    (["--actor.adam.lr", "-1e-5"], "--actor.adam.lr must be > 0, got -1e-05"),  # was "expected one argument"
    (["--rollout.batch_size", "-3"], "--rollout.batch_size must be >= 1, got -3"),
    (["--progpo.gamma", "-inf"], "--progpo.gamma must be a finite number in [0, 1], got -inf"),
])
def test_train_refuses_the_issue_s_values_in_one_line_naming_flag_and_value(argv, says):
    from progpo.cli import train

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert train.main(argv) == 2
    assert err.getvalue() == f"error: {says}\n"


@pytest.mark.parametrize("flag", ["--actor.adam.lr", "--algo.kl.init_coef", "--actor.max_norm"])
def test_train_ray_refuses_nan_in_openrlhf_s_own_flags(commands, flag):
    shape, run, lead = commands["train_ray"]
    rule = dict((s[0], s[2]) for s in shape)[flag].rule(NAN)
    assert run([flag, "nan"]) == f"{lead}{flag} {rule}, got nan"


def test_an_infinite_default_keeps_inf_but_never_nan(commands):
    """OpenRLHF's ``--ckpt.max_mem`` defaults to inf (no limit): inf stays a value of it, NaN is refused."""
    _, run, lead = commands["train_ray"]
    assert run(["--ckpt.max_mem", "inf"]) is None
    assert run(["--ckpt.max_mem", "nan"]) == f"{lead}--ckpt.max_mem must be a finite number, got nan"


def test_a_lab_command_s_settings_are_held_to_the_trainer_s_ranges(capsys):
    """A lab command nests the trainer's settings, so the generator checks them as on ``train``: one line naming
    the flag and the value, nothing run."""
    from research import learning_probe

    assert learning_probe.main(["--progpo.beta_episode", "nan"]) == 2
    assert "--progpo.beta_episode must be a finite number in [0, 1e6], got nan" in capsys.readouterr().err
    assert learning_probe.main(["--lr", "-1e-5"]) == 2  # a value, not an arity error
    assert "--lr must be > 0, got -1e-05" in capsys.readouterr().err


def test_a_setting_built_in_code_is_held_to_the_same_range():
    from progpo.trainer.settings import AdamSettings, KLSettings

    with pytest.raises(ValueError, match=r"^--actor\.adam\.lr must be a finite number > 0, got inf$"):
        AdamSettings(lr=INF)
    with pytest.raises(ValueError, match=r"^--algo\.kl\.init_coef must be a finite number >= 0, got nan$"):
        KLSettings(init_coef=NAN)
    with pytest.raises(ValueError, match=r"^AdvantageConfig\.kappa must be > 0, got 0\.0$"):
        AdvantageConfig(kappa=0.0)
