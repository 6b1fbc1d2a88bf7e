# Shared by the scripts under examples/ (sourced, never run). Each script sets its variables, builds its Hydra
# overrides and calls vx_launch; the variables every script reads are listed in README.md ("Experiments"):
#   DRY_RUN=1     compose, resolve and check the run's config (python -m verl_ext.dry_run), print it, train nothing
#   PYTHON        the interpreter with verl_ext installed (default: python)
#   SEED          data order (data.seed) and rollout sampling (actor_rollout_ref.rollout.seed); default 1
#   OUTPUT_ROOT   default outputs; RUN_DIR (default $OUTPUT_ROOT/<project>/<experiment name>) holds the checkpoints,
#                 verl's file-logger metrics (metrics.jsonl), validation generations and Hydra's record of the run.
#                 A rerun with the same RUN_DIR resumes from its latest checkpoint (verl's resume_mode=auto); the
#                 previous metrics.jsonl is kept as metrics.<time>.jsonl
#   WANDB_API_KEY when set, wandb is logged to as well as the console and the file
# shellcheck shell=bash disable=SC2034  # METHOD_OVERRIDES, RUN_OVERRIDES are for the scripts that source this

PYTHON="${PYTHON:-python}"
SEED="${SEED:-1}"
OUTPUT_ROOT="${OUTPUT_ROOT:-outputs}"

vx_die() {
    echo "$(basename "$0"): $*" >&2
    exit 2
}

