"""The start-up checks that span verl's and verl_ext's keys: ``validate_run_config`` (``python -m verl_ext.main`` and
``python -m verl_ext.dry_run`` run it before verl's own ``validate_config``, before Ray starts).

verl_ext's own nodes are validated by their dataclasses (``verl_ext.config``); this module checks how they combine
with verl's settings (rollout.n, agent loops, rollout correction, filter_groups, ...) and with the run's data
(``verl_ext.data_checks``). A refused combination is a ``ConfigError`` naming both settings and why.
"""

from __future__ import annotations

import logging
from typing import Any

from verl_ext.batch_split import check_engine_batch_split, runs_training
from verl_ext.config import ConfigError, ExtAlgorithmConfig, _check, config_value, load_algorithm_config
from verl_ext.data_checks import check_gec_data, check_hint_prompt_budget, data_agent_names
from verl_ext.names import ADV_ESTIMATORS, GEC_AGENT_NAME
from verl_ext.trainer.v1_replay import has_custom_sampler, sampler_settings

logger = logging.getLogger(__name__)


def validate_entropy_grad(config: Any) -> None:
    """Start-up checks of ``algorithm.edge_grpo.entropy_grad=true`` against the rest of the run's config.

    The gradient through H_i(θ) lives in the actor loss that verl_ext's trainers install on verl's engine workers
    (both trainers use them), so it needs adv_estimator=edge_grpo and verl's PPO loss (no distillation loss).
    """
    algo = config_value(config, "algorithm")
    if not load_algorithm_config(algo).edge_grpo.entropy_grad:
        return
    key = "algorithm.edge_grpo.entropy_grad"
    estimator = str(config_value(algo, "adv_estimator", ""))
    _check(estimator == "edge_grpo", key, True,
           f"applies to algorithm.adv_estimator=edge_grpo only (got {estimator!r}); set it to false")
    _check(not config_value(config, "distillation.enabled", False), key, True,
           "cannot be combined with distillation.enabled=true (the distillation loss replaces the PPO loss)")


def check_gec_reward(config: Any) -> None:
    """GEC scores the first response inside the agent loop with verl's reward manager; with a reward model on,
    verl's reward loop builds that manager with the reward model's router (``RewardLoopWorker``), which no agent loop
    is given (and a colocated reward model sleeps during rollout), so GEC would decide right/wrong with another
    scorer than the final reward's: refused."""
    if config_value(config, "reward.reward_model.enable", False):
        raise ConfigError(
            "algorithm.gec.enable=true with reward.reward_model.enable=true: GEC scores the first response inside the "
            "agent loop, where verl's reward model (its router, which verl's reward loop hands the reward manager and "
            "any reward.custom_reward_function) cannot be reached, so the first score would come from another scorer "
            "than the final one; use a rule reward (reward.reward_model.enable=false, optionally "
            "reward.custom_reward_function.path), or algorithm.gec.enable=false")


# verl 0.9.1's rate_limited reward manager: reward.timeout, 300 s unless set (RateLimitedRewardManager.__init__)
RATE_LIMITED_REWARD_TIMEOUT_S = 300.0


def check_gec_group_wait(config: Any, ext: ExtAlgorithmConfig) -> None:
    """``algorithm.gec.group_wait_s`` against the time limits verl 0.9.1 puts on a sample's first attempt. Its
    generation has none (``LLMServerClient.generate`` awaits the server without a timeout; the async modes' client
    resends an aborted request across weight syncs without end) and its scoring none either, except the
    ``rate_limited`` reward manager's ``reward.timeout`` on each score (GEC scores the first attempt with the same
    manager): a wait no longer than that could fail a group whose sibling is only being scored."""
    if not ext.gec.enable:
        return
    wait = ext.gec.group_wait_s
    manager = config_value(config, "reward.reward_manager", {})
    if wait is None or config_value(manager, "source", "register") != "register" or (
            config_value(manager, "name", None) != "rate_limited"):
        return
    limit = float(config_value(config, "reward.timeout", RATE_LIMITED_REWARD_TIMEOUT_S))
    if wait <= limit:
        raise ConfigError(
            f"algorithm.gec.group_wait_s={wait:g} with reward.reward_manager.name=rate_limited and reward.timeout="
            f"{limit:g}: a wrong first attempt waits for its siblings' first attempts, and scoring one of them alone "
            f"may take reward.timeout, so healthy groups would fail; set group_wait_s above {limit:g} or to null (no "
            "limit, as verl's rollout)")


