# Shared by the EDGE-GRPO paper-row scripts beside it (sourced, never run): the defaults every row uses. The row's
# own overrides (estimator, GEC, lengths) stand in the row's script. Variables:
#   MODEL                  set by the row script (Qwen/Qwen2.5-Math-1.5B or -7B); any HF name or local path
#   TRAIN_FILE             default data/train/train.parquet (python -m verl_ext.data.deepscaler --output data/train)
#   VAL_DIR                default data/eval (python -m verl_ext.data.eval_suites --output data/eval): its five
#                          suites, validated at T = 0.1, n = 1 as the paper evaluates
#   BATCH=throughput|paper throughput (default): 16 prompts x 8 responses per step, 62 steps for the 1000 prompts;
#                          paper: the paper's 1 prompt x 8 per step, 1000 steps. Both: one optimizer step per batch
#                          (ratio 1), one epoch, lr 1e-6 decaying linearly to 0
#   TEST_FREQ, SAVE_FREQ   default 6 / 16 (throughput) or 100 / 250 (paper): about every 100 / 250 prompts
#   N_GPUS, NNODES         default 8, 1 (the paper's 8 GPUs)
#   + ../common.sh's: DRY_RUN, PYTHON, SEED, OUTPUT_ROOT, RUN_DIR, WANDB_API_KEY
# shellcheck shell=bash disable=SC2034  # the variables are for the scripts that source this
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"

TRAIN_FILE="${TRAIN_FILE:-data/train/train.parquet}"
VAL_DIR="${VAL_DIR:-data/eval}"
N_GPUS="${N_GPUS:-8}"
NNODES="${NNODES:-1}"
BATCH="${BATCH:-throughput}"
case "$BATCH" in
    throughput) TRAIN_BATCH_SIZE=16; TEST_FREQ="${TEST_FREQ:-6}"; SAVE_FREQ="${SAVE_FREQ:-16}" ;;
    # the mini-batch follows the batch (hydra_configs/parts/on_policy_no_kl.yaml)
    paper) TRAIN_BATCH_SIZE=1; TEST_FREQ="${TEST_FREQ:-100}"; SAVE_FREQ="${SAVE_FREQ:-250}" ;;
    *) vx_die "BATCH must be throughput or paper, not '$BATCH'" ;;
esac
VAL_FILES="$VAL_DIR/aime.parquet,$VAL_DIR/amc.parquet,$VAL_DIR/math500.parquet,$VAL_DIR/minerva.parquet,$VAL_DIR/olympiadbench.parquet"
vx_require_files "TRAIN_FILE (python -m verl_ext.data.deepscaler writes it)" "$TRAIN_FILE"
IFS=, read -r -a _val_paths <<<"$VAL_FILES"
vx_require_files "VAL_DIR (python -m verl_ext.data.eval_suites writes its suites)" "${_val_paths[@]}"
