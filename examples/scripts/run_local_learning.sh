#!/usr/bin/env bash
# A CPU run in which a real LLM learns on a real env (opt-in): behaviour cloning of SmolLM2-135M-Instruct on
# WebShop expert trajectories, then ProGPO from it on a fixed set of RL_TASKS train tasks, with the WebShop
# score on those tasks measured before and after RL (RL_TASKS x EVAL_SAMPLES episodes each, 95% intervals),
# and on held-out test tasks before and after RL.
#
#   bash examples/scripts/run_local_learning.sh              # results in runs/learning_webshop/
#
# Steps (each a normal CLI; see docs/training.md, "A CPU run that learns"):
#   1. evaluate the base model on EVAL_TRAIN_TASKS train tasks (sampled at T=1.0, as RL rollouts);
#   2. SFT (python -m progpo.cli.sft) on the scripted expert's won episodes of SFT_TASKS train tasks;
#   3. evaluate the SFT model on the RL tasks (train tasks RL_OFFSET.., EVAL_SAMPLES episodes each, T=1.0)
#      and on EVAL_TEST_TASKS held-out test tasks (T=0.4);
#   4. RL_ITERS iterations of ProGPO on the RL tasks (python -m progpo.cli.train --actor.model_name_or_path <SFT run>);
#   5. evaluate the RL model as in step 3 (same tasks, same seeds);
#   6. python -m progpo.cli.learning_report: learning.png, learning.json and a table.
# SFT, RL and evaluation share one prompt protocol: the same template, history window
# (HISTORY_LENGTH), context guard (MAX_PROMPT_TOKENS) and step limit (MAX_STEPS).
# Every setting below can be overridden by the environment variable of that name
# (PRETRAIN=tiny and small counts give a fast smoke run). Rerunning with the same OUT continues: a
# step whose result is there is skipped, and an interrupted RL run resumes from its checkpoint.
set -euo pipefail
cd "$(dirname "$0")/../.."
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
PRETRAIN=${PRETRAIN:-smollm2-135m}
OUT=${OUT:-runs/learning_webshop}
MAX_STEPS=${MAX_STEPS:-6}
HISTORY_LENGTH=${HISTORY_LENGTH:-2}
MAX_PROMPT_TOKENS=${MAX_PROMPT_TOKENS:-512}
MAX_NEW_TOKENS=${MAX_NEW_TOKENS:-64}
SFT_TASKS=${SFT_TASKS:-8}
SFT_EPOCHS=${SFT_EPOCHS:-2}
SFT_LR=${SFT_LR:-5e-5}
RL_ITERS=${RL_ITERS:-10}
RL_LR=${RL_LR:-2e-5}
RL_TRAIN_BATCH=${RL_TRAIN_BATCH:-16}  # step samples per optimizer step (an iteration has ~40)
RL_TASKS=${RL_TASKS:-4}             # RL trains on train tasks RL_OFFSET .. RL_OFFSET + RL_TASKS - 1
RL_OFFSET=${RL_OFFSET:-200}
RL_BATCH_TASKS=${RL_BATCH_TASKS:-2}  # tasks per RL iteration
RL_ROLLOUTS=${RL_ROLLOUTS:-4}        # rollouts per task (group size)
RL_SEED=${RL_SEED:-42}               # --train.seed of the RL run (task order, sampling, shuffling)
LORA_RANK=${LORA_RANK:-0}            # > 0: RL trains a LoRA adapter of this rank (--ds.lora.rank)
LORA_ALPHA=${LORA_ALPHA:-32}
DYNAMIC_SAMPLING=${DYNAMIC_SAMPLING:-false}
EVAL_SAMPLES=${EVAL_SAMPLES:-8}      # episodes per RL task in the before/after evaluation
EVAL_TRAIN_TASKS=${EVAL_TRAIN_TASKS:-8}
EVAL_TEST_TASKS=${EVAL_TEST_TASKS:-12}
# Check every setting before anything is installed or run (a bad one would otherwise surface late in the run;
# its length: docs/training.md, "A CPU run that learns").
bad() { echo "run_local_learning.sh: $*" >&2; exit 2; }
int_at_least() {  # int_at_least NAME MIN
  if ! [[ ${!1} =~ ^[0-9]+$ ]] || (( 10#${!1} < $2 )); then bad "$1 must be an integer >= $2, got '${!1}'"; fi
}
for name in MAX_STEPS MAX_PROMPT_TOKENS MAX_NEW_TOKENS SFT_TASKS SFT_EPOCHS RL_ITERS RL_TASKS RL_BATCH_TASKS RL_TRAIN_BATCH \
            EVAL_SAMPLES EVAL_TRAIN_TASKS EVAL_TEST_TASKS LORA_ALPHA; do
  int_at_least "$name" 1
done
int_at_least RL_ROLLOUTS 2
for name in HISTORY_LENGTH RL_OFFSET LORA_RANK RL_SEED; do
  int_at_least "$name" 0
done
if [[ $DYNAMIC_SAMPLING != true && $DYNAMIC_SAMPLING != false ]]; then bad "DYNAMIC_SAMPLING must be true or false, got '$DYNAMIC_SAMPLING'"; fi
for name in SFT_LR RL_LR; do
  if ! [[ ${!name} =~ ^([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?$ ]] || [[ ${!name} =~ ^[0.]+([eE].*)?$ ]]; then
    bad "$name must be a number > 0, got '${!name}'"
  fi
done
if [ -e "$OUT" ] && [ ! -d "$OUT" ]; then bad "OUT must be a folder, got the file '$OUT'"; fi
bash scripts/install.sh
mkdir -p "$OUT"
PROTOCOL=(--env.name webshop --env.max_steps "$MAX_STEPS" --env.history_length "$HISTORY_LENGTH"
  --rollout.max_prompt_tokens "$MAX_PROMPT_TOKENS" --rollout.max_new_tokens "$MAX_NEW_TOKENS")
log() { printf '[learning %s] %s (load average %s)\n' "$(date -u +%H:%M:%S)" "$*" "$(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/timing.txt"; }
evaluate() {  # evaluate MODEL SPLIT TASKS TEMPERATURE OUTFILE [FLAG...] (skipped when OUTFILE exists)
  [ -e "$5" ] && return 0
  python3 -m progpo.cli.evaluate --actor.model_name_or_path "$1" --env.eval_split "$2" --eval.num_tasks "$3" \
    --rollout.temperature "$4" --out "$5.tmp" "${PROTOCOL[@]}" "${@:6}" >/dev/null
  mv "$5.tmp" "$5"  # a cut-short evaluation is never taken for a finished one
}
rl_tasks() {  # evaluate MODEL on the RL tasks, EVAL_SAMPLES episodes each at the rollout temperature
  # evaluate takes tasks 0..N-1 of a split: the RL tasks are RL_OFFSET.., so the split is viewed from there
  [ -e "$2" ] && return 0
  python3 -m progpo.cli.evaluate --actor.model_name_or_path "$1" --env.eval_split train --eval.num_tasks "$RL_TASKS" \
    --eval.task_offset "$RL_OFFSET" --eval.n_samples "$EVAL_SAMPLES" --rollout.temperature 1.0 --out "$2.tmp" \
    "${PROTOCOL[@]}" >/dev/null
  mv "$2.tmp" "$2"
}
START=$SECONDS
log "1/6 base model on $EVAL_TRAIN_TASKS train tasks"
evaluate "$PRETRAIN" train "$EVAL_TRAIN_TASKS" 1.0 "$OUT/eval_base_train.json"
log "2/6 SFT on expert episodes of $SFT_TASKS train tasks"
if [ ! -e "$OUT/sft/sft_summary.json" ]; then
  rm -rf "$OUT/sft"  # an SFT run cut short: start it again
  python3 -m progpo.cli.sft --actor.model_name_or_path "$PRETRAIN" --ckpt.path "$OUT/sft" "${PROTOCOL[@]}" \
  --sft.num_tasks "$SFT_TASKS" --sft.max_epochs "$SFT_EPOCHS" --sft.batch_size 8 --train.micro_batch_size 2 \
  --sft.lr "$SFT_LR"
fi
log "3/6 SFT model on the $RL_TASKS RL tasks (x$EVAL_SAMPLES) and $EVAL_TEST_TASKS test tasks"
rl_tasks "$OUT/sft" "$OUT/eval_sft_rltasks.json"
evaluate "$OUT/sft" test "$EVAL_TEST_TASKS" 0.4 "$OUT/eval_sft_test.json"
log "4/6 ProGPO from the SFT model on train tasks $RL_OFFSET..$((RL_OFFSET + RL_TASKS - 1)), $RL_ITERS iterations"
RESUME=()
if [ -e "$OUT/rl/checkpoints/latest" ] || [ -e "$OUT/rl/metrics.jsonl" ]; then RESUME=(--ckpt.load_enable); fi  # no checkpoint yet: --ckpt.load_enable starts it over
python3 -m progpo.cli.train "${RESUME[@]}" --actor.model_name_or_path "$OUT/sft" --ckpt.path "$OUT/rl" --algo.advantage.estimator progpo "${PROTOCOL[@]}" \
  --env.task_offset "$RL_OFFSET" --env.num_tasks "$RL_TASKS" \
  --train.num_iterations "$RL_ITERS" --rollout.batch_size "$RL_BATCH_TASKS" --rollout.n_samples_per_prompt "$RL_ROLLOUTS" \
  --rollout.temperature 1.0 --train.batch_size "$RL_TRAIN_BATCH" --train.micro_batch_size 2 --actor.adam.lr "$RL_LR" --train.seed "$RL_SEED" \
  --ds.lora.rank "$LORA_RANK" --ds.lora.alpha "$LORA_ALPHA" --rollout.dynamic_sampling "$DYNAMIC_SAMPLING" \
  --ds.zero_stage 0 --ckpt.save_steps 1 --ckpt.max_num 1
log "5/6 RL model on the $RL_TASKS RL tasks (x$EVAL_SAMPLES) and $EVAL_TEST_TASKS test tasks"
rl_tasks "$OUT/rl" "$OUT/eval_rl_rltasks.json"
evaluate "$OUT/rl" test "$EVAL_TEST_TASKS" 0.4 "$OUT/eval_rl_test.json"
log "6/6 report"
python3 -m progpo.cli.learning_report "$OUT"
log "done in $((SECONDS - START)) s wall"
# CPU time (user, system): this shell, then its children (not in a pipe: a subshell has no children)
times >>"$OUT/timing.txt"
tail -2 "$OUT/timing.txt"