def bypass_mode(config: Any) -> bool:
    """``algorithm.rollout_correction.bypass_mode`` of a run config (read as verl reads it): verl then takes the
    rollout's log-probs as ``old_log_probs`` and skips the old-log-prob pass, and with it the per-token entropy."""
    return bool(config_value(config, "algorithm.rollout_correction.bypass_mode", False))


def needs_entropy(estimator: str, ext: ExtAlgorithmConfig) -> bool:
    """Whether ``estimator`` with these settings reads the old-log-prob pass's per-token entropy."""
    return estimator == "edge_grpo" or (
        estimator == "gepo" and (ext.gepo.base == "edge_grpo" or ext.gepo.entropy_estimator == "full_entropy"))


def check_entropy_grad(config: Any, ext: ExtAlgorithmConfig) -> None:
    """:func:`validate_entropy_grad`, as a start-up check."""
    validate_entropy_grad(config)


def check_estimator_settings(config: Any, ext: ExtAlgorithmConfig) -> None:
    """verl_ext's estimators against the settings they cannot run with: bypass mode where the estimator reads the
    old-log-prob pass's entropy, ``gepo.logprob_source=rollout`` without rollout log-probs, groups of one."""
    estimator = str(config_value(config, "algorithm.adv_estimator", ""))
    bypass = bypass_mode(config)
    if bypass and needs_entropy(estimator, ext):
        what = estimator if estimator == "edge_grpo" else (
            f"gepo with base={ext.gepo.base} and entropy_estimator={ext.gepo.entropy_estimator}")
        raise ConfigError(
            f"algorithm.adv_estimator={what} needs the per-token entropy of the old-log-prob pass, which "
            "algorithm.rollout_correction.bypass_mode=true skips; turn bypass_mode off (or, for gepo, use a "
            "log-prob entropy_estimator such as token_mean with a base other than edge_grpo)"
        )
    if estimator == "gepo" and ext.gepo.logprob_source == "rollout" and not (
        config_value(config, "actor_rollout_ref.rollout.calculate_log_probs", False) or bypass
    ):
        raise ConfigError(
            "algorithm.gepo.logprob_source=rollout needs actor_rollout_ref.rollout.calculate_log_probs=true"
        )
    n = int(config_value(config, "actor_rollout_ref.rollout.n", 1))
    if runs_training(config) and estimator in ADV_ESTIMATORS and n < 2:  # both are group-relative
        raise ConfigError(
            f"actor_rollout_ref.rollout.n={n} is invalid with algorithm.adv_estimator={estimator}: the advantage is "
            "relative to a group of rollout.n responses per prompt and a group of one has advantage = raw reward "
            "(EDGE-GRPO samples 8, GEPO 16); set actor_rollout_ref.rollout.n >= 2"
        )


def check_gec_agent_data(config: Any, ext: ExtAlgorithmConfig) -> None:
    """The rows the ``gec_agent`` loop would fail on only at rollout (``verl_ext.data_checks.check_gec_data``)."""
    if config_value(config, "actor_rollout_ref.rollout.agent.default_agent_loop") == GEC_AGENT_NAME or ext.gec.enable:
        check_gec_data(config, ext.gec)
    check_hint_prompt_budget(config, ext.gec)


