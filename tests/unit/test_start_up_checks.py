"""verl_ext's start-up checks (verl_ext/run_checks.py ``STARTUP_CHECKS``): with every verl_ext feature off, a run that
verl accepts is never refused; batch sizes verl's engine cannot split are refused at start-up, naming the keys and a
value that works (which verl's own checks then accept)."""

from __future__ import annotations

import re
import warnings

import pytest

from verl_ext.config import ConfigError
from verl_ext.dry_run import compose_run_config
from verl_ext.run_checks import STARTUP_CHECKS

# the toy with every verl_ext feature off: verl's grpo, verl's single-turn agent loop, no GEC
PLAIN = ["algorithm.adv_estimator=grpo", "algorithm.gec.enable=false",
         "actor_rollout_ref.rollout.agent.default_agent_loop=single_turn_agent"]
ACTOR = "actor_rollout_ref.actor"


def _prepared(*overrides: str):
    """The toy's config with ``overrides``, through everything ``python -m verl_ext.main`` checks before Ray starts
    (verl_ext's start-up checks, then verl's ``validate_config``); raises what a run would."""
    from verl_ext.main import prepare

    config = compose_run_config("toy_cpu", list(overrides))
    prepare(config, [])
    return config


# verl settings that verl runs, each with a verl_ext feature that some start-up check refuses it with
VERL_SETTINGS = {
    "dr_grpo_horizon_on_v1": (["trainer.use_v1=true", f"{ACTOR}.loss_agg_mode=seq-mean-token-sum-norm",
                               "algorithm.norm_adv_by_std_in_grpo=false"], "algorithm.adv_estimator=edge_grpo"),
    "filter_groups_on_legacy": (["trainer.use_v1=false", "algorithm.filter_groups.enable=true"],
                                "algorithm.adv_estimator=gepo"),
    "rollout_is": (["actor_rollout_ref.rollout.calculate_log_probs=true",
                    "algorithm.rollout_correction.rollout_is=token"], "algorithm.gec.enable=true"),
    "bypass_mode": (["actor_rollout_ref.rollout.calculate_log_probs=true",
                     "algorithm.rollout_correction.bypass_mode=true"], "algorithm.adv_estimator=edge_grpo"),
    "remax": (["algorithm.adv_estimator=remax"], "algorithm.gec.enable=true"),
    "router_replay": (["actor_rollout_ref.rollout.enable_rollout_routing_replay=true"], "algorithm.gec.enable=true"),
    "group_of_one": (["actor_rollout_ref.rollout.n=1", f"{ACTOR}.ppo_micro_batch_size_per_gpu=16",
                      "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16"], "algorithm.adv_estimator=gepo"),
}


@pytest.mark.parametrize("name", VERL_SETTINGS)
def test_a_plain_verl_run_is_never_refused_by_verl_ext(name):
    settings, feature = VERL_SETTINGS[name]
    _prepared(*PLAIN, *settings)  # verl_ext's checks and verl's own accept it
    # the same settings with a verl_ext feature on are refused: the checks above had something to refuse
    with pytest.raises(ConfigError):
        _prepared(*PLAIN, *settings, feature, "actor_rollout_ref.rollout.agent.default_agent_loop=gec_agent")


ONE_PROMPT = ["data.train_batch_size=1", f"{ACTOR}.ppo_mini_batch_size=1"]  # toy: rollout.n=8, micro-batches of 64
REF = "actor_rollout_ref.ref"
SPLIT_REFUSAL = "verl's workers would stop on these batch settings"

# plain batch settings verl runs to the end, each with the change on which verl's engine would stop instead
ENGINE_SPLITS = {
    # evaluating a checkpoint: verl returns after the validation before training, nothing is split (issue 54, 3)
    "val_only": ([*ONE_PROMPT, "trainer.val_only=true"], ["trainer.val_before_train=false"]),
    # the v1 trainer pads 24 responses to 32: two micro-batches of 16 per pass; the legacy one cannot
    "v1_pads": (["data.train_batch_size=3", f"{ACTOR}.ppo_mini_batch_size=2", f"{ACTOR}.ppo_micro_batch_size_per_gpu=16",
                 "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16", "trainer.use_v1=true"],
                ["trainer.use_v1=false"]),
    # dynamic batch size: the reference pass follows ref.log_prob_use_dynamic_bsz (the actor's by default)
    "dynamic": ([*ONE_PROMPT, f"{ACTOR}.use_dynamic_bsz=true", f"{ACTOR}.use_kl_loss=true",
                 f"{REF}.log_prob_micro_batch_size_per_gpu=64"], [f"{REF}.log_prob_use_dynamic_bsz=false"]),
    "reference_micro_batches": ([*ONE_PROMPT, f"{ACTOR}.ppo_micro_batch_size_per_gpu=8",
                                 "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
                                 f"{REF}.log_prob_micro_batch_size_per_gpu=16"], [f"{ACTOR}.use_kl_loss=true"]),
}


