"""A generator holding its own weight copy (``--rollout.backend vllm``'s engine) samples from the actor's weights
from the first rollout on, not only after the first update: the engine starts from ``--actor.model_name_or_path``,
while after an adapter warm start (``--sft.lora``) or a resumed checkpoint the actor already differs from it, and an
iteration whose update is skipped (no signal) would never sync it (the main job with ``--sft.lora`` on the engine
sampled the base model for all its iterations: answer format 0 % valid, every group flat).

A recording generator (the transformers generator underneath, plus ``load_weights``) stands in for the engine:
tiny model, adapter warm start on the shared WebShop server, then a resume (seconds)."""

from __future__ import annotations

import torch

from .test_warm_start_lora import LORA, PROTOCOL, WARM


class RecordingEngine:
    """``make_generator``'s generator with an engine's ``load_weights``: records the loaded state, and at each
    generate call whether the last loaded state equals the actor's merged weights at that moment."""

    def __init__(self, rollout, actor, *, seed: int = 0) -> None:
        from progpo.run.generation import HFGenerator

        self.inner = HFGenerator(actor.model, actor.tokenizer, max_batch_size=rollout.gen_batch_size, seed=seed,
                                 precision=actor.precision)
        self.actor, self.stats, self.loaded, self.events = actor, self.inner.stats, None, []

    def set_seed(self, seed: int) -> None:
        self.inner.set_seed(seed)

    def load_weights(self, named_tensors) -> None:
        self.loaded = {n: t.detach().clone() for n, t in named_tensors}
        if not self.events:
            self.first_loaded = self.loaded
        self.events.append("load")

    def _current(self) -> dict[str, torch.Tensor]:
        from progpo.run.lora import iter_merged

        with self.actor.generation_context():
            return dict(iter_merged(self.actor.model, parameters_only=True))

    async def __call__(self, prompt_ids, sampling):
        if not self.events or self.events[-1] == "load":  # the first request after a load: is it the actor's?
            current = self._current()
            same = self.loaded is not None and self.loaded.keys() == current.keys() and all(
                torch.equal(self.loaded[n], current[n]) for n in current)
            self.events.append("generate from the actor" if same else "generate from other weights")
        return await self.inner(prompt_ids, sampling)


def test_the_engine_gets_the_warm_started_adapter_and_the_resumed_weights_before_it_samples(
        tmp_path, webshop_url, monkeypatch):
    from progpo.trainer import rollout_backend
    from progpo.trainer.config import config_from_args
    from progpo.trainer.loop import Trainer

    engines: list[RecordingEngine] = []

    def make(rollout, actor, *, seed=0):
        engines.append(RecordingEngine(rollout, actor, seed=seed))
        return engines[-1]

    monkeypatch.setattr(rollout_backend, "make_generator", make)
    common = [*PROTOCOL, *WARM, *LORA, "--env.url", webshop_url, "--sft.cache_dir", str(tmp_path / "cache"),
              "--ckpt.path", str(tmp_path / "run")]
    first = Trainer(config_from_args([*common, "--train.num_iterations", "1"]))
    first.fit()
    # the engine started on the base model; the actor is the base + the cloned adapter: loaded before sampling
    assert engines[0].events[:2] == ["load", "generate from the actor"], engines[0].events[:3]
    # and what it got is the clone, not the base (a merge that dropped the adapter would pass the check above)
    from transformers import AutoModelForCausalLM

    from progpo.run.models import resolve_pretrain

    base = dict(AutoModelForCausalLM.from_pretrained(resolve_pretrain("tiny")).named_parameters())
    assert any(not torch.equal(t, base[n]) for n, t in engines[0].first_loaded.items())
    assert engines[0].events[-1] == "load"  # after iteration 1's update: the weights its checkpoint holds
    resumed = Trainer(config_from_args([*common, "--train.num_iterations", "2", "--ckpt.load_enable"]))
    resumed.fit()
    assert [m["iteration"] for m in resumed.history] == [2]
    assert engines[1].events[:2] == ["load", "generate from the actor"], engines[1].events[:3]
    # the resumed engine started from the checkpoint's weights (iteration 1's update), not the clone's
    clone, after_1, resumed_start = engines[0].first_loaded, engines[0].loaded, engines[1].first_loaded
    assert all(torch.equal(after_1[n], resumed_start[n]) for n in after_1)
    assert any(not torch.equal(clone[n], resumed_start[n]) for n in clone)
