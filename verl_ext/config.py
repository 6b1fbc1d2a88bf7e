"""Configuration of verl_ext's algorithm nodes: ``algorithm.edge_grpo``, ``algorithm.gepo``, ``algorithm.gec``.

These dataclasses are the single source of defaults and validation.  ``register_structured_configs`` puts them in
Hydra's ConfigStore, and ``hydra_configs/base.yaml`` only composes them under ``algorithm`` next to verl's
own ``ppo_trainer`` config.  :func:`validate_run_config` holds the start-up checks that span verl's and verl_ext's
keys (``python -m verl_ext.main`` runs it before verl's own).  The estimators accept the ``algorithm`` node as a
DictConfig, a plain dict or verl's ``AlgoConfig`` (read through :func:`config_value`, the one key reader for all
three); a missing sub-node or key means the paper's default.  The allowed values come from ``verl_ext.names``,
which the implementing modules use too; this module imports nothing else from verl_ext.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from verl_ext.names import (
    ADV_ESTIMATORS,
    BASE_ADVANTAGES,
    EMA_INITS,
    ENTROPY_ESTIMATORS,
    GEC_AGENT_NAME,
    ROW_SAMPLING_KEYS,
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
        if self.ema_init == "warmup_pool":
            _check(self.warmup_steps >= 1, f"{prefix}.warmup_steps", self.warmup_steps,
                   f"must be >= 1 with {prefix}.ema_init=warmup_pool (the number of batches pooled before seeding)")
        else:
            _check(self.warmup_steps == 0, f"{prefix}.warmup_steps", self.warmup_steps,
                   f"only applies to {prefix}.ema_init=warmup_pool; with ema_init={self.ema_init} leave it at 0")
        return self


ANSWER_PLACEHOLDER = "{answer}"


@dataclass
class GecConfig:
    """Guided Error Correction (docs/edge-grpo.md) and the +Force-R baseline; applied to training rollouts only."""

    enable: bool = False
    mode: str = "gec"  # gec (reflect / answer / solution branches) | force_reflect (cue + continuation only)
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

    def validate(self, prefix: str = "algorithm.gec") -> GecConfig:
        _choice(f"{prefix}.mode", self.mode, ("gec", "force_reflect"))
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
        return self

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

def _as_list(value: Any) -> list:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return list(value)


def _local_parquet_columns(files: Any, columns: tuple[str, ...]):
    """(path, {column: values}) for each local parquet file, with those of ``columns`` it has (pyarrow reads only
    them). Files that do not exist here (remote paths, data not written yet) and non-parquet files are skipped:
    verl's own loader reports those, and what they hold shows at rollout (gec/errors)."""
    import os

    for path in _as_list(files):
        local = os.path.expanduser(str(path))
        if not local.endswith(".parquet") or not os.path.isfile(local):
            continue
        import pyarrow.parquet as pq

        names = pq.read_schema(local).names
        present = [c for c in columns if c in names]
        table = pq.read_table(local, columns=present)
        yield str(path), {c: table.column(c).to_pylist() for c in present}, table.num_rows


def data_agent_names(files: Any) -> dict[str, dict[Any, int]]:
    """Per local parquet file with an ``agent_name`` column: {agent name: row count}."""
    found: dict[str, dict[Any, int]] = {}
    for path, cols, _ in _local_parquet_columns(files, ("agent_name",)):
        if "agent_name" not in cols:
            continue
        counts: dict[Any, int] = {}
        for name in cols["agent_name"]:
            counts[name] = counts.get(name, 0) + 1
        found[path] = counts
    return found


def unknown_sampling_keys(extra_info: Any) -> list[str]:
    """The keys of a row's ``extra_info["sampling_params"]`` that ``gec_agent`` does not know (set ones: a parquet
    struct gives every row every key of the file, unset ones as None)."""
    row = extra_info.get("sampling_params") if isinstance(extra_info, dict) else None
    if not isinstance(row, dict):
        return []
    return sorted(k for k, v in row.items() if v is not None and k not in ROW_SAMPLING_KEYS)


def has_ground_truth(reward_model: Any) -> bool:
    """Whether a row's ``reward_model`` gives GEC an answer to inject (``rollout.gec.ground_truth_text``)."""
    gt = reward_model.get("ground_truth") if isinstance(reward_model, dict) else reward_model
    return gt is not None