@pytest.mark.parametrize("name", ENGINE_SPLITS)
def test_plain_batch_settings_verl_runs_are_never_refused(name):
    settings, stops = ENGINE_SPLITS[name]
    _prepared(*PLAIN, *settings)
    with pytest.raises(ConfigError, match=SPLIT_REFUSAL):
        _prepared(*PLAIN, *settings, *stops)


def _suggested(message: str) -> list[list[str]]:
    """The settings a refusal names as working, as overrides: its "Settings that split" and its dynamic batch size
    alternative."""
    found = re.search(r"Settings that split: (?P<set>[^()]+?)(?: \(or dynamic batch size: (?P<dynamic>[^()]+)\))?$",
                      message)
    return [group.split(", ") for group in (found["set"], found["dynamic"]) if group] if found else []


# refused batch settings (plain grpo and the toy's edge_grpo + GEC), each with what the refusal must name
REFUSED_SPLITS = {
    "micro_batches": ([*ONE_PROMPT], [
        f"{ACTOR}.ppo_micro_batch_size_per_gpu=64 against 8 responses per rank in each actor mini-batch",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=64 against 8 responses per rank in each "
        "old-log-prob pass (data.train_batch_size=1 x n=8, padded by the v1 trainer to a multiple of 8, over 1 "
        "data-parallel ranks)"]),  # the toy's default trainer is v1
    # issue 54, 4: the mini-batch size alone (1) would leave micro-batches of 16 against 8 responses
    "legacy_whole_mini_batches": (["trainer.use_v1=false", "data.train_batch_size=3", f"{ACTOR}.ppo_mini_batch_size=2",
                                   f"{ACTOR}.ppo_micro_batch_size_per_gpu=16",
                                   "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16"],
                                  [f"data.train_batch_size=3, not a multiple of {ACTOR}.ppo_mini_batch_size=2"]),
    # 2 ranks, rollout.n=3: verl's own check (train_batch_size x n a multiple of the GPUs) passes, a mini-batch of 3
    # responses cannot be shared by 2 ranks
    "ranks_share_mini_batches": (["trainer.n_gpus_per_node=2", "actor_rollout_ref.rollout.n=3",
                                  "data.train_batch_size=4", f"{ACTOR}.ppo_mini_batch_size=1"],
                                 [f"{ACTOR}.ppo_mini_batch_size=1 x n=3 = 3 responses per mini-batch, which verl's "
                                  "update shares evenly over 2 data-parallel ranks"]),
    # issue 54, 5: dynamic batch size on for the actor, not for the reference (2 responses, micro-batches of 3)
    "reference_without_dynamic_batch_size": (
        ["data.train_batch_size=1", f"{ACTOR}.ppo_mini_batch_size=1", "actor_rollout_ref.rollout.n=2",
         f"{ACTOR}.use_dynamic_bsz=true", f"{ACTOR}.use_kl_loss=true", f"{REF}.log_prob_use_dynamic_bsz=false",
         f"{REF}.log_prob_micro_batch_size_per_gpu=3"],
        [f"{REF}.log_prob_micro_batch_size_per_gpu=3 against 2 responses per rank in each reference pass"]),
    # verl's actor worker asserts at start that the old-log-prob pass's setting is the actor's
    "old_log_probs_without_the_actors_dynamic_batch_size": (
        [f"{ACTOR}.use_dynamic_bsz=true", "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=false"],
        ["actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=false with actor_rollout_ref.actor.use_dynamic_bsz=true"]),
}


