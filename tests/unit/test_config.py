import os

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from verl_ext.config import (
    ConfigError,
    EdgeGrpoConfig,
    GecConfig,
    GepoConfig,
    load_algorithm_config,
    register_structured_configs,
)
from verl_ext.run_checks import validate_run_config

CONFIG_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "hydra_configs")


def test_defaults_are_the_papers():
    cfg = load_algorithm_config(None)
    assert (cfg.gepo.alpha_low, cfg.gepo.alpha_high, cfg.gepo.beta_low, cfg.gepo.beta_high, cfg.gepo.ema_gamma) == (
        0.5, 0.2, 0.2, 0.3, 0.01)
    assert cfg.gepo.entropy_estimator == "token_mean" and cfg.gepo.stats_scope == "global"
    assert cfg.edge_grpo.factor_min is None and cfg.edge_grpo.factor_max is None


@pytest.mark.parametrize(
    "node, message",
    [
        ({"gepo": {"alpha_low": 1.5}}, r"algorithm\.gepo\.alpha_low=1\.5 is invalid: must be in \[0, 1\]"),
        ({"gepo": {"ema_gamma": 0.0}}, r"algorithm\.gepo\.ema_gamma=0\.0 is invalid: must be in \(0, 1\]"),
        ({"gepo": {"beta_high": -1}}, r"algorithm\.gepo\.beta_high=-1 is invalid: must be >= 0"),
        ({"gepo": {"entropy_estimator": "bogus"}}, r"algorithm\.gepo\.entropy_estimator='bogus'.*token_mean"),
        ({"gepo": {"stats_scope": "task"}}, r"algorithm\.gepo\.stats_scope='task'.*per_data_source"),
        ({"gepo": {"alpha_high": 0.5}}, r"algorithm\.gepo\.alpha_high=0\.5 is invalid: must be < "),
        ({"gepo": {"alpah_low": 0.4}}, r"unknown key\(s\) \['algorithm\.gepo\.alpah_low'\]"),
        ({"edge_grpo": {"factor_min": 3.0, "factor_max": 2.0}}, r"algorithm\.edge_grpo\.factor_min=3\.0"),
        ({"edge_grpo": {"entropy_eps": -1.0}}, r"algorithm\.edge_grpo\.entropy_eps=-1\.0"),
    ],
)
def test_validation_names_the_key_and_the_range(node, message):
    with pytest.raises(ConfigError, match=message):
        load_algorithm_config(node)


def test_hydra_config_composes_verl_with_the_new_nodes():
    register_structured_configs()
    with initialize_config_dir(config_dir=os.path.abspath(CONFIG_DIR), version_base=None):
        cfg = compose(config_name="verl_ext", overrides=["algorithm.gepo.alpha_low=0.4",
                                                         "algorithm.adv_estimator=gepo"])
        assert cfg.algorithm.gepo.alpha_low == 0.4 and cfg.algorithm.gepo.alpha_high == 0.2
        assert cfg.algorithm.edge_grpo.entropy_eps == EdgeGrpoConfig().entropy_eps
        assert "actor_rollout_ref" in cfg and cfg.trainer.use_v1 in (True, False)  # verl's own config is there
        assert load_algorithm_config(cfg.algorithm).gepo == GepoConfig(alpha_low=0.4)
        with pytest.raises(Exception, match="alpha_low"):  # typed by the dataclass: not a float
            compose(config_name="verl_ext", overrides=["algorithm.gepo.alpha_low=abc"])


