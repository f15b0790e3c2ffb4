#!/usr/bin/env bash
# The main job on one machine without a GPU: WebShop (or ALFWorld) + SmolLM2-135M-Instruct + ProGPO.
#
#   bash examples/scripts/run_local.sh                      # WebShop, progpo, 3 iterations
#   ENV=alfworld ESTIMATOR=gigpo bash examples/scripts/run_local.sh --train.num_iterations 5
#
# First installs what is missing (scripts/install.sh: the same steps as CI; no pip run when all is there).
# Starts the WebShop server on the real products (../shared/data/webshop, $PROGPO_DATA/webshop or
# ~/.cache/progpo/data/webshop; override with --env.data_dir), converts the bundled SmolLM2 GGUF to a
# Hugging Face folder once (~/.cache/progpo/models), then warm-starts: behaviour cloning of the scripted
# expert on 8 train tasks (2 epochs), so the model writes the <think>/<action> format and its groups
# differ in return (the base model answers in no valid format at all: every batch would be flat). The
# cloned model is cached in ~/.cache/progpo/warm_start (keyed by every setting that shapes it) and
# reused by later runs; --sft.num_tasks 0 turns the warm start off. Then trains a few ProGPO
# iterations and prints metrics per iteration (valid-format share `valid`, WebShop `score`, `adv_std`,
# `flat`). PROGPO_DRY_RUN=1 prints the command instead. Extra arguments are passed to
# `python -m progpo.cli.train` (see docs/training.md).
# fp32 on purpose: in bf16 the weights the forward pass uses round away updates below bf16's spacing,
# and the 10-step clone learned far less (docs/training.md, "The main job").
set -euo pipefail
cd "$(dirname "$0")/../.."
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 RAY_AUTH_MODE=disabled
ENV="${ENV:-webshop}"
ESTIMATOR="${ESTIMATOR:-progpo}"
# the env's short step limit, from its spec (demo_max_steps, else max_steps); before installing: stdlib only.
# "--": an ENV that begins with "-" is a name, not an option of the envs CLI
if ! STEP_LIMITS=$(python3 -m progpo.cli.envs get -- "$ENV" demo_max_steps max_steps 2>&1); then
  echo "run_local.sh: ENV=${ENV@Q}: $STEP_LIMITS" >&2
  exit 2
fi
MAX_STEPS=$(printf '%s\n' "$STEP_LIMITS" | grep -m1 .)
CMD=(python3 -m progpo.cli.train
  --actor.model_name_or_path smollm2-135m
  --env.name "$ENV"
  --algo.advantage.estimator "$ESTIMATOR"
  --ckpt.path "runs/${ENV}_${ESTIMATOR}"
  --train.num_iterations 3
  --rollout.batch_size 2
  --rollout.n_samples_per_prompt 4
  --env.max_steps "$MAX_STEPS"
  --rollout.max_new_tokens 64
  --rollout.temperature 1.0
  --rollout.max_prompt_tokens 512
  --env.history_length 2
  --train.batch_size 16
  --train.micro_batch_size 2
  --actor.adam.lr 1e-5
  --ds.zero_stage 0
  --sft.num_tasks 8
  --sft.keep_failed true
  "$@")
if [ "${PROGPO_DRY_RUN:-0}" = 1 ]; then printf '%s\n' "${CMD[@]}"; exit 0; fi  # the command, nothing installed or run
bash scripts/install.sh
exec "${CMD[@]}"