@pytest.mark.parametrize("features", [PLAIN, []], ids=["plain_grpo", "toy_edge_grpo_gec"])
@pytest.mark.parametrize("name", REFUSED_SPLITS)
def test_a_batch_the_engine_cannot_split_is_refused_naming_settings_that_pass_every_check(name, features):
    settings, named = REFUSED_SPLITS[name]
    with pytest.raises(ConfigError, match=SPLIT_REFUSAL) as refused:
        _prepared(*features, *settings)
    message = str(refused.value)
    for text in named:
        assert text in message
    suggestions = _suggested(message)
    assert suggestions, message
    for suggestion in suggestions:  # each set of settings passes verl_ext's and verl's checks
        _prepared(*features, *settings, *suggestion)


def test_the_issues_case_names_the_micro_batch_sizes_with_the_mini_batch_size():
    settings, _ = REFUSED_SPLITS["legacy_whole_mini_batches"]
    with pytest.raises(ConfigError) as refused:
        _prepared(*PLAIN, *settings)
    assert _suggested(str(refused.value)) == [[
        f"{ACTOR}.ppo_mini_batch_size=1", f"{ACTOR}.ppo_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8"]]


def _bad_sampling_parquet(tmp_path) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist([{"prompt": "q", "extra_info": {"sampling_params": {"temprature": 0.5}}}]),
                   path)
    return str(path)


# one config per start-up check that only that check refuses (the toy: edge_grpo + GEC), with its refusal's words
REFUSED_BY = {
    "check_filter_groups_trainer": (["trainer.use_v1=false", "algorithm.filter_groups.enable=true"],
                                    "legacy trainer ignores filter_groups"),
    "check_gec_router_replay": (["actor_rollout_ref.rollout.enable_rollout_routing_replay=true"],
                                "MoE rollout router replay"),
    "check_gec_credit_options": (["algorithm.gec.enable=false", "algorithm.gec.prefix_advantage=zero"],
                                 "the credit options apply to the responses GEC edits"),
    "check_gec_remax": (["algorithm.adv_estimator=remax"], "remax's greedy baseline"),
    "check_token_sum_norm_horizon": (["trainer.use_v1=true", f"{ACTOR}.loss_agg_mode=seq-mean-token-sum-norm"],
                                     "loss_scale_factor=null on the v1 trainer"),
    "check_entropy_grad": (["algorithm.adv_estimator=grpo", "algorithm.edge_grpo.entropy_grad=true"],
                           "applies to algorithm.adv_estimator=edge_grpo only"),
    "check_estimator_settings": (["actor_rollout_ref.rollout.calculate_log_probs=true",
                                  "algorithm.rollout_correction.bypass_mode=true"], "needs the per-token entropy"),
    "check_gec_agent_data": (["data.train_files={bad_parquet}"], "unknown extra_info.sampling_params key"),
    "check_gec_setup": (["actor_rollout_ref.rollout.agent.default_agent_loop=single_turn_agent"],
                        "GEC runs only in the 'gec_agent' agent loop"),
    "check_gec_group_wait": (["reward.reward_manager.name=rate_limited", "algorithm.gec.group_wait_s=10",
                              "algorithm.gec.edit_scope=all_wrong_groups"],
                             "healthy groups would fail"),
    "check_v1_sampler": (["trainer.v1.sampler.sampler_kwargs.poll_interval=0"], "sampler_kwargs.poll_interval=0"),
    "check_engine_batch_split": (ONE_PROMPT, SPLIT_REFUSAL),
}


def test_every_start_up_check_has_a_config_it_refuses():
    assert list(REFUSED_BY) == [check.__name__ for check in STARTUP_CHECKS]


@pytest.mark.parametrize("name", REFUSED_BY)
def test_each_start_up_check_refuses_what_only_it_refuses(name, tmp_path):
    """A check dropped from ``STARTUP_CHECKS`` (or no longer walked by ``validate_run_config``) lets its config
    through: nothing else refuses it before verl's workers start."""
    settings, words = REFUSED_BY[name]
    settings = [s.format(bad_parquet=_bad_sampling_parquet(tmp_path)) for s in settings]
    with pytest.raises(ConfigError, match=re.escape(words)):
        _prepared(*settings)


@pytest.mark.parametrize("feature, words", [
    ("algorithm.adv_estimator=remax", "remax's greedy baseline"),
    ("algorithm.gec.enable=false", "the credit options apply"),
], ids=["remax", "credit_options"])
def test_the_batch_split_runs_last_so_that_its_settings_pass_every_check(feature, words):
    """A config refused by a feature check and by the batch split gets the feature check's refusal: the settings the
    batch split names pass every check only when the others do (so it must stay last in ``STARTUP_CHECKS``)."""
    extra = ["algorithm.gec.prefix_advantage=zero"] if feature == "algorithm.gec.enable=false" else []
    with pytest.raises(ConfigError, match=re.escape(words)):
        _prepared(*ONE_PROMPT, feature, *extra)  # ONE_PROMPT alone: the batch split's refusal (REFUSED_BY)