def test_start_up_validation_rejects_bad_values_and_combinations():
    register_structured_configs()
    with initialize_config_dir(config_dir=os.path.abspath(CONFIG_DIR), version_base=None):
        cfg = compose(config_name="verl_ext", overrides=["algorithm.gepo.alpha_high=0.9"])
        with pytest.raises(ConfigError, match="alpha_high=0.9"):
            validate_run_config(cfg)
        cfg = compose(config_name="verl_ext", overrides=["algorithm.adv_estimator=gepo",
                                                         "algorithm.gepo.logprob_source=rollout",
                                                         "actor_rollout_ref.rollout.calculate_log_probs=false"])
        with pytest.raises(ConfigError, match="calculate_log_probs"):
            validate_run_config(cfg)
        cfg = compose(config_name="verl_ext")
        validate_run_config(cfg)
        assert OmegaConf.select(cfg, "algorithm.adv_estimator") == "edge_grpo"


# ---------------------------------------------------------------- paper presets


def _compose(name, overrides=()):
    register_structured_configs()
    with initialize_config_dir(config_dir=os.path.abspath(CONFIG_DIR), version_base=None):
        return compose(config_name=name, overrides=list(overrides))


def _verl_accepts(cfg):
    """verl's own start-up validation and the actor/optimizer dataclasses its workers build."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    import verl_ext.plugin  # noqa: F401  (lr_scheduler_type=linear, as in every verl process)

    assert not need_reference_policy(cfg) and not need_critic(cfg)  # no KL: no reference model
    validate_config(cfg, use_reference_policy=False, use_critic=False)
    return omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)


def test_edge_grpo_paper_preset_is_the_papers_setting():
    """docs/edge-grpo.md's original setup mapped to verl, value by value."""
    from verl_ext.rollout.gec import first_generation_budget

    cfg = _compose("edge_grpo_paper")
    algo, data = cfg.algorithm, cfg.data
    actor, rollout = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
    # method: EDA + GEC with the official code's branch probabilities, cue and template
    assert algo.adv_estimator == "edge_grpo" and algo.gec.enable is True and algo.gec.mode == "gec"
    ext = validate_run_config(cfg)
    assert ext.gec == GecConfig(enable=True) and ext.edge_grpo == EdgeGrpoConfig()
    # sampling: 8 responses per prompt at T=0.6, top_p 1.0
    assert rollout.n == 8 and rollout.temperature == 0.6 and rollout.top_p == 1.0 and rollout.do_sample is True
    # lengths: prompt 512; 1024 first-rollout tokens + 256 continuation (+ Qwen2.5's 7 cue tokens)
    assert data.max_prompt_length == 512 and rollout.prompt_length == 512
    assert algo.gec.max_continuation_tokens == 256
    assert rollout.response_length == data.max_response_length == 1024 + 7 + 256
    assert first_generation_budget(ext.gec, rollout.response_length, cue_tokens=7, answer_tokens=30) == 1024
    # optimiser: lr 1e-6, linear decay, no warm-up, weight decay 0, grad clip 1.0
    optim = actor.optim
    assert optim.lr == 1e-6 and optim.lr_scheduler_type == "linear"
    assert optim.lr_warmup_steps == 0 and optim.lr_warmup_steps_ratio == 0.0
    assert optim.weight_decay == 0.0 and optim.clip_grad == 1.0
    # no KL, no entropy bonus
    assert actor.use_kl_loss is False and algo.use_kl_in_reward is False and actor.entropy_coeff == 0
    # one mini-batch and one epoch per step: the ratio stays 1
    assert actor.ppo_epochs == 1 and actor.ppo_mini_batch_size == data.train_batch_size
    assert actor.loss_agg_mode == "seq-mean-token-mean"
    # one pass over the data
    assert cfg.trainer.total_epochs == 1 and cfg.trainer.total_training_steps is None
    # validation: T=0.1, sampled, one response (up to response_length: verl has no separate validation length)
    val = rollout.val_kwargs
    assert val.temperature == 0.1 and val.do_sample is True and val.n == 1 and val.top_p == 1.0
    # throughput batch by default; the paper's single prompt per step is one override and the mini-batch follows
    assert data.train_batch_size == 16
    paper_batch = _compose("edge_grpo_paper", ["data.train_batch_size=1"])
    assert paper_batch.actor_rollout_ref.actor.ppo_mini_batch_size == 1
    for c in (cfg, paper_batch):
        actor_dc = _verl_accepts(c)
        assert actor_dc.optim.lr_scheduler_type == "linear" and actor_dc.loss_agg_mode == "seq-mean-token-mean"


