"""LoRA on the local backend (``--ds.lora.*``, peft): only the adapter trains, the reference is the base
model with the adapter disabled (no second copy), checkpoints hold the adapter and a merged Hugging Face
folder that ``train`` and ``evaluate`` take, and a resumed run gets its adapter back.

Tiny random model, 2 iterations of 4 tasks x 4 rollouts on the shared WebShop server (seconds)."""

from __future__ import annotations

import json

import pytest
import torch

from progpo.trainer.settings import ActorSettings, DeepSpeedSettings, LoraSettings

LORA = ["--ds.lora.rank", "4", "--ds.lora.alpha", "8", "--progpo.zero_signal", "off"]


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory, webshop_url, train_run):
    return train_run(tmp_path_factory.mktemp("lora") / "run", *LORA, "--env.url", webshop_url)


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_only_the_adapter_trains_and_the_reference_is_the_base_model(tiny_model):
    from transformers import AutoModelForCausalLM

    from progpo.trainer.actor import Actor, ActorConfig

    actor = Actor(ActorConfig(actor=ActorSettings(model_name_or_path=str(tiny_model)),  # fp32 logits compared
                              ds=DeepSpeedSettings(mixed_precision="off", lora=LoraSettings(rank=4, alpha=8))))
    assert actor.ref is None and actor.has_reference  # no second copy of the weights
    trainable = [n for n, p in actor.model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert {id(p) for g in actor.optimizer.param_groups for p in g["params"]} == {
        id(p) for p in actor.model.parameters() if p.requires_grad}
    with torch.no_grad():  # move the policy away from the base model
        for name, p in actor.model.named_parameters():
            if ".lora_B." in name:
                p.add_(0.05)
    pairs = [([1, 2, 3, 4], [5, 6]), ([7, 8, 9], [10, 11, 12])]
    base = AutoModelForCausalLM.from_pretrained(tiny_model).eval()
    ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
    ref = actor.logprobs(pairs, reference=True)
    policy = actor.logprobs(pairs)
    expected = [torch.log_softmax(_logits(base, torch.tensor([p + r])), -1)[0, len(p) - 1:-1].gather(
        -1, torch.tensor(r)[:, None])[:, 0] for p, r in pairs]
    for got, want, pol in zip(ref, expected, policy):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
        assert (pol - got).abs().max() > 1e-3  # the adapter is on outside the reference
    assert (_logits(actor.model, ids) - _logits(base, ids)).abs().max() > 1e-3  # and it is back on afterwards


def test_checkpoint_holds_the_adapter_and_a_merged_folder(lora_run, tiny_model):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    ckpt = lora_run.ckpt.latest()
    assert (ckpt / "adapter" / "adapter_config.json").is_file() and (ckpt / "hf" / "config.json").is_file()
    assert lora_run.history[-1]["loss/optimizer_steps"] >= 1
    ids = torch.tensor([[5, 17, 250, 9, 1000, 3]])
    live = _logits(lora_run.actor.model, ids)
    merged = AutoModelForCausalLM.from_pretrained(ckpt / "hf")
    torch.testing.assert_close(_logits(merged, ids), live, rtol=0, atol=1e-5)
    base = AutoModelForCausalLM.from_pretrained(tiny_model)
    assert (_logits(base, ids) - live).abs().max() > 1e-4  # the adapter learned something
    adapter = PeftModel.from_pretrained(base, ckpt / "adapter")
    torch.testing.assert_close(_logits(adapter, ids), live, rtol=0, atol=1e-5)
    assert "base_model" not in json.dumps(json.loads((ckpt / "hf" / "config.json").read_text()))


def test_train_and_evaluate_take_the_merged_folder(lora_run, webshop_url, tmp_path):
    from transformers import AutoModelForCausalLM

    from progpo.cli.evaluate import main as evaluate
    from progpo.run.models import resolve_pretrain
    from progpo.trainer.config import config_from_args
    from progpo.trainer.loop import Trainer

    folder = resolve_pretrain(str(lora_run.save_path))
    assert folder.endswith("/hf")
    out = tmp_path / "eval.json"
    assert evaluate(["--actor.model_name_or_path", str(lora_run.save_path), "--env.url", webshop_url,
                     "--eval.num_tasks", "2", "--env.max_steps", "2", "--rollout.max_new_tokens", "8",
                     "--out", str(out)]) == 0
    assert json.loads(out.read_text())["model"] == folder
    cfg = config_from_args(["--actor.model_name_or_path", str(lora_run.save_path), "--ckpt.path", str(tmp_path / "rl"),
                            "--env.url", webshop_url, "--logger.progress_bar", "false"])
    trainer = Trainer(cfg)
    from progpo.run.env_setup import open_env_pool

    with open_env_pool(cfg.env, 1) as envs:
        trainer._build(envs)
    merged = AutoModelForCausalLM.from_pretrained(folder).state_dict()
    for name, tensor in trainer.actor.model.state_dict().items():
        assert torch.equal(tensor, merged[name]), name


def test_resume_restores_the_adapter(lora_run, webshop_url):
    from progpo.run.env_setup import open_env_pool
    from progpo.trainer.config import config_from_args
    from progpo.trainer.loop import Trainer

    from .conftest import E2E_FLAGS

    cfg = config_from_args([*E2E_FLAGS, "--ckpt.path", str(lora_run.save_path), *LORA, "--env.url", webshop_url,
                            "--ckpt.load_enable"])
    resumed = Trainer(cfg)
    with open_env_pool(cfg.env, 1) as envs:
        assert resumed._build(envs) == 2
    done = dict(lora_run.actor.model.named_parameters())
    for name, p in resumed.actor.model.named_parameters():
        assert torch.equal(p, done[name]), name
    assert not resumed.policy_is_reference


def test_bad_lora_values_name_the_flag():
    from progpo.trainer.config import config_from_args

    for argv, flag in ((["--ds.lora.rank", "-1"], "--ds.lora.rank"), (["--ds.lora.alpha", "0"], "--ds.lora.alpha"),
                       (["--ds.lora.dropout", "1.0"], "--ds.lora.dropout")):
        with pytest.raises(ValueError, match=f"^{flag}"):
            config_from_args(argv)
    assert config_from_args(["--ds.lora.target_modules", "q_proj", "v_proj"]).ds.lora.target_modules == (
        "q_proj", "v_proj")


def test_merged_weights_equal_peft_merge_and_unload(tiny_model):
    """Our merge (no in-place change of the live weights) equals peft's own merge_and_unload."""
    import copy

    from transformers import AutoModelForCausalLM

    from progpo.run.lora import add_lora, iter_merged, merged_state_dict

    model = add_lora(AutoModelForCausalLM.from_pretrained(tiny_model), rank=4, alpha=8,
                     target_modules=("q_proj", "down_proj"), dropout=0.0, seed=3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.normal_(0, 0.1)
    before = {n: p.clone() for n, p in model.named_parameters()}
    ours = merged_state_dict(model)
    theirs = copy.deepcopy(model).merge_and_unload().state_dict()
    assert ours.keys() == theirs.keys()
    for name in theirs:
        torch.testing.assert_close(ours[name], theirs[name], rtol=0, atol=1e-6)
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())  # live weights untouched
    names = [n for n, _ in iter_merged(model, parameters_only=True)]
    assert len(names) == len(set(names)) and not any("lora" in n or "base_layer" in n for n in names)
    assert len(names) == len(list(AutoModelForCausalLM.from_pretrained(tiny_model).named_parameters()))


def test_merged_parameter_names_match_the_merged_tensors(tiny_model):
    from transformers import AutoModelForCausalLM

    from progpo.run.lora import add_lora, iter_merged, merged_parameter_names

    for model in (AutoModelForCausalLM.from_pretrained(tiny_model),
                  add_lora(AutoModelForCausalLM.from_pretrained(tiny_model), rank=2, alpha=4,
                           target_modules=("all-linear",), dropout=0.0)):
        assert merged_parameter_names(model) == [n for n, _ in iter_merged(model, parameters_only=True)]
