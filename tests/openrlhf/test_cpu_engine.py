"""The CPU engine (``progpo.openrlhf.cpu.engine.CPURolloutActor``) in this process, without Ray.

Its methods are called as OpenRLHF calls them on a ``RolloutRayActor``: ``generate`` from the agent
executor, ``init_process_group`` / ``update_weight`` from ``ActorPPOTrainer.broadcast_to_vllm``
(rank 0 of the sync group runs in a thread here), ``sleep`` / ``wake_up`` from the trainer.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from types import SimpleNamespace

import pytest
import torch

from progpo.agents.types import SamplingParams


@pytest.fixture(scope="module")
def mods(cpu_compat):
    with cpu_compat.import_shims():
        from progpo.openrlhf import agent
        from progpo.openrlhf.cpu import engine as cpu_engine

        return SimpleNamespace(engine=cpu_engine, agent=agent, VllmParams=cpu_compat.SamplingParams,
                               Group=cpu_compat.StatelessGlooGroup)


@pytest.fixture(scope="module")
def model_path():
    from progpo.run.tiny_model import tiny_model_path

    return str(tiny_model_path())


async def _engine(mods, model_path, **kwargs):
    cls = mods.engine.CPURolloutActor.__ray_actor_class__
    eng = cls.__new__(cls)
    await eng.__init__(model_path, seed=3, dtype="fp32", **kwargs)
    return eng


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sampling_fields_it_cannot_honour_are_refused(mods):
    mods.engine.check_neutral(mods.VllmParams(top_k=-1, min_tokens=0))
    for field, value in (("top_k", 20), ("repetition_penalty", 1.1), ("min_tokens", 1), ("ignore_eos", True)):
        with pytest.raises(ValueError, match=field):
            mods.engine.check_neutral(mods.VllmParams(**{field: value}))


def test_generate_returns_a_vllm_shaped_output(mods, model_path):
    async def main():
        eng = await _engine(mods, model_path, max_model_len=64)
        prompt = [10, 11, 12, 13]
        out = await eng.generate(prompt, mods.VllmParams(temperature=1.0, max_tokens=5, logprobs=1))
        comp = out.outputs[0]
        assert out.prompt_token_ids == prompt and 1 <= len(comp.token_ids) <= 5
        assert [list(d) for d in comp.logprobs] == [[t] for t in comp.token_ids]
        assert all(d[t].logprob <= 0 for d, t in zip(comp.logprobs, comp.token_ids))
        ends_eos = comp.token_ids[-1] in eng.generator.eos_ids
        assert comp.finish_reason == ("stop" if ends_eos else "length")
        assert len(comp.token_ids) == 5 or ends_eos
        # no max_tokens: vLLM's default budget, the room left in max_model_len
        short = await _engine(mods, model_path, max_model_len=len(prompt) + 3)
        out = await short.generate(prompt, mods.VllmParams(max_tokens=None, logprobs=None))
        assert len(out.outputs[0].token_ids) <= 3 and out.outputs[0].logprobs is None
        assert eng.get_num_unfinished_requests() == 0
        with pytest.raises(ValueError, match="text-only"):
            await eng.generate(prompt, mods.VllmParams(), multi_modal_data={"image": 1})

    asyncio.run(main())


def test_sleep_protocol_is_checked(mods, model_path):
    async def main():
        eng = await _engine(mods, model_path)
        params = mods.VllmParams(max_tokens=2)
        await eng.sleep()
        with pytest.raises(RuntimeError, match="asleep"):
            await eng.generate([1, 2], params)
        await eng.wake_up(tags=["weights"])  # what broadcast_to_vllm does before a sync
        with pytest.raises(RuntimeError, match="asleep"):
            await eng.generate([1, 2], params)
        await eng.wake_up()  # before generation, as OpenRLHF's samples generator does
        assert len((await eng.generate([1, 2], params)).outputs[0].token_ids) <= 2
        with pytest.raises(ValueError, match="unknown wake_up tags"):
            await eng.wake_up(tags=["kv"])

    asyncio.run(main())


def test_update_weight_receives_the_broadcast_parameter(mods, model_path):
    """OpenRLHF's sync order: init_process_group on every engine, then per parameter update_weight + broadcast."""
    port = _free_port()

    async def main():
        eng = await _engine(mods, model_path)
        name = "model.layers.0.mlp.up_proj.weight"
        param = dict(eng.model.named_parameters())[name]
        new = torch.randn_like(param)
        sender: dict = {}

        def rank0() -> None:
            group = mods.Group("127.0.0.1", port, 0, 2, timeout_s=60)
            sender["group"] = group
            group.broadcast(new.clone(), src=0, stream=None)

        t = threading.Thread(target=rank0)
        t.start()
        await eng.init_process_group("127.0.0.1", port, 1, 2, "openrlhf", backend="gloo", use_ray=False)
        await eng.update_weight(name, dtype=param.dtype, shape=param.shape)
        t.join(timeout=60)
        assert torch.equal(dict(eng.model.named_parameters())[name], new)
        assert eng.weight_updates == 1
        state = {n: p.detach().clone() for n, p in eng.model.named_parameters()}
        assert eng.progpo_weight_diff(state) == 0
        state[name] = new + 0.5
        assert eng.progpo_weight_diff(state) == pytest.approx(0.5)
        with pytest.raises(KeyError, match="no parameter"):
            await eng.update_weight("model.nope", dtype=param.dtype, shape=param.shape)
        with pytest.raises(ValueError, match="engine holds"):
            await eng.update_weight(name, dtype=torch.bfloat16, shape=param.shape)
        with pytest.raises(ValueError, match="gloo"):
            await eng.init_process_group("127.0.0.1", port, 1, 2, "openrlhf", backend="nccl", use_ray=False)

    asyncio.run(main())


def test_agent_generate_carries_the_finish_reason(mods):
    """The executor's ``GenerateFn`` over an engine: vLLM's finish_reason lands in ``Generation``."""

    class Engine:
        def __init__(self, reason):
            self.reason = reason

        async def generate(self, prompt_ids, params):
            lp = [{7: SimpleNamespace(logprob=-0.5)}, {8: SimpleNamespace(logprob=-0.25)}]
            out = SimpleNamespace(token_ids=[7, 8], text="ab", logprobs=lp, finish_reason=self.reason)
            return SimpleNamespace(outputs=[out])

    sampling = SamplingParams(max_new_tokens=2)
    for reason in ("stop", "length"):
        gen = asyncio.run(mods.agent.EngineGenerate(Engine(reason), mods.VllmParams())([1], sampling))
        assert (gen.finish_reason, gen.logprobs) == (reason, [-0.5, -0.25])
    with pytest.raises(mods.agent.EngineError, match="abort") as exc:
        asyncio.run(mods.agent.EngineGenerate(Engine("abort"), mods.VllmParams())([1], sampling))
    assert exc.value.kind == "engine_abort"  # fails that episode only (tests/openrlhf/test_failures.py)
