#!/usr/bin/env bash
# The product's own trainer raising success on text tasks with exact truth (opt-in, a few CPU-minutes):
# the `tiny-agent` policy (progpo/run/agent_model.py) is warm-started by behaviour cloning on the expert of
# the synthetic ALFWorld-like family (python -m progpo.cli.sft), deliberately short so that it wins about a
# fifth of its episodes, then trained with ProGPO by python -m progpo.cli.train on the same 2 tasks
# (32 episodes each per iteration, OpenRLHF's constant_with_warmup lr schedule). Success per iteration is
# in $OUT/rl/metrics.jsonl (env/success_rate); docs/training.md quotes a run.
#
#   bash examples/scripts/run_synthetic_learning.sh          # results in runs/synthetic_learning/
#
# Every setting below can be overridden by the environment variable of that name; extra flags go to train.
set -euo pipefail
cd "$(dirname "$0")/../.."
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
OUT=${OUT:-runs/synthetic_learning}
ESTIMATOR=${ESTIMATOR:-progpo}
SFT_EPISODES=${SFT_EPISODES:-170}
ITERATIONS=${ITERATIONS:-24}
ROLLOUTS=${ROLLOUTS:-32}
LR=${LR:-1e-3}
SEED=${SEED:-1}
ENV_FLAGS=(--env.name alfworld_like --env.max_steps 8 --env.history_length 1 --env.num_tasks 2)

if [ ! -f "$OUT/sft/sft_summary.json" ]; then
  python3 -m progpo.cli.sft "${ENV_FLAGS[@]}" --actor.model_name_or_path tiny-agent --ckpt.path "$OUT/sft" \
    --sft.num_tasks "$SFT_EPISODES" --sft.max_epochs 1 --sft.batch_size 8 --train.micro_batch_size 8 \
    --sft.lr 3e-3 --rollout.max_new_tokens 48 --train.seed 0 --logger.progress_bar false
fi
python3 -m progpo.cli.train "${ENV_FLAGS[@]}" --actor.model_name_or_path "$OUT/sft" --ckpt.path "$OUT/rl" \
  --algo.advantage.estimator "$ESTIMATOR" --rollout.batch_size 2 --rollout.n_samples_per_prompt "$ROLLOUTS" \
  --rollout.max_new_tokens 48 --rollout.max_prompt_tokens 2000 --train.num_iterations "$ITERATIONS" \
  --train.batch_size 32 --train.micro_batch_size 16 --actor.adam.lr "$LR" --actor.lr_scheduler constant_with_warmup \
  --actor.lr_warmup_ratio 0.1 --algo.kl.init_coef 0 --train.seed "$SEED" --ckpt.save_steps 1000 \
  --logger.progress_bar false --logger.tensorboard_dir none "$@"
