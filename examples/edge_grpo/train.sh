#!/usr/bin/env bash
# One row of the EDGE-GRPO paper's table (edge-grpo-spec §6/§8) on --config-name edge_grpo_paper; the per-model,
# per-row scripts beside this one set ROW and MODEL and call it.
#   ROW=edge_grpo|force_r_eda|force_r|grpo  EDGE-GRPO (GEC + EDA), +Force-R & EDA, +Force-R, vanilla GRPO
#                          (default edge_grpo)
#   MODEL                  default Qwen/Qwen2.5-Math-1.5B (the paper: Qwen2.5-Math-1.5B and -7B)
#   BATCH=throughput|paper throughput (default): 16 prompts x 8 responses per step, 62 steps for the 1000 prompts;
#                          paper: the paper's 1 prompt x 8 per step, 1000 steps. Both: one optimizer step per batch
#                          (ratio 1), one epoch, lr 1e-6 decaying linearly to 0 over the run
#   TRAIN_FILE             default data/train/train.parquet (python -m verl_ext.data.deepscaler --output data/train)
#   VAL_DIR                default data/eval (python -m verl_ext.data.eval_suites --output data/eval): its five
#                          suites, validated at T = 0.1, n = 1 as the paper evaluates (responses capped at the
#                          training length, see the preset)
#   N_GPUS, NNODES         default 8, 1 (the paper's 8 GPUs)
#   TEST_FREQ, SAVE_FREQ   validation / checkpoint every N steps; default 100 / 250 (paper batch), 6 / 16
#                          (throughput batch): about every 100 / 250 prompts either way
#   REWARD_SCALE           default original: 1 + accuracy, as the paper (verl_ext.rewards.math; `checked` also
#                          scores the format)
#   + common.sh's: DRY_RUN, PYTHON, SEED, OUTPUT_ROOT, RUN_DIR, WANDB_API_KEY. Extra arguments are Hydra overrides
#   and go last, e.g. algorithm.edge_grpo.entropy_grad=true (EDA with the official code's gradient through H_i).
# Evaluate the final checkpoint as the paper did:
#   python -m verl_ext.evaluate --model $MODEL --checkpoint $RUN_DIR/checkpoints/global_step_<last> --data $VAL_DIR
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"

ROW="${ROW:-edge_grpo}"
MODEL="${MODEL:-Qwen/Qwen2.5-Math-1.5B}"
BATCH="${BATCH:-throughput}"
TRAIN_FILE="${TRAIN_FILE:-data/train/train.parquet}"
VAL_DIR="${VAL_DIR:-data/eval}"
N_GPUS="${N_GPUS:-8}"
NNODES="${NNODES:-1}"
REWARD_SCALE="${REWARD_SCALE:-original}"

case "$ROW" in
    grpo | force_r | force_r_eda | edge_grpo) vx_method "$ROW" ;;
    *) vx_die "ROW must be one of grpo force_r force_r_eda edge_grpo (the paper's rows), not '$ROW'" ;;
esac
if [[ "$ROW" == grpo ]]; then
    # without GEC nothing caps the first generation below max_response_length: give it the original's 1024
    # directly (the preset's 1287 = 1024 + room for GEC's cue and 256-token continuation)
    METHOD_OVERRIDES+=(data.max_response_length=1024)
fi

case "$BATCH" in
    throughput) BATCH_OVERRIDES=(); TEST_FREQ="${TEST_FREQ:-6}"; SAVE_FREQ="${SAVE_FREQ:-16}" ;;
    # the mini-batch follows the batch (parts/on_policy_no_kl.yaml); one epoch of 1000 prompts = 1000 steps
    paper) BATCH_OVERRIDES=(data.train_batch_size=1); TEST_FREQ="${TEST_FREQ:-100}"; SAVE_FREQ="${SAVE_FREQ:-250}" ;;
    *) vx_die "BATCH must be throughput or paper, not '$BATCH'" ;;
esac

VAL_FILES=()
for suite in aime amc math500 minerva olympiadbench; do
    VAL_FILES+=("$VAL_DIR/$suite.parquet")
done
vx_require_files "TRAIN_FILE (python -m verl_ext.data.deepscaler writes it)" "$TRAIN_FILE"
vx_require_files "VAL_DIR (python -m verl_ext.data.eval_suites writes its suites)" "${VAL_FILES[@]}"
VAL_LIST="$(IFS=,; echo "${VAL_FILES[*]}")"

vx_run_overrides verl_ext_edge_grpo "${ROW}_$(vx_model_tag "$MODEL")_${BATCH}_seed${SEED}"

vx_launch --config-name edge_grpo_paper \
    "${METHOD_OVERRIDES[@]}" \
    "${BATCH_OVERRIDES[@]}" \
    "actor_rollout_ref.model.path=$MODEL" \
    "data.train_files=$TRAIN_FILE" \
    "data.val_files=$(vx_hydra_list "$VAL_LIST")" \
    reward.custom_reward_function.path=pkg://verl_ext.rewards.math \
    reward.custom_reward_function.name=compute_score \
    "+reward.custom_reward_function.reward_kwargs.scale=$REWARD_SCALE" \
    "trainer.n_gpus_per_node=$N_GPUS" \
    "trainer.nnodes=$NNODES" \
    "trainer.test_freq=$TEST_FREQ" \
    "trainer.save_freq=$SAVE_FREQ" \
    "${RUN_OVERRIDES[@]}" \
    "$@"