def check_gec_setup(config: Any, ext: ExtAlgorithmConfig) -> None:
    """GEC on: its scorer, groups, agent loop and data routing, and nothing that reads the rollout log-probs of the
    tokens it injects (they carry 0.0) unless ``gec.mask_injected`` takes them out of the response mask."""
    gec = ext.gec
    if not gec.enable:
        return
    check_gec_reward(config)
    rollout = config_value(config, "actor_rollout_ref.rollout", {})
    n = int(config_value(rollout, "n", 1))
    if n < 2:
        raise ConfigError(
            f"actor_rollout_ref.rollout.n={n} is invalid with algorithm.gec.enable=true: GEC corrects wrong responses "
            "so that all-wrong groups get a learning signal, which needs groups; set actor_rollout_ref.rollout.n >= 2"
        )
    default_loop = config_value(rollout, "agent.default_agent_loop")
    if default_loop != GEC_AGENT_NAME:
        raise ConfigError(
            f"actor_rollout_ref.rollout.agent.default_agent_loop={default_loop!r} with algorithm.gec.enable=true: GEC "
            f"runs only in the {GEC_AGENT_NAME!r} agent loop; set default_agent_loop={GEC_AGENT_NAME} (verl_ext's "
            "configs do) or algorithm.gec.enable=false"
        )
    for path, counts in data_agent_names(config_value(config, "data.train_files", None)).items():
        other = {k: v for k, v in counts.items() if k != GEC_AGENT_NAME}
        if other:
            raise ConfigError(
                f"data.train_files {path} has an agent_name column that sends {sum(other.values())} of "
                f"{sum(counts.values())} rows to {sorted(map(str, other))} (verl prefers that column over "
                f"actor_rollout_ref.rollout.agent.default_agent_loop), so algorithm.gec.enable=true would never "
                f"correct them; drop the column or set it to {GEC_AGENT_NAME!r}, or set algorithm.gec.enable=false"
            )
    estimator = str(config_value(config, "algorithm.adv_estimator", ""))
    rollout_corr = config_value(config, "algorithm.rollout_correction", {})
    uses_rollout_logprobs = [
        key for key, on in (
            ("algorithm.rollout_correction.bypass_mode=true", bypass_mode(config)),
            (f"algorithm.rollout_correction.rollout_is={config_value(rollout_corr, 'rollout_is', None)!r}",
             config_value(rollout_corr, "rollout_is", None) is not None),
            (f"algorithm.rollout_correction.rollout_rs={config_value(rollout_corr, 'rollout_rs', None)!r}",
             config_value(rollout_corr, "rollout_rs", None) is not None),
            ("algorithm.gepo.logprob_source=rollout", estimator == "gepo" and ext.gepo.logprob_source == "rollout"),
        ) if on
    ]
    # masked tokens are out of the loss, IS/RS and H_g; mode=hint injects none (its rows hold only sampled tokens)
    if uses_rollout_logprobs and not gec.mask_injected and gec.mode != "hint":
        raise ConfigError(
            f"algorithm.gec.enable=true cannot be combined with {', '.join(uses_rollout_logprobs)}: these use the "
            "rollout engine's log-probs as the behaviour policy, and the tokens GEC injects (cue, answer template, "
            "reference solution) were never sampled, so their rollout log-prob is 0.0; turn them off (the loss then "
            "uses the recomputed old_log_probs, as the original does), set algorithm.gec.mask_injected=true (the "
            "injected tokens leave the response mask) or set algorithm.gec.enable=false"
        )


def validate_run_config(config: Any) -> ExtAlgorithmConfig:
    """Start-up checks of a composed run config (verl's ppo_trainer plus verl_ext's nodes); returns the ext config.

    Runs :data:`STARTUP_CHECKS` in order. Each refuses, with a ConfigError naming the settings and a value that
    works, either a combination that would silently turn a verl_ext method off or corrupt it (only while a verl_ext
    feature is on: a run of verl's own estimators that verl accepts is never refused here), or batch sizes verl's
    engine would stop on later, in a worker (:func:`check_engine_batch_split`). ``python -m verl_ext.main`` (and
    its dry run) calls this one function.
    """
    ext = load_algorithm_config(config_value(config, "algorithm"))
    for check in STARTUP_CHECKS:
        check(config, ext)
    return ext