def test_gepo_paper_preset():
    cfg = _compose("gepo_paper")
    algo, actor, rollout = cfg.algorithm, cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
    ext = validate_run_config(cfg)
    assert algo.adv_estimator == "gepo" and ext.gepo == GepoConfig()  # the paper's alpha/beta/gamma, token_mean
    assert (ext.gepo.alpha_low, ext.gepo.alpha_high, ext.gepo.beta_low, ext.gepo.beta_high, ext.gepo.ema_gamma) == (
        0.5, 0.2, 0.2, 0.3, 0.01)
    assert ext.gepo.stats_scope == "global" and ext.gepo.logprob_source == "old" and ext.gec.enable is False
    assert algo.norm_adv_by_std_in_grpo is True
    # K = 16 rollouts, 16 groups per step (INFERRED), one on-policy update, no KL, no entropy bonus
    assert rollout.n == 16 and cfg.data.train_batch_size == 16 and actor.ppo_mini_batch_size == 16
    assert actor.ppo_epochs == 1 and actor.use_kl_loss is False and algo.use_kl_in_reward is False
    assert actor.entropy_coeff == 0
    _verl_accepts(cfg)


def test_generic_gpu_base_runs_groups():
    cfg = _compose("verl_ext")
    assert cfg.actor_rollout_ref.rollout.n == 8 and cfg.algorithm.gec.enable is False
    validate_run_config(cfg)
    _verl_accepts(cfg)


# ---------------------------------------------------------------- start-up refusals


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["actor_rollout_ref.rollout.n=1"],
         r"actor_rollout_ref\.rollout\.n=1 is invalid with algorithm\.adv_estimator=edge_grpo"),
        (["algorithm.adv_estimator=gepo", "actor_rollout_ref.rollout.n=1"],
         r"actor_rollout_ref\.rollout\.n=1 is invalid with algorithm\.adv_estimator=gepo"),
        (["algorithm.adv_estimator=grpo", "algorithm.gec.enable=true", "actor_rollout_ref.rollout.n=1"],
         r"actor_rollout_ref\.rollout\.n=1 is invalid with algorithm\.gec\.enable=true"),
        (["algorithm.gec.enable=true", "actor_rollout_ref.rollout.agent.default_agent_loop=single_turn_agent"],
         r"default_agent_loop='single_turn_agent' with algorithm\.gec\.enable=true"),
        (["algorithm.gec.enable=true", "algorithm.rollout_correction.rollout_is=token"],
         r"algorithm\.gec\.enable=true cannot be combined with algorithm\.rollout_correction\.rollout_is='token'"),
        (["algorithm.gec.enable=true", "algorithm.rollout_correction.rollout_rs=seq_mean_k3"],
         r"cannot be combined with algorithm\.rollout_correction\.rollout_rs='seq_mean_k3'"),
        (["algorithm.adv_estimator=grpo", "algorithm.gec.enable=true", "algorithm.rollout_correction.bypass_mode=true"],
         r"cannot be combined with algorithm\.rollout_correction\.bypass_mode=true"),
        (["algorithm.adv_estimator=gepo", "algorithm.gec.enable=true", "algorithm.gepo.logprob_source=rollout"],
         r"cannot be combined with algorithm\.gepo\.logprob_source=rollout"),
        (["algorithm.rollout_correction.bypass_mode=true"], r"edge_grpo needs the per-token entropy"),
    ],
)
def test_start_up_refuses_settings_that_turn_a_method_off(overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate_run_config(_compose("verl_ext", overrides))


def test_start_up_allows_what_is_fine():
    validate_run_config(_compose("verl_ext", ["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=1"]))
    validate_run_config(_compose("verl_ext", ["algorithm.adv_estimator=gepo", "algorithm.gepo.logprob_source=rollout"]))
    validate_run_config(_compose("verl_ext", ["algorithm.rollout_correction.rollout_is=token"]))  # GEC off


def _parquet(path, agent_names):
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns = {"prompt": [f"q{i}" for i in range(len(agent_names))]}
    if agent_names and agent_names[0] is not ...:
        columns["agent_name"] = list(agent_names)
    pq.write_table(pa.table(columns), str(path))
    return str(path)


def test_gec_refused_when_data_routes_rows_to_another_agent_loop(tmp_path):
    plain = _parquet(tmp_path / "plain.parquet", [...] * 3)  # no agent_name column
    ours = _parquet(tmp_path / "ours.parquet", ["gec_agent"] * 3)
    tool = _parquet(tmp_path / "tool.parquet", ["gec_agent", "tool_agent", "tool_agent"])
    missing = str(tmp_path / "not_written_yet.parquet")
    gec_on = ["algorithm.gec.enable=true"]
    validate_run_config(_compose("verl_ext", gec_on + [f"data.train_files=[{plain},{ours},{missing}]"]))
    with pytest.raises(ConfigError, match=r"data\.train_files .*tool\.parquet has an agent_name column that sends 2 "
                                          r"of 3 rows to \['tool_agent'\]"):
        validate_run_config(_compose("verl_ext", gec_on + [f"data.train_files=[{ours},{tool}]"]))
    with pytest.raises(ConfigError, match="tool_agent"):
        validate_run_config(_compose("verl_ext", gec_on + [f"data.train_files={tool}"]))  # a single path
    validate_run_config(_compose("verl_ext", [f"data.train_files={tool}"]))  # GEC off: routing is the user's


def test_main_refuses_before_starting_anything():
    from verl_ext.main import run

    with pytest.raises(ConfigError, match=r"rollout\.n=1"):
        run(_compose("edge_grpo_paper", ["actor_rollout_ref.rollout.n=1"]))


def _rows_parquet(path, rows):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), str(path))
    return str(path)


