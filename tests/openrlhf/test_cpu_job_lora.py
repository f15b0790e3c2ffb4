"""The CPU dry run of the distributed path with a LoRA adapter (``--ds.lora.*``, OpenRLHF 0.11.2's flags):
the engine must receive the merged weights under the base model's names (its model has no adapter).

One iteration of the CPU launch script with the warm-started tiny model (1-2 minutes on 2 cores).
``--debug.check_weight_sync`` measures, after each sync, the largest difference between the actor's
merged weights and every engine parameter (``sync/max_abs_diff``)."""

from __future__ import annotations

import pytest
import torch

from .test_cpu_job import run_cpu_job, start_model, tensorboard_scalars  # noqa: F401 - start_model is a fixture

pytestmark = pytest.mark.slow


def test_lora_job_syncs_merged_weights_and_saves_a_merged_folder(tmp_path, shared_data, start_model):  # noqa: F811
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    job = run_cpu_job(tmp_path, shared_data, start_model, estimator="progpo", iters=1,
                      extra=["--progpo.zero_signal", "off", "--ds.lora.rank", "4", "--ds.lora.alpha", "64"])
    assert job["rc"] == 0, job["log"][-6000:]
    tb = tensorboard_scalars(job["out"])
    assert max(tb["train/sync/max_abs_diff"]) <= 1e-6  # every engine parameter = the actor's merged weight
    assert min(tb["train/sync/max_abs_diff_before"]) > 1e-6  # the adapter's update had moved them first
    final = job["out"] / "final"
    assert (final / "adapter_config.json").is_file()  # OpenRLHF's own save: the adapter alone
    merged = AutoModelForCausalLM.from_pretrained(final / "merged").state_dict()
    start = load_file(str(start_model / "model.safetensors"))
    assert set(start) <= set(merged)
    assert max(float((merged[k].double() - start[k].double()).abs().max()) for k in start) > 1e-6
    assert not any("lora" in k or "base_layer" in k for k in merged)
    assert torch.isfinite(torch.stack([v.double().abs().max() for v in merged.values()])).all()