def _bad_rows(files: Any, columns: tuple[str, ...], bad) -> dict[str, tuple[int, int, int, Any]]:
    """Per local parquet file that has ``columns[0]``: (rows for which ``bad(row) -> detail or None`` gives a
    detail, total rows, first such row, its detail)."""
    found = {}
    for path, cols, num_rows in _local_parquet_columns(files, columns):
        if columns[0] not in cols:  # e.g. a dataset class that adds the column itself
            continue
        first, count, detail = None, 0, None
        for i in range(num_rows):
            d = bad({c: cols[c][i] if c in cols else None for c in columns})
            if d is not None:
                count += 1
                if first is None:
                    first, detail = i, d
        if count:
            found[path] = (count, num_rows, first, detail)
    return found


def check_gec_reward(config: Any) -> None:
    """GEC scores the first response inside the agent loop with verl's rule reward (custom function or default
    ``compute_score``); a reward model cannot be called from there."""
    if config_value(config, "reward.reward_model.enable", False) and not config_value(
            config, "reward.custom_reward_function.path", None):
        raise ConfigError(
            "algorithm.gec.enable=true with reward.reward_model.enable=true and no reward.custom_reward_function.path: "
            "GEC scores the first response inside the agent loop with a rule reward it can call there (a reward model "
            "alone cannot be); set reward.custom_reward_function.path, or algorithm.gec.enable=false")


def check_gec_data(config: Any, gec: GecConfig) -> None:
    """What the rows of local parquet files hold that ``gec_agent`` would fail on only at rollout: unknown
    ``extra_info.sampling_params`` keys (train and val files, GEC on or off) and, with GEC on, training rows without
    a ground truth that can draw the answer injection."""
    data = config_value(config, "data", {})
    for key in ("train_files", "val_files"):
        for path, (count, total, first, keys) in _bad_rows(
                config_value(data, key, None), ("extra_info",),
                lambda row: unknown_sampling_keys(row["extra_info"]) or None).items():
            raise ConfigError(
                f"data.{key} {path}: {count} of {total} rows set unknown extra_info.sampling_params key(s) (row "
                f"{first}: {keys}); the {GEC_AGENT_NAME} loop knows {list(ROW_SAMPLING_KEYS)} (a typo would sample "
                "at the trainer's settings); fix the rows")
    drawable = gec.answer_drawable() if gec.enable else None
    if drawable is None:
        return

    def no_ground_truth(row):
        if has_ground_truth(row["reward_model"]):
            return None
        info = row["extra_info"]
        solution = info.get(gec.solution_key) if isinstance(info, dict) else None
        if drawable == "no_solution" and solution is not None and str(solution).strip():
            return None  # the solution branch uses the row's solution, never the answer
        return "no reward_model.ground_truth"

    for path, (count, total, first, _) in _bad_rows(config_value(data, "train_files", None),
                                                     ("reward_model", "extra_info"), no_ground_truth).items():
        why = (f"algorithm.gec.p_answer={gec.p_answer}" if drawable == "all" else
               f"algorithm.gec.p_solution={gec.p_solution} falls back to the answer without extra_info."
               f"{gec.solution_key}")
        raise ConfigError(
            f"data.train_files {path}: {count} of {total} rows (first: row {first}) have no reward_model.ground_truth, "
            f"and GEC's answer injection can be drawn for them ({why}); give every row a ground truth, set "
            "algorithm.gec.p_answer=0 (and p_solution=0 or a solution per row), or algorithm.gec.enable=false")


def bypass_mode(config: Any) -> bool:
    """``algorithm.rollout_correction.bypass_mode`` of a run config (read as verl reads it): verl then takes the
    rollout's log-probs as ``old_log_probs`` and skips the old-log-prob pass, and with it the per-token entropy."""
    return bool(config_value(config, "algorithm.rollout_correction.bypass_mode", False))


def needs_entropy(estimator: str, ext: ExtAlgorithmConfig) -> bool:
    """Whether ``estimator`` with these settings reads the old-log-prob pass's per-token entropy."""
    return estimator == "edge_grpo" or (
        estimator == "gepo" and (ext.gepo.base == "edge_grpo" or ext.gepo.entropy_estimator == "full_entropy"))