def _row(gt="5", solution=None, sampling=None):
    extra = {"index": 0, "solution": solution, "sampling_params": sampling}
    return {"prompt": "q", "reward_model": {"style": "rule", "ground_truth": gt}, "extra_info": extra}


def test_gec_with_a_reward_model_is_refused_at_start_up():
    """with a custom reward function too: verl passes it the reward model's router, the agent loop cannot"""
    rm = ["algorithm.gec.enable=true", "reward.reward_model.enable=true"]
    for more in ([], ["reward.custom_reward_function.path=/some/reward.py"]):
        with pytest.raises(ConfigError, match=r"algorithm\.gec\.enable=true with reward\.reward_model\.enable=true"):
            validate_run_config(_compose("verl_ext", [*rm, *more]))
    validate_run_config(_compose("verl_ext", ["reward.reward_model.enable=true"]))  # GEC off: verl's business


def test_unknown_row_sampling_params_in_local_data_are_refused_at_start_up(tmp_path):
    """The gec_agent loop applies a row's extra_info.sampling_params with GEC on or off, in training and validation:
    a typo is refused before anything starts (parquet structs give every row every key: unset ones are None)."""
    good = _rows_parquet(tmp_path / "good.parquet", [_row(sampling={"temperature": 0.0}), _row()])
    typo = _rows_parquet(tmp_path / "typo.parquet", [_row(), _row(sampling={"temprature": 0.0})])
    validate_run_config(_compose("verl_ext", [f"data.train_files={good}", f"data.val_files={good}"]))
    for key in ("train_files", "val_files"):
        for gec_on in ("true", "false"):
            with pytest.raises(ConfigError, match=rf"data\.{key} .*typo\.parquet: 1 of 2 rows set unknown "
                                                  r"extra_info\.sampling_params key\(s\) \(row 1: \['temprature'\]\)"):
                validate_run_config(_compose("verl_ext", [f"data.{key}={typo}", f"algorithm.gec.enable={gec_on}"]))
    # another agent loop never reads the key
    validate_run_config(_compose("verl_ext", [f"data.train_files={typo}",
                                              "actor_rollout_ref.rollout.agent.default_agent_loop=single_turn_agent"]))


