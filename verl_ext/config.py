"""Configuration of verl_ext's algorithm nodes: ``algorithm.edge_grpo``, ``algorithm.gepo``, ``algorithm.gec``.

These dataclasses are the single source of defaults and validation.  ``register_structured_configs`` puts them in
Hydra's ConfigStore, and ``hydra_configs/base.yaml`` only composes them under ``algorithm`` next to verl's
own ``ppo_trainer`` config.  The start-up checks that span verl's and verl_ext's keys are
``verl_ext.run_checks.validate_run_config`` (with the data-file checks of ``verl_ext.data_checks``).  The estimators accept the ``algorithm`` node as a
DictConfig, a plain dict or verl's ``AlgoConfig`` (read through :func:`config_value`, the one key reader for all
three); a missing sub-node or key means the paper's default.  The allowed values come from ``verl_ext.names``,
which the implementing modules use too; this module imports nothing else from verl_ext but the hint-rule registry
(``verl_ext.rollout.hints``, stdlib only, imported where ``algorithm.gec.hint_rule`` is checked), whose names are the
allowed values of that key.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from verl_ext.names import (
    BASE_ADVANTAGES,
    EMA_INITS,
    ENTROPY_ESTIMATORS,
    GEC_EDIT_SCOPES,
    GEC_HINT_PLACEMENTS,
    GEC_HINT_SCOPES,
    GEC_INJECTED_LOSSES,
    GEC_MODES,
    GEC_PREFIX_ADVANTAGES,
    HINT_PLACEHOLDER,
    HINT_RULE_MATH,
    THRESHOLD_SOURCES,
)


class ConfigError(ValueError):
    """A verl_ext configuration value is out of range; the message names the key and what is allowed."""


def _check(ok: bool, key: str, value: Any, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"{key}={value!r} is invalid: {allowed}")


def _choice(key: str, value: str, options) -> None:
    _check(value in options, key, value, f"must be one of {list(options)}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _unit_interval(key: str, value: float, open_low: bool = False) -> None:
    low_ok = value > 0 if open_low else value >= 0
    _check(isinstance(value, (int, float)) and low_ok and value <= 1, key, value,
           f"must be in {'(' if open_low else '['}0, 1]")


@dataclass
class EdgeGrpoConfig:
    """Entropy-Driven Advantage (EDGE-GRPO). Defaults reproduce the official code (no clamp)."""

    entropy_eps: float = 1e-6  # a response with mean entropy <= this keeps factor 1 (and is counted)
    factor_min: float | None = None  # optional clamp of H̄_g/H_i; the official code's is commented out
    factor_max: float | None = None
    # true: back-propagate through 1/H_i(θ) in the actor loss, as the official code does; false: detached rescaling
    entropy_grad: bool = False

    def validate(self, prefix: str = "algorithm.edge_grpo") -> EdgeGrpoConfig:
        _check(self.entropy_eps >= 0, f"{prefix}.entropy_eps", self.entropy_eps, "must be >= 0")
        _check(isinstance(self.entropy_grad, bool), f"{prefix}.entropy_grad", self.entropy_grad,
               "must be true or false")
        for name in ("factor_min", "factor_max"):
            value = getattr(self, name)
            _check(value is None or value > 0, f"{prefix}.{name}", value, "must be null or > 0")
        if self.factor_min is not None and self.factor_max is not None:
            _check(self.factor_min <= self.factor_max, f"{prefix}.factor_min", self.factor_min,
                   f"must be <= {prefix}.factor_max={self.factor_max}")
        return self


@dataclass
class GepoConfig:
    """Group Entropy-Controlled Policy Optimization (docs/gepo.md): paper defaults, plus options it leaves open."""

    alpha_low: float = 0.5  # multiplier of positive advantages in low-entropy groups
    alpha_high: float = 0.2  # multiplier of negative advantages in high-entropy groups
    beta_low: float = 0.2  # H_low = mu - beta_low * sigma
    beta_high: float = 0.3  # H_high = mu + beta_high * sigma
    ema_gamma: float = 0.01  # H <- (1 - gamma) H + gamma * estimate
    enforce_alpha_order: bool = True  # the paper: alpha_high >= alpha_low causes length collapse
    entropy_estimator: str = "token_mean"  # token_mean (paper) | sum_mean (Intern-S2) | resp_mean_of_means | full_entropy
    logprob_source: str = "old"  # old (recomputed old_log_probs) | rollout (rollout_log_probs)
    std_unbiased: bool = False
    update_before_shaping: bool = True
    stats_scope: str = "global"  # global (paper) | per_data_source (extension)
    stats_include_degenerate_groups: bool = True  # zero-reward-variance groups enter mu/sigma
    base: str = "grpo"  # grpo (paper) | drgrpo (no std) | rloo (Intern-S2) | edge_grpo: shape EDA advantages
    ema_init: str = "first_batch"  # first_batch | warmup_pool: pool the first warmup_steps batches, shape none
    warmup_steps: int = 0  # batches pooled before the thresholds are seeded (ema_init=warmup_pool only)
    threshold_source: str = "ema"  # ema (paper) | window: thresholds of the pooled last window_size batches
    window_size: int = 20  # batches of group-entropy moments each scope keeps (bounded running window)
    # a resumed run whose checkpoint has no verl_ext_state.json stops; true: its thresholds start fresh instead
    allow_fresh_history: bool = False

    def validate(self, prefix: str = "algorithm.gepo") -> GepoConfig:
        _unit_interval(f"{prefix}.alpha_low", self.alpha_low)
        _unit_interval(f"{prefix}.alpha_high", self.alpha_high)
        _check(self.beta_low >= 0, f"{prefix}.beta_low", self.beta_low, "must be >= 0")
        _check(self.beta_high >= 0, f"{prefix}.beta_high", self.beta_high, "must be >= 0")
        _unit_interval(f"{prefix}.ema_gamma", self.ema_gamma, open_low=True)
        if self.enforce_alpha_order:
            _check(self.alpha_high < self.alpha_low, f"{prefix}.alpha_high", self.alpha_high,
                   f"must be < {prefix}.alpha_low={self.alpha_low} (GEPO paper: a harder low-entropy intervention "
                   f"causes length collapse); set {prefix}.enforce_alpha_order=false to run it anyway")
        _choice(f"{prefix}.entropy_estimator", self.entropy_estimator, ENTROPY_ESTIMATORS)
        _choice(f"{prefix}.logprob_source", self.logprob_source, ("old", "rollout"))
        _choice(f"{prefix}.stats_scope", self.stats_scope, ("global", "per_data_source"))
        _choice(f"{prefix}.base", self.base, (*BASE_ADVANTAGES, "edge_grpo"))
        _choice(f"{prefix}.ema_init", self.ema_init, EMA_INITS)
        _choice(f"{prefix}.threshold_source", self.threshold_source, THRESHOLD_SOURCES)
        _check(_is_int(self.window_size) and self.window_size >= 1, f"{prefix}.window_size", self.window_size,
               "must be an integer >= 1")
        _check(_is_int(self.warmup_steps) and self.warmup_steps >= 0, f"{prefix}.warmup_steps", self.warmup_steps,
               "must be an integer >= 0")
        _check(isinstance(self.allow_fresh_history, bool), f"{prefix}.allow_fresh_history", self.allow_fresh_history,
               "must be true or false")
        if self.ema_init == "warmup_pool":
            _check(self.warmup_steps >= 1, f"{prefix}.warmup_steps", self.warmup_steps,
                   f"must be >= 1 with {prefix}.ema_init=warmup_pool (the number of batches pooled before seeding)")
        else:
            _check(self.warmup_steps == 0, f"{prefix}.warmup_steps", self.warmup_steps,
                   f"only applies to {prefix}.ema_init=warmup_pool; with ema_init={self.ema_init} leave it at 0")
        return self


ANSWER_PLACEHOLDER = "{answer}"
# GHPO's words before the hint in the user turn (hkgc-1/GHPO, ghpo_trainer.py), for algorithm.gec.hint_placement=user
DEFAULT_HINT_TEMPLATE = (
    "\nThe following text is the beginning part of the answer, which you can refer to for solving the problem:\n"
    + HINT_PLACEHOLDER
)
LUFFY_SHAPING_GAMMA = 0.1  # γ of LUFFY's policy shaping f(p) = p/(p+γ) (arXiv 2504.14945)


@dataclass
class GecConfig:
    """Guided Error Correction (docs/edge-grpo.md), the +Force-R baseline and prompt-side hints (docs/hints.md);
    applied to training rollouts only.

    Each key applies to the modes its comment names and is ignored by the others (its value is still checked): the
    branch keys (``p_*``, ``cue``, ``answer_template``, ``max_continuation_tokens``, ``prompt_length_gate``,
    ``mask_injected``, ``min_own_tokens``, the credit options) to ``gec`` / ``force_reflect``; the ``hint_*`` keys to
    ``hint``. ``solution_key``, ``correct_threshold``, ``seed``, ``max_error_frac`` and ``group_wait_s`` serve both
    (mode ``hint`` always waits at the group barrier that ``edit_scope=all_wrong_groups`` uses).
    """

    enable: bool = False
    # gec (reflect / answer / solution branches) | force_reflect (cue + continuation only) | hint (a prefix of the
    # reference solution before the policy writes, in all-wrong groups: docs/hints.md)
    mode: str = "gec"
    p_reflect: float = 0.5
    p_answer: float = 0.25
    p_solution: float = 0.25
    cue: str = " Wait! Something is wrong here."
    answer_template: str = (
        "\nWait! Something is wrong here. After verification, the correct answer is \\boxed{" + ANSWER_PLACEHOLDER + "}."
    )
    correct_threshold: float = 1.0  # a response is wrong when its reward is below this
    max_continuation_tokens: int = 256
    prompt_length_gate: int | None = 256  # skip GEC for prompts with >= this many tokens (original); null: never
    mask_injected: bool = False  # original: injected tokens are trained as policy tokens
    solution_key: str = "solution"  # where the reference solution sits: extra_info[solution_key]
    seed: int = 0
    # opt-in guard, not in the paper (0: off, the paper's behaviour): a wrong response with fewer than this many
    # tokens of its own (EOS not counted) is left uncorrected (branch too_short, gec/count/too_short), so GRPO
    # penalises it instead of GEC turning an immediately-ended reply into a correct one
    min_own_tokens: int = 0
    # share of a step's GEC training rollouts whose row data GEC could not use (no ground truth for a drawn answer,
    # unknown extra_info.sampling_params keys; counted in gec/errors) above which the run stops; 0: the first one
    max_error_frac: float = 0.0
    # Credit options (docs/gec.md "Credit options"; not in the paper, whose behaviour each default keeps):
    # all: edit every wrong response | all_wrong_groups: only in groups whose first attempts are all wrong
    edit_scope: str = "all"
    # what the policy's own tokens before an edit get: after = the corrected response's advantage (the paper),
    # before = the advantage its group's pre-correction rewards give it, zero = none (masked)
    prefix_advantage: str = "after"
    # injected answer/solution tokens: policy = trained as policy tokens (the paper) | shaped = LUFFY's off-policy
    # term -Â·f(π_θ), f(p) = p/(p+shaping_gamma), no clip (arXiv 2504.14945)
    injected_loss: str = "policy"
    shaping_gamma: float | None = None  # null: LUFFY's 0.1 under injected_loss=shaped; refused under policy
    # edit_scope=all_wrong_groups: seconds a wrong first attempt waits for the rest of its group's first attempts, past
    # which it fails (its sample only); null: as long as they run, as verl itself waits for every sample of a group
    # (verl 0.9.1 puts no time limit on an agent loop's generation or scoring; docs/gec.md "Credit options")
    group_wait_s: float | None = None
    # mode=hint (docs/hints.md; verl_ext/rollout/hints.py). Levels: fractions of the reference solution's steps, tried
    # lowest first, each cut at a step end by hint_rule (never the final answer); GHPO's 25/50/75%
    hint_levels: list[float] = field(default_factory=lambda: [0.25, 0.5, 0.75])
    hint_warmup_steps: int = 0  # training steps without hints first (verl counts from 1; Scaf-GRPO: 50)
    # assistant_prefix: the assistant turn starts with the hint (prompt context, never trained) | user: hint_template
    # appended to the last user message (Scaf-GRPO, GHPO, QuestA)
    hint_placement: str = "assistant_prefix"
    hint_template: str = DEFAULT_HINT_TEMPLATE  # hint_placement=user: appended to the user turn; must hold {hint}
    # one: the lowest level whose one hinted sample is right replaces one failed member (Scaf-GRPO) | all: every
    # member regenerated at the group's level, raised while the group stays all wrong (GHPO)
    hint_scope: str = "one"
    # the cut rule (a function of the task, registered in verl_ext/rollout/hints.py): math (line and sentence ends
    # of a boxed-math solution) | toy (after each running total of verl_ext/toy's solutions)
    hint_rule: str = HINT_RULE_MATH

    def validate(self, prefix: str = "algorithm.gec") -> GecConfig:
        _choice(f"{prefix}.mode", self.mode, GEC_MODES)
        for name in ("p_reflect", "p_answer", "p_solution"):
            _unit_interval(f"{prefix}.{name}", getattr(self, name))
        total = self.p_reflect + self.p_answer + self.p_solution
        _check(abs(total - 1.0) < 1e-6, f"{prefix}.p_reflect+p_answer+p_solution", total, "must sum to 1")
        _check(ANSWER_PLACEHOLDER in self.answer_template, f"{prefix}.answer_template", self.answer_template,
               f"must contain the placeholder {ANSWER_PLACEHOLDER}")
        _check(self.max_continuation_tokens >= 0, f"{prefix}.max_continuation_tokens",
               self.max_continuation_tokens, "must be >= 0")
        _check(self.prompt_length_gate is None or self.prompt_length_gate > 0, f"{prefix}.prompt_length_gate",
               self.prompt_length_gate, "must be null or > 0")
        _check(isinstance(self.min_own_tokens, int) and not isinstance(self.min_own_tokens, bool)
               and self.min_own_tokens >= 0, f"{prefix}.min_own_tokens", self.min_own_tokens,
               "must be an integer >= 0 (0: off)")
        _unit_interval(f"{prefix}.max_error_frac", self.max_error_frac)
        _choice(f"{prefix}.edit_scope", self.edit_scope, GEC_EDIT_SCOPES)
        _choice(f"{prefix}.prefix_advantage", self.prefix_advantage, GEC_PREFIX_ADVANTAGES)
        _check(self.mode != "hint" or self.prefix_advantage == "after", f"{prefix}.prefix_advantage",
               self.prefix_advantage, f"credits the tokens before an edit, and {prefix}.mode=hint edits no response (a "
               "hinted row holds only the policy's sampled tokens); use prefix_advantage=after")
        _choice(f"{prefix}.injected_loss", self.injected_loss, GEC_INJECTED_LOSSES)
        wait = self.group_wait_s
        _check(wait is None or (isinstance(wait, (int, float)) and not isinstance(wait, bool) and 0 < wait < float("inf")),
               f"{prefix}.group_wait_s", wait, "must be null or a number of seconds > 0")
        _check(wait is None or self.edit_scope == "all_wrong_groups" or self.mode == "hint", f"{prefix}.group_wait_s",
               wait, f"applies to {prefix}.edit_scope=all_wrong_groups (or mode=hint) only and would be ignored with "
               f"edit_scope={self.edit_scope}; remove it or set edit_scope=all_wrong_groups")
        self._validate_hints(prefix)
        if self.injected_loss != "shaped":
            _check(self.shaping_gamma is None, f"{prefix}.shaping_gamma", self.shaping_gamma,
                   f"applies to {prefix}.injected_loss=shaped only and would be ignored with "
                   f"injected_loss={self.injected_loss}; remove it or set injected_loss=shaped")
        else:
            if self.shaping_gamma is None:
                self.shaping_gamma = LUFFY_SHAPING_GAMMA
            _check(isinstance(self.shaping_gamma, (int, float)) and not isinstance(self.shaping_gamma, bool)
                   and 0 < self.shaping_gamma < float("inf"), f"{prefix}.shaping_gamma", self.shaping_gamma,
                   "must be a number > 0 (LUFFY's f(p) = p/(p+gamma); 0.1 in the paper)")
            _check(not self.mask_injected, f"{prefix}.injected_loss", self.injected_loss,
                   f"has nothing to train with {prefix}.mask_injected=true (the injected tokens leave the loss); "
                   "use one of the two")
            _check(self.mode == "gec" and self.p_answer + self.p_solution > 0, f"{prefix}.injected_loss",
                   self.injected_loss, f"applies to injected answers and solutions, which {prefix}.mode={self.mode} "
                   f"with p_answer={self.p_answer}, p_solution={self.p_solution} never draws; use injected_loss=policy")
        return self

    def _validate_hints(self, prefix: str) -> None:
        """The ``hint_*`` keys (checked in every mode; used by mode ``hint`` only)."""
        levels = self.hint_levels
        _check(isinstance(levels, (list, tuple)) and len(levels) > 0
               and all(isinstance(x, (int, float)) and not isinstance(x, bool) and 0 < x <= 1 for x in levels)
               and all(a < b for a, b in zip(levels, levels[1:])), f"{prefix}.hint_levels", levels,
               "must be a non-empty list of increasing fractions in (0, 1] (of the reference solution's steps)")
        self.hint_levels = [float(x) for x in levels]
        _check(_is_int(self.hint_warmup_steps) and self.hint_warmup_steps >= 0, f"{prefix}.hint_warmup_steps",
               self.hint_warmup_steps, "must be an integer >= 0")
        _choice(f"{prefix}.hint_placement", self.hint_placement, GEC_HINT_PLACEMENTS)
        _check(isinstance(self.hint_template, str) and HINT_PLACEHOLDER in self.hint_template,
               f"{prefix}.hint_template", self.hint_template, f"must contain the placeholder {HINT_PLACEHOLDER}")
        _choice(f"{prefix}.hint_scope", self.hint_scope, GEC_HINT_SCOPES)
        from verl_ext.rollout.hints import HINT_RULES  # the rule registry (stdlib only): rules others registered too

        _choice(f"{prefix}.hint_rule", self.hint_rule, sorted(HINT_RULES))

    def credit_options(self) -> dict[str, Any]:
        """The credit options that differ from the paper's behaviour (``edit_scope``, ``prefix_advantage``,
        ``injected_loss``), as {key: value}."""
        defaults = {"edit_scope": "all", "prefix_advantage": "after", "injected_loss": "policy"}
        return {k: getattr(self, k) for k, v in defaults.items() if getattr(self, k) != v}

    def answer_drawable(self) -> str | None:
        """Which rows can draw the answer injection (and need a ground truth): "all" (p_answer > 0), "no_solution"
        (only rows without a reference solution, through the solution branch's fallback) or None."""
        if self.mode != "gec":
            return None
        if self.p_answer > 0:
            return "all"
        return "no_solution" if self.p_solution > 0 else None


@dataclass
class ExtAlgorithmConfig:
    edge_grpo: EdgeGrpoConfig = field(default_factory=EdgeGrpoConfig)
    gepo: GepoConfig = field(default_factory=GepoConfig)
    gec: GecConfig = field(default_factory=GecConfig)


def config_value(node: Any, key: str, default: Any = None) -> Any:
    """``node.<key>`` for a dotted ``key``, however verl holds its config (DictConfig, plain dict, or a dataclass
    such as verl's ``AlgoConfig``); ``default`` where a node on the way or the value is missing or None."""
    for part in key.split("."):
        if node is None:
            return default
        if isinstance(node, dict) or (hasattr(node, "get") and not dataclasses.is_dataclass(node)):
            node = node.get(part, None)
        else:
            node = getattr(node, part, None)
    return default if node is None else node


def _sub_node(algo_cfg: Any, name: str) -> dict:
    node = config_value(algo_cfg, name)
    if node is None:
        return {}
    if dataclasses.is_dataclass(node):
        return dataclasses.asdict(node)
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(node, DictConfig):
            return OmegaConf.to_container(node, resolve=True)
    except ImportError:  # pragma: no cover
        pass
    return dict(node)


def _build(cls, values: dict, prefix: str):
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise ConfigError(f"unknown key(s) {[f'{prefix}.{k}' for k in unknown]}; allowed: {sorted(names)}")
    return cls(**values).validate(prefix)


def load_algorithm_config(algo_cfg: Any) -> ExtAlgorithmConfig:
    """Read and validate verl_ext's nodes (``algorithm.edge_grpo/gepo/gec``) from verl's ``algorithm`` node."""
    return ExtAlgorithmConfig(
        edge_grpo=_build(EdgeGrpoConfig, _sub_node(algo_cfg, "edge_grpo"), "algorithm.edge_grpo"),
        gepo=_build(GepoConfig, _sub_node(algo_cfg, "gepo"), "algorithm.gepo"),
        gec=_build(GecConfig, _sub_node(algo_cfg, "gec"), "algorithm.gec"),
    )


# ---------------------------------------------------------------- start-up checks across verl's and verl_ext's keys


def register_structured_configs() -> None:
    """Put the dataclasses in Hydra's ConfigStore as ``verl_ext/edge_grpo``, ``verl_ext/gepo``, ``verl_ext/gec``."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    store.store(group="verl_ext", name="edge_grpo", node=EdgeGrpoConfig)
    store.store(group="verl_ext", name="gepo", node=GepoConfig)
    store.store(group="verl_ext", name="gec", node=GecConfig)


# ---- cross-key checks of verl_ext's features against the verl features people combine them with -----------------
# Each check is a small function over verl's full config (a DictConfig); ``validate_feature_combinations`` runs them
# all at start-up.  A refusal names both settings and says why; the README's combination table lists them.