def test_val_only_without_val_before_train_trains_so_a_group_of_one_is_refused():
    """verl ignores ``val_only`` when ``val_before_train=false`` and trains: GEPO's group of one is refused then."""
    one = [*ONE_PROMPT, "algorithm.adv_estimator=gepo", "algorithm.gec.enable=false", "actor_rollout_ref.rollout.n=1",
           f"{ACTOR}.ppo_micro_batch_size_per_gpu=1", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
           "trainer.val_only=true"]
    _prepared(*one)  # evaluation only: no advantage
    with pytest.raises(ConfigError, match=r"rollout\.n=1 is invalid with algorithm\.adv_estimator=gepo"):
        _prepared(*one, "trainer.val_before_train=false")


def test_hints_that_cannot_fit_the_prompt_budget_are_refused_at_start_up():
    """mode=hint: a hint is prompt. The toy's prompts (~29 tokens) leave no hint room in its 32-token budget: refused,
    naming the length that fits; that length passes, with the toy's tokenizer and chat template as verl builds them."""
    hint = ["algorithm.gec.mode=hint", "+toy.train_sources=[toy_chain5]"]
    with pytest.raises(ConfigError, match=r"data.max_prompt_length=32 leaves no room for a hint") as refused:
        _prepared(*hint)
    needed = int(re.search(r"set data.max_prompt_length >= (\d+)", str(refused.value)).group(1))
    assert 32 < needed <= 64
    _prepared(*hint, f"data.max_prompt_length={needed}")
    # the user placement's template (GHPO's sentence, ~110 byte tokens) before the hint in the user turn
    with pytest.raises(ConfigError, match="hint_placement=user"):
        _prepared(*hint, "algorithm.gec.hint_placement=user", f"data.max_prompt_length={needed}")
    _prepared(*hint, "algorithm.gec.hint_placement=user", "data.max_prompt_length=192")
    _prepared("algorithm.gec.mode=gec")  # GEC's own modes: no hint, no check


# the v1 GPU-settings step (tests/e2e/test_gpu_settings.py): 4 prompts x 8 in mini-batches of 3 on 2 ranks, which
# verl pads from 32 rows to 48 with rows of 128 tokens; its first packed run with the toy's 96-token budget stopped
# in verl's rearrange_micro_batches ("max_token_len must be greater than the sequence length")
PADDED_V1_DYNAMIC = ["trainer.use_v1=true", "trainer.n_gpus_per_node=2", "ray_kwargs.ray_init.num_gpus=2",
                     "data.train_batch_size=4", f"{ACTOR}.ppo_mini_batch_size=3", f"{ACTOR}.use_dynamic_bsz=true",
                     "actor_rollout_ref.model.use_remove_padding=true"]


@pytest.mark.parametrize("budget, padded, warned", [(96, True, True), (128, True, False), (96, False, False)],
                         ids=["below-padded", "enough", "no-padding"])
def test_a_token_budget_below_v1s_padding_rows_is_warned_about_when_the_step_is_padded(budget, padded, warned):
    from verl.trainer.ppo.padding_utils import SYNTHETIC_PADDING_SEQ_LEN

    from verl_ext.batch_split import V1_PADDING_ROW_TOKENS

    assert V1_PADDING_ROW_TOKENS == SYNTHETIC_PADDING_SEQ_LEN  # the length verl's padding rows have
    settings = [*PADDED_V1_DYNAMIC, f"{ACTOR}.ppo_max_token_len_per_gpu={budget}",
                f"actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu={budget}"]
    if not padded:
        settings.append(f"{ACTOR}.ppo_mini_batch_size=4")  # 32 rows split into whole mini-batches: no padding
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _prepared(*PLAIN, *settings)
    messages = [str(w.message) for w in caught if "padding" in str(w.message) or "pads" in str(w.message)]
    assert bool(messages) == warned, messages
    if warned:
        assert f"{ACTOR}.ppo_max_token_len_per_gpu={budget}" in messages[0] and ">= 128" in messages[0]