def test_training_rows_without_ground_truth_that_can_draw_the_answer_are_refused_at_start_up(tmp_path):
    gec_on = "algorithm.gec.enable=true"
    bare = _rows_parquet(tmp_path / "bare.parquet", [_row(), _row(gt=None), _row(gt=None, solution="2+3=5")])
    with pytest.raises(ConfigError, match=r"data\.train_files .*bare\.parquet: 2 of 3 rows \(first: row 1\) have no "
                                          r"reward_model\.ground_truth.*algorithm\.gec\.p_answer=0\.25"):
        validate_run_config(_compose("verl_ext", [gec_on, f"data.train_files={bare}"]))
    no_answer = ["algorithm.gec.p_reflect=0.5", "algorithm.gec.p_answer=0.0", "algorithm.gec.p_solution=0.5"]
    with pytest.raises(ConfigError, match=r"1 of 3 rows \(first: row 1\).*falls back to the answer"):
        validate_run_config(_compose("verl_ext", [gec_on, *no_answer, f"data.train_files={bare}"]))
    for fine in (["algorithm.gec.p_reflect=1.0", "algorithm.gec.p_answer=0.0", "algorithm.gec.p_solution=0.0"],
                 ["algorithm.gec.mode=force_reflect"], ["algorithm.gec.enable=false"]):
        validate_run_config(_compose("verl_ext", [gec_on, *fine, f"data.train_files={bare}"]))
    validate_run_config(_compose("verl_ext", [gec_on, f"data.val_files={bare}"]))  # validation is never corrected


def test_max_error_frac_is_a_fraction():
    with pytest.raises(ConfigError, match=r"algorithm\.gec\.max_error_frac=1\.5 is invalid"):
        validate_run_config(_compose("verl_ext", ["algorithm.gec.max_error_frac=1.5"]))