def active_features(config: Any, ext: ExtAlgorithmConfig) -> list[str]:
    """The verl_ext features this run turns on, as the settings that turn them on."""
    estimator = str(config_value(config, "algorithm.adv_estimator", ""))
    features = [f"algorithm.adv_estimator={estimator}"] if estimator in ADV_ESTIMATORS else []
    if ext.gec.enable:
        features.append("algorithm.gec.enable=true")
    return features


def check_filter_groups_trainer(config: Any, ext: ExtAlgorithmConfig) -> None:
    """DAPO dynamic sampling exists only in verl's v1 replay buffer; the legacy trainer would silently ignore it."""
    features = active_features(config, ext)
    if features and config_value(config, "algorithm.filter_groups.enable", False) and not config_value(
            config, "trainer.use_v1", True):
        raise ConfigError(
            f"algorithm.filter_groups.enable=true with trainer.use_v1=false (and {', '.join(features)}): verl's "
            "legacy trainer ignores filter_groups (DAPO dynamic sampling lives in the v1 replay buffer), so this "
            "run would silently train on unfiltered groups; set trainer.use_v1=true")


def check_v1_sampler(config: Any, ext: ExtAlgorithmConfig) -> None:
    """``trainer.v1.sampler.sampler_kwargs`` without a custom sampler: verl_ext's keys of verl's built-in replay
    buffer (``verl_ext.trainer.v1_replay``); a bad value is refused, a key nobody reads is warned about."""
    sampler = config_value(config, "trainer.v1.sampler", None)
    if not config_value(config, "trainer.use_v1", True) or sampler is None or has_custom_sampler(sampler):
        return
    try:
        _, unknown = sampler_settings(config_value(sampler, "sampler_kwargs", None))
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if unknown:
        logger.warning("trainer.v1.sampler.sampler_kwargs key(s) %s are read by no sampler: without "
                       "trainer.v1.sampler.custom_sampler verl ignores sampler_kwargs and verl_ext reads only "
                       "data_order and poll_interval", unknown)


ROLLOUT_ROUTING_KEY = "actor_rollout_ref.rollout.enable_rollout_routing_replay"
ROUTER_REPLAY_MODE_KEYS = tuple(f"actor_rollout_ref.actor.{engine}.router_replay.mode" for engine in ("megatron", "veomni"))


def rollout_router_replay_settings(config: Any) -> list[str]:
    """The settings of this run that turn on verl's rollout router replay (R3), as ``key=value``."""
    found = [f"{ROLLOUT_ROUTING_KEY}=true"] if config_value(config, ROLLOUT_ROUTING_KEY, False) else []
    return found + [f"{key}=R3" for key in ROUTER_REPLAY_MODE_KEYS if config_value(config, key, None) == "R3"]


def check_gec_router_replay(config: Any, ext: ExtAlgorithmConfig) -> None:
    """GEC's injected tokens carry no rollout routing (a reflection's can be incomplete too); verl zero-fills the
    rows and R3 replays every row but the last, so those tokens would all go to expert 0."""
    settings = rollout_router_replay_settings(config)
    if ext.gec.enable and ext.gec.mode != "hint" and settings:  # a hinted row is one generation, routed whole
        raise ConfigError(
            f"algorithm.gec.enable=true cannot be combined with {', '.join(settings)} (MoE rollout router replay, "
            f"R3): the answer template, reference solution and EOS GEC injects were never routed by the rollout "
            f"engine (nor is a reflection's cue when no continuation fits, and a first response cut without EOS "
            f"shifts the continuation's routes by one), verl fills the missing routes with zeros and R3 replays them, "
            f"so the log-prob and update passes would send those tokens to expert 0 in every top-k slot; turn R3 off "
            f"({ROLLOUT_ROUTING_KEY}=false and router_replay.mode=disabled or R2) or set algorithm.gec.enable=false")