def validate_run_config(config: Any) -> ExtAlgorithmConfig:
    """Start-up checks of a composed run config (verl's ppo_trainer plus verl_ext's nodes); returns the ext config.

    Besides each node's own ranges, refuses the combinations that would silently turn a method off or corrupt it,
    with a ConfigError naming the settings: group estimators or GEC with ``rollout.n < 2`` (every group has one
    member), GEC whose rollouts never reach the ``gec_agent`` loop, GEC with anything that uses rollout log-probs as
    the behaviour policy (injected tokens carry rollout log-prob 0.0) unless ``gec.mask_injected`` takes them out of
    the response mask, settings the estimators cannot run with, :func:`validate_entropy_grad` and
    :data:`FEATURE_COMBINATION_CHECKS`.  ``python -m verl_ext.main`` (and its dry run) calls this one function.
    """
    algorithm = config.algorithm
    ext = load_algorithm_config(algorithm)
    estimator = str(algorithm.adv_estimator)
    rollout = config.actor_rollout_ref.rollout
    rollout_corr = config_value(algorithm, "rollout_correction", {})
    bypass = bypass_mode(config)
    n = int(config_value(rollout, "n", 1))
    gec = ext.gec
    validate_feature_combinations(config, ext)
    validate_entropy_grad(config)

    if bypass and needs_entropy(estimator, ext):
        what = estimator if estimator == "edge_grpo" else (
            f"gepo with base={ext.gepo.base} and entropy_estimator={ext.gepo.entropy_estimator}")
        raise ConfigError(
            f"algorithm.adv_estimator={what} needs the per-token entropy of the old-log-prob pass, which "
            "algorithm.rollout_correction.bypass_mode=true skips; turn bypass_mode off (or, for gepo, use a "
            "log-prob entropy_estimator such as token_mean with a base other than edge_grpo)"
        )
    if estimator == "gepo" and ext.gepo.logprob_source == "rollout" and not (
        config_value(rollout, "calculate_log_probs", False) or bypass
    ):
        raise ConfigError(
            "algorithm.gepo.logprob_source=rollout needs actor_rollout_ref.rollout.calculate_log_probs=true"
        )
    trains = not bool(config_value(config, "trainer.val_only", False))  # val_only: no advantage
    if trains and estimator in ADV_ESTIMATORS and n < 2:  # both are group-relative
        raise ConfigError(
            f"actor_rollout_ref.rollout.n={n} is invalid with algorithm.adv_estimator={estimator}: the advantage is "
            "relative to a group of rollout.n responses per prompt and a group of one has advantage = raw reward "
            "(EDGE-GRPO samples 8, GEPO 16); set actor_rollout_ref.rollout.n >= 2"
        )
    if config_value(rollout, "agent.default_agent_loop") == GEC_AGENT_NAME or gec.enable:
        check_gec_data(config, gec)
    if not gec.enable:
        return ext

    check_gec_reward(config)
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
    for path, counts in data_agent_names(config_value(config.data, "train_files", None)).items():
        other = {k: v for k, v in counts.items() if k != GEC_AGENT_NAME}
        if other:
            raise ConfigError(
                f"data.train_files {path} has an agent_name column that sends {sum(other.values())} of "
                f"{sum(counts.values())} rows to {sorted(map(str, other))} (verl prefers that column over "
                f"actor_rollout_ref.rollout.agent.default_agent_loop), so algorithm.gec.enable=true would never "
                f"correct them; drop the column or set it to {GEC_AGENT_NAME!r}, or set algorithm.gec.enable=false"
            )
    uses_rollout_logprobs = [
        key for key, on in (
            ("algorithm.rollout_correction.bypass_mode=true", bypass),
            (f"algorithm.rollout_correction.rollout_is={config_value(rollout_corr, 'rollout_is', None)!r}",
             config_value(rollout_corr, "rollout_is", None) is not None),
            (f"algorithm.rollout_correction.rollout_rs={config_value(rollout_corr, 'rollout_rs', None)!r}",
             config_value(rollout_corr, "rollout_rs", None) is not None),
            ("algorithm.gepo.logprob_source=rollout", estimator == "gepo" and ext.gepo.logprob_source == "rollout"),
        ) if on
    ]
    if uses_rollout_logprobs and not gec.mask_injected:  # masked tokens are out of the loss, IS/RS and H_g
        raise ConfigError(
            f"algorithm.gec.enable=true cannot be combined with {', '.join(uses_rollout_logprobs)}: these use the "
            "rollout engine's log-probs as the behaviour policy, and the tokens GEC injects (cue, answer template, "
            "reference solution) were never sampled, so their rollout log-prob is 0.0; turn them off (the loss then "
            "uses the recomputed old_log_probs, as the original does), set algorithm.gec.mask_injected=true (the "
            "injected tokens leave the response mask) or set algorithm.gec.enable=false"
        )
    return ext


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


FEATURE_COMBINATION_CHECKS = (check_filter_groups_trainer,)


def validate_feature_combinations(config: Any, ext: ExtAlgorithmConfig | None = None) -> None:
    """Start-up refusals of combinations that would silently misbehave; raises ConfigError naming both settings."""
    ext = load_algorithm_config(config_value(config, "algorithm")) if ext is None else ext
    for check in FEATURE_COMBINATION_CHECKS:
        check(config, ext)
