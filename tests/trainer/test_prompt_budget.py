"""A step prompt budget that does not fit the sequence limit with the answer is refused at start-up.

The rule (``progpo.run.settings.check_prompt_budget``) holds on both backends: ``--rollout.max_prompt_tokens``
+ ``--rollout.max_new_tokens`` <= the limit. On ``train_ray`` the limit is ``--data.max_len``
(``tests/scripts/test_launch_scripts.py`` runs the scripts' command lines through it); on the local backend,
which has no ``--data.max_len``, it is the policy's context (``max_position_embeddings``), checked before
any env starts.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from progpo.run.flags import FlagError
from progpo.run.settings import check_prompt_budget


@settings(max_examples=300, deadline=None)
@given(prompt=st.one_of(st.none(), st.integers(1, 10_000)), new=st.integers(1, 10_000), limit=st.integers(2, 10_000))
def test_a_budget_is_taken_exactly_when_prompt_and_answer_fit(prompt, new, limit):
    fits = new < limit and (prompt is None or prompt + new <= limit)
    try:
        check_prompt_budget(prompt, new, limit, f"--data.max_len {limit}")
    except FlagError as exc:
        assert not fits
        text = str(exc)
        assert "\n" not in text and "--rollout.max_new_tokens" in text and f"--data.max_len {limit}" in text
        if new < limit:  # the prompt budget is the one too large: both flags, their sum and the limit
            assert exc.flag == "--rollout.max_prompt_tokens"
            assert text.startswith(f"--rollout.max_prompt_tokens {prompt} + --rollout.max_new_tokens {new} = "
                                   f"{prompt + new} tokens do not fit --data.max_len {limit}: ")
            assert f"at most {limit - new}" in text
        else:
            assert exc.flag == "--rollout.max_new_tokens"
    else:
        assert fits


def test_the_issues_values_are_refused_and_the_largest_budget_that_fits_is_taken():
    with pytest.raises(FlagError, match=r"3000 \+ --rollout\.max_new_tokens 512 = 3512 tokens do not fit "
                                        r"--data\.max_len 2560: lower --rollout\.max_prompt_tokens to at most 2048"):
        check_prompt_budget(3000, 512, 2560, "--data.max_len 2560")
    check_prompt_budget(2048, 512, 2560, "--data.max_len 2560")
    check_prompt_budget(None, 512, 2560, "--data.max_len 2560")


@pytest.fixture(scope="module")
def model_2560(tmp_path_factory):
    """A tiny random Qwen2 whose context is 2560 tokens, the OpenRLHF scripts' --data.max_len."""
    from progpo.run.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("m") / "ctx2560", max_positions=2560)


@pytest.mark.parametrize("budget, fits", [(("3000", "512"), False), (("2049", "512"), False), (("2048", "512"), True),
                                          (("1", "2560"), False)])
def test_the_local_backend_refuses_a_budget_over_the_models_context_before_any_env_starts(model_2560, tmp_path,
                                                                                           monkeypatch, budget, fits):
    from progpo.trainer import loop
    from progpo.trainer.config import config_from_args

    cfg = config_from_args(["--actor.model_name_or_path", str(model_2560), "--ckpt.path", str(tmp_path / "run"),
                            "--rollout.max_prompt_tokens", budget[0], "--rollout.max_new_tokens", budget[1]])
    started = []
    monkeypatch.setattr(loop, "open_env_pool", lambda *a, **k: started.append(a) or pytest.fail("env pool opened"))
    if fits:
        loop.check_model_context(cfg)
        return
    with pytest.raises(FlagError) as exc:
        loop.Trainer(cfg).fit()
    assert started == []
    text = str(exc.value)
    assert "--rollout.max_new_tokens" in text and f"the 2560-token context of --actor.model_name_or_path {model_2560}" \
        in text
    if budget[1] != "2560":
        assert text.startswith(f"--rollout.max_prompt_tokens {budget[0]} + --rollout.max_new_tokens {budget[1]} = ")


def test_the_train_cli_says_it_in_one_line_and_exits_2(model_2560, tmp_path, capsys):
    from progpo.cli.train import main

    code = main(["--actor.model_name_or_path", str(model_2560), "--ckpt.path", str(tmp_path / "run"),
                 "--rollout.max_prompt_tokens", "3000", "--rollout.max_new_tokens", "512"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert err[0].startswith("error: --rollout.max_prompt_tokens 3000 + --rollout.max_new_tokens 512 = 3512 tokens "
                             f"do not fit the 2560-token context of --actor.model_name_or_path {model_2560}")
