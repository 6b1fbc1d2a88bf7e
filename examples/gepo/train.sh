#!/usr/bin/env bash
# GRPO vs GEPO on --config-name gepo_paper (K = 16 responses x 16 prompts per step, one on-policy update per step,
# no KL; GEPO's alpha/beta/gamma are the paper's). The scripts beside this one set TASK and METHOD and call it.
#   TASK=math|mixture   math (default): the EDGE-GRPO data (DeepScaleR-hard-1k, five eval suites) and the
#                       boxed-math reward; mixture: your parquet files of several tasks, one data_source each
#   METHOD              grpo | gepo (statistics over the whole batch, the paper's) | gepo_per_source
#                       (algorithm.gepo.stats_scope=per_data_source: thresholds per task, an extension); default gepo
#   MODEL               math: default Qwen/Qwen2.5-Math-7B; mixture: required
#   TRAIN_FILE, VAL_DIR math: default data/train/train.parquet, data/eval (as examples/edge_grpo/train.sh)
#   TRAIN_FILES, VAL_FILES  mixture, required: comma-separated parquet files (verl's layout, data_source per row)
#   REWARD_PATH         mixture: a verl custom reward file / pkg:// module for all tasks (default: none, verl's
#                       built-in scoring chosen per data_source); math: pkg://verl_ext.rewards.math
#   EPOCHS              default 3 (no source gives GEPO's run length; 3 x 1000 prompts = 186 steps on math)
#   MAX_RESPONSE_LENGTH default 1024 (verl's 512 cuts most Qwen2.5-Math solutions); prompts stay at 512
#   N_GPUS, NNODES      default 8, 1
#   TEST_FREQ, SAVE_FREQ  default 10, 50
#   + common.sh's: DRY_RUN, PYTHON, SEED, OUTPUT_ROOT, RUN_DIR, WANDB_API_KEY. Extra arguments are Hydra overrides
#   and go last. lr, temperature and the validation sampling stay at the preset (verl's defaults: no GEPO source
#   gives them); set them for your model, e.g. actor_rollout_ref.rollout.temperature=0.6.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"

TASK="${TASK:-math}"
METHOD="${METHOD:-gepo}"
EPOCHS="${EPOCHS:-3}"
MAX_RESPONSE_LENGTH="${MAX_RESPONSE_LENGTH:-1024}"
N_GPUS="${N_GPUS:-8}"
NNODES="${NNODES:-1}"
TEST_FREQ="${TEST_FREQ:-10}"
SAVE_FREQ="${SAVE_FREQ:-50}"

case "$METHOD" in
    grpo | gepo | gepo_per_source) vx_method "$METHOD" ;;
    *) vx_die "METHOD must be grpo, gepo or gepo_per_source, not '$METHOD'" ;;
esac

case "$TASK" in
    math)
        MODEL="${MODEL:-Qwen/Qwen2.5-Math-7B}"
        TRAIN_FILE="${TRAIN_FILE:-data/train/train.parquet}"
        VAL_DIR="${VAL_DIR:-data/eval}"
        TRAIN_LIST="$TRAIN_FILE"
        VAL_LIST=""
        for suite in aime amc math500 minerva olympiadbench; do
            VAL_LIST="${VAL_LIST:+$VAL_LIST,}$VAL_DIR/$suite.parquet"
        done
        TASK_OVERRIDES=(
            reward.custom_reward_function.path=pkg://verl_ext.rewards.math
            reward.custom_reward_function.name=compute_score
            +reward.custom_reward_function.reward_kwargs.scale=original  # 1 + accuracy, as examples/edge_grpo
        )
        ;;
    mixture)
        MODEL="${MODEL:?set MODEL to the policy model (Hugging Face name or local path) for the task mixture}"
        TRAIN_LIST="${TRAIN_FILES:?set TRAIN_FILES to the training parquet files of the mixture, comma-separated}"
        VAL_LIST="${VAL_FILES:?set VAL_FILES to the validation parquet files of the mixture, comma-separated}"
        TASK_OVERRIDES=()
        if [[ -n "${REWARD_PATH:-}" ]]; then
            TASK_OVERRIDES+=("reward.custom_reward_function.path=$REWARD_PATH")
        fi
        ;;
    *) vx_die "TASK must be math or mixture, not '$TASK'" ;;
esac
IFS=, read -r -a train_paths <<<"$TRAIN_LIST"
IFS=, read -r -a val_paths <<<"$VAL_LIST"
vx_require_files "training data" "${train_paths[@]}"
vx_require_files "validation data" "${val_paths[@]}"

vx_run_overrides verl_ext_gepo "${TASK}_${METHOD}_$(vx_model_tag "$MODEL")_seed${SEED}"

vx_launch --config-name gepo_paper \
    "${METHOD_OVERRIDES[@]}" \
    "actor_rollout_ref.model.path=$MODEL" \
    "data.train_files=$(vx_hydra_list "$TRAIN_LIST")" \
    "data.val_files=$(vx_hydra_list "$VAL_LIST")" \
    "data.max_response_length=$MAX_RESPONSE_LENGTH" \
    "${TASK_OVERRIDES[@]}" \
    "trainer.total_epochs=$EPOCHS" \
    "trainer.n_gpus_per_node=$N_GPUS" \
    "trainer.nnodes=$NNODES" \
    "trainer.test_freq=$TEST_FREQ" \
    "trainer.save_freq=$SAVE_FREQ" \
    "${RUN_OVERRIDES[@]}" \
    "$@"