# estimators whose advantage needs more than the group's outcomes (a critic's values): the advantage of the first
# attempts' rewards cannot be recomputed from the batch (remax, whose greedy baseline is another: check_gec_remax)
NO_PRE_CORRECTION_ADVANTAGE = ("gae",)


# injected_loss=shaped hands verl's policy loss the injected tokens with advantage 0 and trains them with its own term,
# aggregated by loss_agg_mode: right only where a token of advantage 0 adds nothing to the loss and changes no other
# token's term. verl 0.9.1's policy losses (verl/trainer/ppo/core_algos.py) where it does, each with the loss_agg_mode
# it must run with (None: the one it is given), as read there:
SHAPED_POLICY_LOSSES: dict[str, str | None] = {
    "vanilla": None,  # -A·ratio, -A·clip(ratio), dual clip -A·clip_ratio_c: all 0 at A = 0, per token
    "dppo_tv": None,  # -A·sg(truncated ratio)·log π·valid, valid per token
    "dppo_kl": None,  # the same, valid by the token's binary KL
    "gpg": None,  # -A·log π
    "cispo": None,  # -sg(clip(ratio))·A·log π
    "sapo": "seq-mean-token-mean",  # -gate(ratio)·A, but aggregated by seq-mean-token-mean whatever loss_agg_mode says
}
# refused (and any loss not listed, such as one a later verl adds): gspo (the sequence ratio, exp of the mean
# log-ratio over all the response's tokens, the injected ones included, scales and clips every token's term),
# geo_mean (one advantage per response, the mean over all its tokens, times the geometric mean ratio over all of them;
# it ignores loss_agg_mode and the global-batch normalisation), dro (-(A·log π - β/2·log-ratio²): the β term stays on
# the injected tokens), clip_cov / kl_cov (the tokens they un-clip / penalise are picked by the covariance of A and
# log π over all tokens: the injected ones shift it, take the quota, and kl_cov's +|log-ratio| can land on them),
# bypass_mode (rollout log-probs as π_old, 0.0 on injected tokens, and a rejection mask the shaped term never sees)


# verl policy losses that use one advantage per response (the mean over its tokens): a per-token credit option
# (prefix_advantage=before/zero) would be averaged into it
PER_RESPONSE_ADVANTAGE_LOSSES = ("geo_mean",)


def check_shaped_policy_loss(config: Any) -> None:
    """``injected_loss=shaped`` with a policy loss for which it is right (:data:`SHAPED_POLICY_LOSSES`)."""
    actor = "actor_rollout_ref.actor"
    loss_mode = str(config_value(config, f"{actor}.policy_loss.loss_mode", "vanilla"))
    allowed = ", ".join(SHAPED_POLICY_LOSSES)
    if loss_mode not in SHAPED_POLICY_LOSSES:
        raise ConfigError(
            f"{actor}.policy_loss.loss_mode={loss_mode} with algorithm.gec.injected_loss=shaped: the shaped loss gives "
            f"the injected tokens advantage 0 in the policy loss, which takes a token out of it only in a per-token "
            f"loss ({allowed}); in {loss_mode} they would still weigh on the other tokens' terms (or are not known "
            f"to verl_ext); use one of those loss modes, or injected_loss=policy (with or without "
            f"algorithm.gec.mask_injected=true)")
    agg_mode = SHAPED_POLICY_LOSSES[loss_mode]
    run_agg_mode = str(config_value(config, f"{actor}.loss_agg_mode", "token-mean"))
    if agg_mode is not None and run_agg_mode != agg_mode:
        raise ConfigError(
            f"{actor}.policy_loss.loss_mode={loss_mode} with algorithm.gec.injected_loss=shaped and "
            f"{actor}.loss_agg_mode={run_agg_mode}: {loss_mode} aggregates its term by {agg_mode} whatever "
            f"loss_agg_mode says, and the shaped term follows loss_agg_mode, so the two would not be one loss; set "
            f"{actor}.loss_agg_mode={agg_mode}, or use injected_loss=policy")


