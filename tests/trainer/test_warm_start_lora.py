"""``train --sft.num_tasks N --sft.lora true``: the behaviour cloning trains the run's LoRA adapter on the frozen
base, and RL goes on training that adapter; the base weights never change and the KL reference is the cloned
policy (a frozen copy of the cloned adapter), not the base model.

Tiny model, 2 expert episodes, one epoch, on the shared WebShop server (seconds)."""

from __future__ import annotations

import pytest
import torch

LORA = ["--ds.lora.rank", "4", "--ds.lora.alpha", "8", "--sft.lora", "true"]
WARM = ["--sft.num_tasks", "2", "--sft.max_epochs", "1", "--sft.batch_size", "4", "--sft.lr", "1e-2"]
PROTOCOL = ["--actor.model_name_or_path", "tiny", "--env.max_steps", "8", "--rollout.max_new_tokens", "160",
            "--rollout.max_prompt_tokens", "384", "--rollout.batch_size", "1", "--rollout.n_samples_per_prompt", "2",
            "--train.num_iterations", "2", "--train.micro_batch_size", "4", "--logger.progress_bar", "false",
            "--logger.tensorboard_dir", "none", "--progpo.zero_signal", "off", "--actor.adam.lr", "1e-2",
            "--actor.adam.weight_decay", "0.01"]  # weight decay: every update runs, whatever the returns


def _cfg(tmp_path, webshop_url, cache, *extra):
    from progpo.trainer.config import config_from_args

    return config_from_args([*PROTOCOL, *WARM, "--env.url", webshop_url, "--sft.cache_dir", str(cache),
                             "--ckpt.path", str(tmp_path / "run"), *LORA, *extra])


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


@pytest.fixture(scope="module")
def lora_warm(tmp_path_factory, webshop_url):
    from progpo.trainer.loop import Trainer

    tmp = tmp_path_factory.mktemp("lora_warm")
    trainer = Trainer(_cfg(tmp, webshop_url, tmp / "cache"))
    trainer.fit()
    return trainer


def test_rl_goes_on_training_the_cloned_adapter_on_the_untouched_base(lora_warm):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from progpo.run.lora import REFERENCE, reference_context
    from progpo.run.models import resolve_pretrain
    from progpo.trainer.warm_start import adapter_dir

    actor = lora_warm.actor
    cloned = adapter_dir(lora_warm.warm_start_path)
    base = AutoModelForCausalLM.from_pretrained(resolve_pretrain("tiny")).eval()
    # the base weights are the pretrained model's, bit for bit: neither the clone nor RL changed them
    live = {n.replace(".base_layer.", "."): p for n, p in actor.model.get_base_model().named_parameters()
            if ".lora_" not in n}
    pretrained = dict(base.named_parameters())
    assert live.keys() == pretrained.keys()
    assert all(torch.equal(live[n], pretrained[n]) for n in live)
    # only the trained adapter trains; its frozen copy is the reference and stays the clone
    trainable = [n for n, p in actor.model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_" in n and f".{REFERENCE}." not in n for n in trainable)
    ids = torch.tensor([[5, 17, 250, 9, 1000, 3]])
    clone = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(resolve_pretrain("tiny")), cloned).eval()
    assert (_logits(clone, ids) - _logits(base, ids)).abs().max() > 1e-4  # the clone learned something
    with reference_context(actor.model):
        torch.testing.assert_close(_logits(actor.model, ids), _logits(clone, ids), rtol=0, atol=1e-5)
    after = {n for n, p in actor.model.named_parameters() if p.requires_grad}
    assert after == set(trainable)  # the trained adapter trainable again, the reference still frozen
    # both iterations updated; the second scored its samples under the reference (the clone), the policy having moved
    assert [m["loss/optimizer_steps"] >= 1 for m in lora_warm.history] == [True, True]
    assert lora_warm.history[1]["loss/kl"] > 0
    assert (_logits(actor.model, ids) - _logits(clone, ids)).abs().max() > 1e-6  # RL moved it from the clone
    # the checkpoint's adapter is the trained one only, not the reference copy
    saved = lora_warm.ckpt.latest() / "adapter"
    assert (saved / "adapter_config.json").is_file() and not (saved / REFERENCE).exists()


def test_the_clone_is_cached_apart_from_a_clone_of_every_weight(lora_warm, tmp_path, webshop_url):
    import json
    from pathlib import Path

    from progpo.run.models import resolve_pretrain
    from progpo.trainer.warm_start import _key_digest, cache_key, sft_args

    data = {"env": "webshop"}
    with_lora = _cfg(tmp_path, webshop_url, tmp_path / "cache")
    full = _cfg(tmp_path, webshop_url, tmp_path / "cache", "--sft.lora", "false")
    keys = [cache_key(sft_args(c), resolve_pretrain("tiny"), data) for c in (with_lora, full)]
    assert keys[0]["settings"]["ds"]["lora"]["rank"] == 4 and keys[1]["settings"]["ds"]["lora"]["rank"] == 0
    assert _key_digest(keys[0]) != _key_digest(keys[1])
    saved = json.loads((Path(lora_warm.warm_start_path) / "warm_start_key.json").read_text())
    assert saved["settings"] == json.loads(json.dumps(keys[0]["settings"], default=str))  # the run's clone: the adapter one


def test_sft_lora_needs_an_adapter_and_a_warm_start():
    from progpo.trainer.config import config_from_args

    with pytest.raises(ValueError, match="^--sft.lora true clones into the LoRA adapter.*--ds.lora.rank is 0"):
        config_from_args(["--sft.num_tasks", "2", "--sft.lora", "true"])
    with pytest.raises(ValueError, match="^--sft.lora true sets how the warm start clones.*--sft.num_tasks is 0"):
        config_from_args(["--ds.lora.rank", "4", "--sft.lora", "true"])


def test_an_adapter_of_another_rank_is_refused(tmp_path, tiny_model):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from progpo.run.lora import load_lora

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model),
                           LoraConfig(r=2, lora_alpha=4, target_modules="all-linear"))
    model.save_pretrained(tmp_path / "a")
    with pytest.raises(ValueError, match="--ds.lora.rank is 4 but the adapter .* has rank 2"):
        load_lora(AutoModelForCausalLM.from_pretrained(tiny_model), str(tmp_path / "a"), rank=4, reference=True)
    with pytest.raises(FileNotFoundError, match="no LoRA adapter"):
        load_lora(AutoModelForCausalLM.from_pretrained(tiny_model), str(tmp_path), rank=4, reference=True)