# vx_method METHOD: sets METHOD_OVERRIDES, the algorithm keys of a method. Every key a row depends on is set, so a
# row means the same on any config: the EDGE-GRPO paper's four rows (grpo, force_r, force_r_eda, edge_grpo), GEC
# alone on grpo, edge_grpo with the degenerate-edit guard (wrong replies with no token of their own before EOS stay
# uncorrected: algorithm.gec.min_own_tokens=1, docs/toy.md), EDA alone, GEPO with statistics over the whole batch
# or per data_source, each GEC branch alone, GEC's credit options, EDA's gradient mode, prompt-side hints.
vx_method() {
    case "$1" in
        grpo) METHOD_OVERRIDES=(algorithm.adv_estimator=grpo algorithm.gec.enable=false) ;;
        force_r) METHOD_OVERRIDES=(algorithm.adv_estimator=grpo algorithm.gec.enable=true
                                   algorithm.gec.mode=force_reflect) ;;
        force_r_eda) METHOD_OVERRIDES=(algorithm.adv_estimator=edge_grpo algorithm.gec.enable=true
                                       algorithm.gec.mode=force_reflect) ;;
        edge_grpo) METHOD_OVERRIDES=(algorithm.adv_estimator=edge_grpo algorithm.gec.enable=true
                                     algorithm.gec.mode=gec) ;;
        grpo_gec) METHOD_OVERRIDES=(algorithm.adv_estimator=grpo algorithm.gec.enable=true
                                    algorithm.gec.mode=gec) ;;
        edge_grpo_guard) METHOD_OVERRIDES=(algorithm.adv_estimator=edge_grpo algorithm.gec.enable=true
                                           algorithm.gec.mode=gec algorithm.gec.min_own_tokens=1) ;;
        eda) METHOD_OVERRIDES=(algorithm.adv_estimator=edge_grpo algorithm.gec.enable=false) ;;
        gepo) METHOD_OVERRIDES=(algorithm.adv_estimator=gepo algorithm.gec.enable=false
                                algorithm.gepo.stats_scope=global) ;;
        gepo_per_source) METHOD_OVERRIDES=(algorithm.adv_estimator=gepo algorithm.gec.enable=false
                                           algorithm.gepo.stats_scope=per_data_source) ;;
        # one GEC branch alone (reflect alone is force_r_eda), and the paper's mix with the injected
        # tokens out of the loss
        gec_answer) METHOD_OVERRIDES=(algorithm.adv_estimator=edge_grpo algorithm.gec.enable=true algorithm.gec.mode=gec
                                      algorithm.gec.p_reflect=0 algorithm.gec.p_answer=1 algorithm.gec.p_solution=0) ;;
        gec_solution) METHOD_OVERRIDES=(algorithm.adv_estimator=edge_grpo algorithm.gec.enable=true
                                        algorithm.gec.mode=gec algorithm.gec.p_reflect=0 algorithm.gec.p_answer=0
                                        algorithm.gec.p_solution=1) ;;
        # an injection branch with the reflect branch beside it (p 0.5 / 0.5): alone, the answer and solution
        # branches make every group all correct (zero advantages, no update), so each needs the reflect branch's
        # failed corrections to be contrasted with
        gec_reflect_answer) METHOD_OVERRIDES=(algorithm.adv_estimator=edge_grpo algorithm.gec.enable=true
                                              algorithm.gec.mode=gec algorithm.gec.p_reflect=0.5
                                              algorithm.gec.p_answer=0.5 algorithm.gec.p_solution=0) ;;
        gec_reflect_solution) METHOD_OVERRIDES=(algorithm.adv_estimator=edge_grpo algorithm.gec.enable=true
                                                algorithm.gec.mode=gec algorithm.gec.p_reflect=0.5
                                                algorithm.gec.p_answer=0 algorithm.gec.p_solution=0.5) ;;
        edge_grpo_masked) METHOD_OVERRIDES=(algorithm.adv_estimator=edge_grpo algorithm.gec.enable=true
                                            algorithm.gec.mode=gec algorithm.gec.mask_injected=true) ;;
        # GEC's credit options (docs/gec.md "Credit options"), each alone with edge_grpo, and all three together
        edge_grpo_scope) METHOD_OVERRIDES=(algorithm.adv_estimator=edge_grpo algorithm.gec.enable=true
                                           algorithm.gec.mode=gec algorithm.gec.edit_scope=all_wrong_groups) ;;
        edge_grpo_before) METHOD_OVERRIDES=(algorithm.adv_estimator=edge_grpo algorithm.gec.enable=true
                                            algorithm.gec.mode=gec algorithm.gec.prefix_advantage=before) ;;
        edge_grpo_zero) METHOD_OVERRIDES=(algorithm.adv_estimator=edge_grpo algorithm.gec.enable=true
                                          algorithm.gec.mode=gec algorithm.gec.prefix_advantage=zero) ;;
        edge_grpo_shaped) METHOD_OVERRIDES=(algorithm.adv_estimator=edge_grpo algorithm.gec.enable=true
                                            algorithm.gec.mode=gec algorithm.gec.injected_loss=shaped) ;;
        edge_grpo_credit) METHOD_OVERRIDES=(algorithm.adv_estimator=edge_grpo algorithm.gec.enable=true
                                            algorithm.gec.mode=gec algorithm.gec.edit_scope=all_wrong_groups
                                            algorithm.gec.prefix_advantage=before algorithm.gec.injected_loss=shaped) ;;
        # the hard split's pair: the option that cuts the all-wrong groups most with the one that keeps the easy families
        edge_grpo_scope_shaped) METHOD_OVERRIDES=(algorithm.adv_estimator=edge_grpo algorithm.gec.enable=true
                                                  algorithm.gec.mode=gec algorithm.gec.edit_scope=all_wrong_groups
                                                  algorithm.gec.injected_loss=shaped) ;;
        # EDA in the official code's gradient mode (through 1/H_i), alone and with GEC
        eda_grad) METHOD_OVERRIDES=(algorithm.adv_estimator=edge_grpo algorithm.gec.enable=false
                                    algorithm.edge_grpo.entropy_grad=true) ;;
        edge_grpo_grad) METHOD_OVERRIDES=(algorithm.adv_estimator=edge_grpo algorithm.gec.enable=true
                                          algorithm.gec.mode=gec algorithm.edge_grpo.entropy_grad=true) ;;
        # prompt-side hints in all-wrong groups (docs/hints.md): one member replaced by the lowest right level
        # (Scaf-GRPO), the whole group regenerated at a rising level (GHPO), and the first with EDA. On the toy a hint
        # needs prompt room: pass data.max_prompt_length=64 to every run of the round (docs/hints.md)
        grpo_hint) METHOD_OVERRIDES=(algorithm.adv_estimator=grpo algorithm.gec.enable=true algorithm.gec.mode=hint
                                     algorithm.gec.hint_scope=one) ;;
        grpo_hint_all) METHOD_OVERRIDES=(algorithm.adv_estimator=grpo algorithm.gec.enable=true
                                         algorithm.gec.mode=hint algorithm.gec.hint_scope=all) ;;
        edge_grpo_hint) METHOD_OVERRIDES=(algorithm.adv_estimator=edge_grpo algorithm.gec.enable=true
                                          algorithm.gec.mode=hint algorithm.gec.hint_scope=one) ;;
        # GHPO's scope at the lowest level only: on the toy one running total, short of the step its hard split fails
        # (docs/toy.md, "Prompt-side hints on the hard split")
        grpo_hint_low) METHOD_OVERRIDES=(algorithm.adv_estimator=grpo algorithm.gec.enable=true algorithm.gec.mode=hint
                                         algorithm.gec.hint_scope=all 'algorithm.gec.hint_levels=[0.25]') ;;
        *) vx_die "unknown method '$1' (one of: grpo force_r force_r_eda edge_grpo grpo_gec edge_grpo_guard eda gepo gepo_per_source gec_answer gec_solution gec_reflect_answer gec_reflect_solution edge_grpo_masked edge_grpo_scope edge_grpo_before edge_grpo_zero edge_grpo_shaped edge_grpo_credit edge_grpo_scope_shaped eda_grad edge_grpo_grad grpo_hint grpo_hint_all edge_grpo_hint grpo_hint_low)" ;;
    esac
}