def check_gec_credit_options(config: Any, ext: ExtAlgorithmConfig) -> None:
    """GEC's credit options (docs/gec.md "Credit options") against the rest of the run."""
    gec = ext.gec
    options = gec.credit_options()
    if gec.enable and gec.mode == "hint":  # it waits at the group barrier whatever edit_scope says
        check_legacy_group_chunks(config, "algorithm.gec.mode=hint")
    if not options:
        return
    named = ", ".join(f"algorithm.gec.{k}={v}" for k, v in options.items())
    if not gec.enable:
        raise ConfigError(f"{named} with algorithm.gec.enable=false: the credit options apply to the responses GEC "
                          "edits; set algorithm.gec.enable=true or leave them at their defaults")
    algo = config_value(config, "algorithm")
    estimator = str(config_value(algo, "adv_estimator", ""))
    if gec.prefix_advantage == "before" and estimator in NO_PRE_CORRECTION_ADVANTAGE:
        raise ConfigError(
            f"algorithm.gec.prefix_advantage=before with algorithm.adv_estimator={estimator}: its advantage needs more "
            "than the group's rewards (a critic's values), so the advantage of the first attempts' "
            "rewards cannot be recomputed; use prefix_advantage=zero or a group estimator (grpo, rloo, edge_grpo, gepo)")
    loss_mode = str(config_value(config, "actor_rollout_ref.actor.policy_loss.loss_mode", "vanilla"))
    if gec.prefix_advantage != "after" and loss_mode in PER_RESPONSE_ADVANTAGE_LOSSES:
        raise ConfigError(
            f"algorithm.gec.prefix_advantage={gec.prefix_advantage} with actor_rollout_ref.actor.policy_loss."
            f"loss_mode={loss_mode}: the option gives a corrected response's own first-attempt tokens another "
            f"advantage than its other tokens, and {loss_mode} averages a response's advantages into one, so the "
            "option would be averaged away; use prefix_advantage=after or a per-token loss mode (vanilla, …)")
    if gec.injected_loss == "shaped":
        for key, on in (("algorithm.edge_grpo.entropy_grad=true",
                         estimator == "edge_grpo" and ext.edge_grpo.entropy_grad),
                        ("distillation.enabled=true", bool(config_value(config, "distillation.enabled", False)))):
            if on:
                raise ConfigError(
                    f"algorithm.gec.injected_loss=shaped cannot be combined with {key}: each replaces the actor's loss "
                    "(verl's set_loss_fn) and verl_ext has no loss that does both; use one of them")
        check_shaped_policy_loss(config)
    if gec.edit_scope == "all_wrong_groups":
        check_legacy_group_chunks(config, "algorithm.gec.edit_scope=all_wrong_groups")


def check_legacy_group_chunks(config: Any, setting: str) -> None:
    """The agent loop's group barrier (``setting`` uses it) on the legacy trainer: whole groups per worker."""
    if config_value(config, "trainer.use_v1", True):
        return
    prompts = int(config_value(config, "data.train_batch_size", 0) or 0)
    workers = int(config_value(config, "actor_rollout_ref.rollout.agent.num_workers", 1) or 1)
    if prompts % workers:
        raise ConfigError(
            f"{setting} with data.train_batch_size={prompts} and actor_rollout_ref.rollout.agent.num_workers="
            f"{workers}: the gec_agent loop decides a group's edits or hints in the agent-loop worker that runs it, and "
            "verl's legacy trainer "
            "splits the batch into equal chunks per worker, which would cut groups apart; make train_batch_size a "
            "multiple of agent.num_workers")


