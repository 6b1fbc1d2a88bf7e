# Shared by the GEPO scripts beside it (sourced, never run): the defaults every run uses, on --config-name gepo_paper
# (K = 16 responses x 16 prompts per step, one on-policy update per step, no KL; alpha/beta/gamma the paper's). The
# run's own overrides (estimator, stats scope, data, reward) stand in its script. Variables:
#   EPOCHS              default 3 (no source gives GEPO's run length; 3 x 1000 prompts = 186 steps on math)
#   MAX_RESPONSE_LENGTH default 1024 (verl's 512 cuts most Qwen2.5-Math solutions); prompts stay at 512
#   N_GPUS, NNODES      default 8, 1
#   TEST_FREQ, SAVE_FREQ  default 10, 50
#   + ../common.sh's: DRY_RUN, PYTHON, SEED, OUTPUT_ROOT, RUN_DIR, WANDB_API_KEY
# lr, temperature and the validation sampling stay at the preset (verl's defaults: no GEPO source gives them); set
# them for your model, e.g. actor_rollout_ref.rollout.temperature=0.6.
# Math scripts: MODEL (default Qwen/Qwen2.5-Math-7B), TRAIN_FILE, VAL_DIR (defaults data/train/train.parquet,
# data/eval, as examples/edge_grpo). Mixture scripts: MODEL, TRAIN_FILES, VAL_FILES (comma-separated parquet files,
# one data_source per task) are required; REWARD_PATH names a verl custom reward for all tasks (default: verl's
# built-in scoring chosen per data_source).
# shellcheck shell=bash disable=SC2034  # the variables are for the scripts that source this
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"

EPOCHS="${EPOCHS:-3}"
MAX_RESPONSE_LENGTH="${MAX_RESPONSE_LENGTH:-1024}"
N_GPUS="${N_GPUS:-8}"
NNODES="${NNODES:-1}"
TEST_FREQ="${TEST_FREQ:-10}"
SAVE_FREQ="${SAVE_FREQ:-50}"

# gepo_math_data: TRAIN_FILE / VAL_DIR -> TRAIN_FILES / VAL_FILES (the EDGE-GRPO data), checked
gepo_math_data() {
    TRAIN_FILES="${TRAIN_FILE:-data/train/train.parquet}"
    local dir="${VAL_DIR:-data/eval}"
    VAL_FILES="$dir/aime.parquet,$dir/amc.parquet,$dir/math500.parquet,$dir/minerva.parquet,$dir/olympiadbench.parquet"
    gepo_check_data
}

# gepo_check_data: a real run stops on a local input that is missing (a dry run needs none)
gepo_check_data() {
    local train val
    IFS=, read -r -a train <<<"$TRAIN_FILES"
    IFS=, read -r -a val <<<"$VAL_FILES"
    vx_require_files "training data" "${train[@]}"
    vx_require_files "validation data" "${val[@]}"
}