vx_dry_run() {
    case "${DRY_RUN:-0}" in
        0 | "") return 1 ;;
        1) return 0 ;;
        *) vx_die "DRY_RUN must be 0 or 1, not '${DRY_RUN}'" ;;
    esac
}

# a model's short name for experiment names: Qwen/Qwen2.5-Math-7B -> Qwen2.5-Math-7B
vx_model_tag() {
    local path="${1%/}"
    echo "${path##*/}"
}

vx_abspath() {
    case "$1" in
        /* | *://*) echo "$1" ;;
        *) echo "$PWD/$1" ;;
    esac
}

# "a.parquet,b.parquet" -> "[a.parquet,b.parquet]" (Hydra's list syntax)
vx_hydra_list() {
    echo "[$1]"
}

# vx_require_files VAR_NAME PATH...: a real run stops here on a local input that is missing (a dry run needs none)
vx_require_files() {
    local name="$1" path
    shift
    vx_dry_run && return 0
    for path in "$@"; do
        [[ "$path" == *://* || -e "$path" ]] || vx_die "$name: $path does not exist"
    done
}

# vx_run_overrides PROJECT EXPERIMENT_NAME: sets RUN_DIR and RUN_OVERRIDES (names, loggers, output paths, seed)
vx_run_overrides() {
    local project="$1" name="$2" loggers="[console,file]"
    [[ -n "${WANDB_API_KEY:-}" ]] && loggers="[console,file,wandb]"
    RUN_DIR="$(vx_abspath "${RUN_DIR:-$OUTPUT_ROOT/$project/$name}")"
    RUN_OVERRIDES=(
        "trainer.project_name=$project"
        "trainer.experiment_name=$name"
        "trainer.logger=$loggers"
        "trainer.default_local_dir=$RUN_DIR/checkpoints"
        "trainer.validation_data_dir=$RUN_DIR/validation"
        # verl's file logger writes to VERL_FILE_LOGGER_PATH: exported below for a local Ray cluster and put in
        # the job's runtime_env for an existing one
        "++ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH=$RUN_DIR/metrics.jsonl"
        "trainer.file_logger_path=$RUN_DIR/metrics.jsonl"  # verl_ext's runner sets VERL_FILE_LOGGER_PATH from it
        "data.seed=$SEED"
        "actor_rollout_ref.rollout.seed=$SEED"
        "hydra.run.dir=$RUN_DIR/hydra/$(date +%Y%m%d-%H%M%S)"
    )
}

# vx_launch ARGS...: python -m verl_ext.main ARGS (python -m verl_ext.dry_run ARGS with DRY_RUN=1)
vx_launch() {
    if vx_dry_run; then
        echo "DRY_RUN=1, would run: $PYTHON -m verl_ext.main $(printf '%q ' "$@")" >&2
        "$PYTHON" -m verl_ext.dry_run "$@"
        return
    fi
    mkdir -p "$RUN_DIR"
    if [[ -e "$RUN_DIR/metrics.jsonl" ]]; then  # verl's file logger truncates its file: keep the earlier part
        mv "$RUN_DIR/metrics.jsonl" "$RUN_DIR/metrics.$(date +%Y%m%d-%H%M%S).jsonl"
    fi
    export VERL_FILE_LOGGER_PATH="$RUN_DIR/metrics.jsonl"
    echo "+ $PYTHON -m verl_ext.main $(printf '%q ' "$@")" >&2
    "$PYTHON" -m verl_ext.main "$@"
}