def check_gec_remax(config: Any, ext: ExtAlgorithmConfig) -> None:
    """GEC with ``adv_estimator=remax``, refused rather than handled: verl's legacy trainer sends remax's greedy
    baseline rows (copies of the prompts: their group's uid, verl_ext's training tag) through the same agent loop,
    which could tell them apart only by verl's private ``__do_sample__`` column. GEC would edit a wrong baseline (the
    baseline reward would be a corrected response's) and, under ``edit_scope=all_wrong_groups``, count it as an
    (n+1)-th first attempt of its group. (verl 0.9.1's v1 trainer generates no baseline.)"""
    estimator = str(config_value(config, "algorithm.adv_estimator", ""))
    if ext.gec.enable and estimator == "remax":
        raise ConfigError(
            "algorithm.gec.enable=true with algorithm.adv_estimator=remax: verl generates remax's greedy baseline "
            "through the same agent loop as the sampled responses, so GEC would edit the baseline (and with "
            "gec.edit_scope=all_wrong_groups count it as a member of its group); use a group estimator (grpo, rloo, "
            "edge_grpo, gepo) or algorithm.gec.enable=false")


def check_token_sum_norm_horizon(config: Any, ext: ExtAlgorithmConfig) -> None:
    """Dr.GRPO's ``seq-mean-token-sum-norm`` divides by a constant horizon, ``loss_scale_factor`` (null: the width of
    the response tensor). On verl's v1 trainer responses are jagged and padded per micro-batch, so with null each
    micro-batch is divided by its own longest response (tests/unit/test_actor_losses_cluster.py); refused there
    while a verl_ext feature is on (verl's own estimators run as verl runs them)."""
    actor = "actor_rollout_ref.actor"
    features = active_features(config, ext)
    if (features and config_value(config, "trainer.use_v1", True)
            and config_value(config, f"{actor}.loss_agg_mode", "token-mean") == "seq-mean-token-sum-norm"
            and config_value(config, f"{actor}.loss_scale_factor", None) is None):
        length = config_value(config, "data.max_response_length", None)
        raise ConfigError(
            f"{actor}.loss_agg_mode=seq-mean-token-sum-norm with {actor}.loss_scale_factor=null on the v1 trainer "
            f"(trainer.use_v1=true) and {', '.join(features)}: verl then divides each micro-batch by the length of its own longest response "
            "(v1's responses are padded per micro-batch), not by one constant horizon as Dr.GRPO does; set "
            f"{actor}.loss_scale_factor={length if length is not None else '<data.max_response_length>'} "
            "(the legacy trainer's horizon) or trainer.use_v1=false")


FEATURE_COMBINATION_CHECKS = (check_filter_groups_trainer, check_gec_router_replay, check_gec_credit_options,
                              check_gec_remax, check_token_sum_norm_horizon)

# verl_ext's start-up checks, in the order they run (validate_run_config); each takes (config, ext) and raises a
# ConfigError. Every one but check_engine_batch_split and check_v1_sampler (values of verl_ext's own keys of verl's
# replay buffer) refuses only while a verl_ext feature is on.
STARTUP_CHECKS = (*FEATURE_COMBINATION_CHECKS, check_entropy_grad, check_estimator_settings, check_gec_agent_data,
                  check_gec_setup, check_gec_group_wait, check_v1_sampler, check_engine_batch_split)


def validate_feature_combinations(config: Any, ext: ExtAlgorithmConfig | None = None) -> None:
    """Start-up refusals of combinations that would silently misbehave; raises ConfigError naming both settings."""
    ext = load_algorithm_config(config_value(config, "algorithm")) if ext is None else ext
    for check in FEATURE_COMBINATION_CHECKS:
        check(config, ext)