def test_files_without_the_column_are_left_to_the_loader(tmp_path):
    """A file with no reward_model / extra_info column at all (a custom dataset class may add them) is not refused."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = str(tmp_path / "prompts_only.parquet")
    pq.write_table(pa.table({"prompt": ["q1", "q2"]}), path)
    validate_run_config(_compose("verl_ext", ["algorithm.gec.enable=true", f"data.train_files={path}"]))


R3_SETTINGS = [
    (["actor_rollout_ref.rollout.enable_rollout_routing_replay=true"],
     r"actor_rollout_ref\.rollout\.enable_rollout_routing_replay=true"),
    (["+actor_rollout_ref.actor.megatron.router_replay.mode=R3"],
     r"actor_rollout_ref\.actor\.megatron\.router_replay\.mode=R3"),
    (["+actor_rollout_ref.actor.veomni.router_replay.mode=R3"],
     r"actor_rollout_ref\.actor\.veomni\.router_replay\.mode=R3"),
]


@pytest.mark.parametrize("r3, named", R3_SETTINGS)
@pytest.mark.parametrize("mode", [[], ["algorithm.gec.mode=force_reflect"]])
def test_gec_with_rollout_router_replay_is_refused_at_start_up(r3, named, mode):
    """Injected answer/solution tokens carry no routing (and a reflection's can be incomplete): verl zero-fills it and
    R3 replays expert 0 for them."""
    with pytest.raises(ConfigError, match=rf"algorithm\.gec\.enable=true cannot be combined with {named}"):
        validate_run_config(_compose("verl_ext", ["algorithm.gec.enable=true", *mode, *r3]))
    validate_run_config(_compose("verl_ext", r3))  # GEC off: verl's business
    validate_run_config(_compose("verl_ext", ["algorithm.gec.enable=true",
                                              "+actor_rollout_ref.actor.megatron.router_replay.mode=R2"]))


# ---------------------------------------------------------------- mode=hint (docs/hints.md)

# every GEC key's default before mode=hint came: the hint keys leave them as they were
GEC_DEFAULTS_BEFORE_HINTS = {
    "enable": False, "mode": "gec", "p_reflect": 0.5, "p_answer": 0.25, "p_solution": 0.25,
    "cue": " Wait! Something is wrong here.", "correct_threshold": 1.0, "max_continuation_tokens": 256,
    "prompt_length_gate": 256, "mask_injected": False, "solution_key": "solution", "seed": 0, "min_own_tokens": 0,
    "max_error_frac": 0.0, "edit_scope": "all", "prefix_advantage": "after", "injected_loss": "policy",
    "shaping_gamma": None, "group_wait_s": None,
}


def test_the_hint_keys_defaults_and_every_other_gec_default_unchanged():
    cfg = load_algorithm_config(None).gec
    assert {k: getattr(cfg, k) for k in GEC_DEFAULTS_BEFORE_HINTS} == GEC_DEFAULTS_BEFORE_HINTS
    assert (cfg.hint_levels, cfg.hint_warmup_steps, cfg.hint_placement, cfg.hint_scope, cfg.hint_rule) == (
        [0.25, 0.5, 0.75], 0, "assistant_prefix", "one", "math")
    assert "{hint}" in cfg.hint_template and cfg.hint_template.startswith("\nThe following text is the beginning")
    hinted = load_algorithm_config({"gec": {"mode": "hint", "hint_levels": [0.5, 1],
                                            "hint_scope": "all", "hint_placement": "user", "hint_rule": "toy",
                                            "hint_warmup_steps": 50, "hint_template": "\nHint: {hint}"}}).gec
    assert hinted.mode == "hint" and hinted.hint_levels == [0.5, 1.0] and hinted.answer_drawable() is None


@pytest.mark.parametrize(
    "node, message",
    [
        ({"mode": "hints"}, r"algorithm\.gec\.mode='hints' is invalid: must be one of \['gec', 'force_reflect', 'hint'\]"),
        ({"hint_levels": []}, r"algorithm\.gec\.hint_levels=\[\] is invalid: must be a non-empty list of increasing"),
        ({"hint_levels": [0.5, 0.25]}, r"algorithm\.gec\.hint_levels=\[0\.5, 0\.25\] is invalid"),
        ({"hint_levels": [0.5, 0.5]}, r"algorithm\.gec\.hint_levels=\[0\.5, 0\.5\] is invalid"),
        ({"hint_levels": [0.0, 0.5]}, r"algorithm\.gec\.hint_levels=\[0\.0, 0\.5\] is invalid.*\(0, 1\]"),
        ({"hint_levels": [0.5, 1.5]}, r"algorithm\.gec\.hint_levels=\[0\.5, 1\.5\] is invalid"),
        ({"hint_levels": [True]}, r"algorithm\.gec\.hint_levels=\[True\] is invalid"),
        ({"hint_levels": 0.5}, r"algorithm\.gec\.hint_levels=0\.5 is invalid"),
        ({"hint_warmup_steps": -1}, r"algorithm\.gec\.hint_warmup_steps=-1 is invalid: must be an integer >= 0"),
        ({"hint_warmup_steps": 2.5}, r"algorithm\.gec\.hint_warmup_steps=2\.5 is invalid"),
        ({"hint_placement": "system"}, r"algorithm\.gec\.hint_placement='system'.*\['assistant_prefix', 'user'\]"),
        ({"hint_template": "Hint: {answer}"}, r"algorithm\.gec\.hint_template='Hint: \{answer\}' is invalid: "
                                              r"must contain the placeholder \{hint\}"),
        ({"hint_scope": "some"}, r"algorithm\.gec\.hint_scope='some' is invalid: must be one of \['one', 'all'\]"),
        ({"hint_rule": "gsm8k"}, r"algorithm\.gec\.hint_rule='gsm8k' is invalid: must be one of \['math', 'toy'\]"),
    ],
)
def test_the_hint_keys_are_validated_with_errors_that_name_them(node, message):
    with pytest.raises(ConfigError, match=message):
        load_algorithm_config({"gec": {"mode": "hint", **node}})


def test_mode_hint_waits_at_the_group_barrier_so_group_wait_s_applies_to_it():
    assert load_algorithm_config({"gec": {"mode": "hint", "group_wait_s": 30}}).gec.group_wait_s == 30
    with pytest.raises(ConfigError, match=r"algorithm\.gec\.group_wait_s=30 is invalid"):
        load_algorithm_config({"gec": {"group_wait_s": 30}})  # mode gec, edit_scope all: still refused
    with pytest.raises(ConfigError, match=r"algorithm\.gec\.injected_loss='shaped'.*mode=hint"):
        load_algorithm_config({"gec": {"mode": "hint", "injected_loss": "shaped"}})  # nothing injected to shape


HINT_ON = ["algorithm.gec.enable=true", "algorithm.gec.mode=hint"]


def test_mode_hint_runs_with_gec_on_and_what_cannot_be_right_is_refused():
    """The gec_agent loop runs mode=hint (tests/unit/test_hints_loop.py), so GEC on with it starts. A hinted row holds
    only the policy's sampled tokens: the rollout log-prob users and router replay GEC refuses for its injected tokens
    are fine; a credit option, which credits the tokens around an edit, is refused; the legacy trainer's group
    barrier needs whole groups per agent-loop worker, as under edit_scope=all_wrong_groups."""
    assert load_algorithm_config({"gec": {"enable": True, "mode": "hint"}}).gec.mode == "hint"
    validate_run_config(_compose("verl_ext", HINT_ON))
    for sampled_only in (["algorithm.rollout_correction.rollout_is=token",
                          "actor_rollout_ref.rollout.calculate_log_probs=true"],
                         ["actor_rollout_ref.rollout.enable_rollout_routing_replay=true"]):
        validate_run_config(_compose("verl_ext", [*HINT_ON, *sampled_only]))
        with pytest.raises(ConfigError, match="algorithm.gec.enable=true cannot be combined with"):
            validate_run_config(_compose("verl_ext", ["algorithm.gec.enable=true", *sampled_only]))
    with pytest.raises(ConfigError, match=r"algorithm\.gec\.prefix_advantage='zero' is invalid: .*mode=hint edits no"):
        validate_run_config(_compose("verl_ext", [*HINT_ON, "algorithm.gec.prefix_advantage=zero"]))
    with pytest.raises(ConfigError, match=r"algorithm\.gec\.mode=hint with data\.train_batch_size=16 and .*num_workers=3"):
        validate_run_config(_compose("verl_ext", [*HINT_ON, "trainer.use_v1=false", "data.train_batch_size=16",
                                                  "actor_rollout_ref.rollout.agent.num_workers=3"]))


def test_the_hint_keys_compose_from_the_command_line():
    cfg = _compose("verl_ext", ["algorithm.gec.mode=hint",
                                "algorithm.gec.hint_levels=[0.5,1.0]", "algorithm.gec.hint_scope=all"])
    gec_cfg = load_algorithm_config(cfg.algorithm).gec
    assert (gec_cfg.mode, gec_cfg.hint_levels, gec_cfg.hint_scope) == ("hint", [0.5, 1.0], "all")
    with pytest.raises(ConfigError, match=r"algorithm\.gec\.hint_placement='prefix'"):
        validate_run_config(_compose("verl_ext", ["algorithm.gec.mode=hint", "algorithm.gec.hint_placement=prefix"]))
