"""Batch sizes verl 0.9.1's FSDP engine cannot split, refused at start-up (``check_engine_batch_split``, the last of
``verl_ext.run_checks.STARTUP_CHECKS``) with a set of sizes that splits.

verl stops on them only in a worker, at the first training step, with an assertion that names no setting. What a
step splits, as verl 0.9.1 does it (``tests/unit/test_batch_split_grid.py`` runs verl's own splitting code on every
shape of a grid of plain configs and checks this model against it):

- the step's batch: legacy trainer ``data.train_batch_size × rollout.n`` responses, dispatched to the data-parallel
  ranks of each pass (``dp`` = GPUs / the role's Ulysses size) as equal chunks (``chunk_tensordict`` asserts it);
  v1 trainer each local update's sample (``train_batch_size / parameter_sync_step`` prompts × n) padded up to a
  multiple of ``lcm(actor dp, ppo_mini_batch_size × n)`` (``_get_required_batch_multiple``, with the critic's
  mini-batch when a critic trains, without the actor's in the steps before ``trainer.critic_warmup``;
  ``upsample_batch_to_divisible_size``), dispatched as ``KVBatchMeta.chunk`` does (the first ``rows % dp`` ranks get
  one more);
- the old-log-prob pass (none in bypass mode) on the actor's engine: dynamic batch size from
  ``actor.use_dynamic_bsz`` (``ActorRolloutRefWorker.init_model`` asserts that ``rollout.log_prob_use_dynamic_bsz``
  equals it), micro-batches of ``rollout.log_prob_micro_batch_size_per_gpu``;
- the reference pass (``use_kl_loss`` or ``use_kl_in_reward``) on the reference engine: ``ref.log_prob_use_dynamic_bsz``
  (popped with default false, whatever the actor's) and ``ref.log_prob_micro_batch_size_per_gpu``, over the
  reference's dp; with LoRA (verl's ``ref_in_actor``) the actor's engine, as the old-log-prob pass;
- the actor update (``TrainingWorker.train_mini_batch``): asserts that dp divides ``ppo_mini_batch_size × n``, cuts
  each rank's rows into whole mini-batches of ``ppo_mini_batch_size × n / dp`` (``make_iterator`` asserts it), and
  each mini-batch into ``actor.ppo_micro_batch_size_per_gpu``;
- with dynamic batch size off, ``prepare_micro_batches`` asserts that the micro size divides what it cuts (and fails
  on a null one); with it on, any number of rows splits, but each row must fit the pass's token budget, and v1's
  padding rows are 128 tokens long whatever the data (a warning, :func:`padding_row_budget_doubts`).

Nothing is split when verl does not train: ``trainer.val_only=true`` returns after the validation before training,
which verl runs only with ``trainer.val_before_train=true`` (its default); with ``val_before_train=false`` verl ignores
``val_only`` and trains (both trainers' ``fit``). What verl's own ``validate_config`` refuses (with dynamic batch size
off: ``train_batch_size × n`` not a multiple of the GPUs, ``train_batch_size < ppo_mini_batch_size``) is left to it.
Other engines than FSDP, and the critic's own passes, are not checked.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Any

from verl_ext.config import ConfigError, ExtAlgorithmConfig, config_value

ACTOR = "actor_rollout_ref.actor"
ROLLOUT = "actor_rollout_ref.rollout"
REF = "actor_rollout_ref.ref"
PROMPTS_KEY = "data.train_batch_size"
MINI_KEY = f"{ACTOR}.ppo_mini_batch_size"
ACTOR_MICRO_KEY = f"{ACTOR}.ppo_micro_batch_size_per_gpu"
LOG_PROB_MICRO_KEY = f"{ROLLOUT}.log_prob_micro_batch_size_per_gpu"
REF_MICRO_KEY = f"{REF}.log_prob_micro_batch_size_per_gpu"
ACTOR_DYNAMIC_KEY = f"{ACTOR}.use_dynamic_bsz"
LOG_PROB_DYNAMIC_KEY = f"{ROLLOUT}.log_prob_use_dynamic_bsz"
REF_DYNAMIC_KEY = f"{REF}.log_prob_use_dynamic_bsz"
FSDP_STRATEGIES = ("fsdp", "fsdp2")
# the length of the rows verl 0.9.1's v1 trainer pads a batch with (padding_utils.SYNTHETIC_PADDING_SEQ_LEN; guarded
# in tests/unit/test_start_up_checks.py)
V1_PADDING_ROW_TOKENS = 128
TOKEN_BUDGET_KEYS = {"actor": (f"{ACTOR}.ppo_max_token_len_per_gpu", f"{ROLLOUT}.log_prob_max_token_len_per_gpu"),
                     "ref": (f"{REF}.log_prob_max_token_len_per_gpu",)}


def runs_training(config: Any) -> bool:
    """Whether verl 0.9.1 trains on this config: ``trainer.val_only=true`` returns after the validation before
    training, which runs only with ``trainer.val_before_train=true`` (default); otherwise verl trains."""
    return not (config_value(config, "trainer.val_only", False)
                and config_value(config, "trainer.val_before_train", True))


def ulysses_size(config: Any, role: str) -> int:
    """A role's Ulysses sequence-parallel size as verl 0.9.1's ``ActorConfig`` sets it on the FSDP engine: the
    role's deprecated top-level key wins when above 1, else ``<role>.fsdp_config``'s."""
    top = int(config_value(config, f"actor_rollout_ref.{role}.ulysses_sequence_parallel_size", 1) or 1)
    return top if top > 1 else int(
        config_value(config, f"actor_rollout_ref.{role}.fsdp_config.ulysses_sequence_parallel_size", 1) or 1)


def _size(value: Any) -> int | None:
    return None if value is None else int(value)


def _unset(config: Any, per_gpu_key: str) -> bool:
    """Neither the micro-batch size ``per_gpu_key`` nor its deprecated global form is set: verl's
    ``validate_config`` refuses it with dynamic batch size off. (The deprecated form alone passes there, but verl's
    engine reads only the per-GPU size.)"""
    return config_value(config, per_gpu_key, None) is None and config_value(
        config, per_gpu_key.removesuffix("_per_gpu"), None) is None


@dataclasses.dataclass(frozen=True)
class EngineBatch:
    """What a training step hands verl's engine, read from a run config (:func:`engine_batch`)."""

    v1: bool
    gpus: int
    n: int
    prompts: int  # data.train_batch_size
    mini: int  # actor.ppo_mini_batch_size
    actor_sp: int = 1
    ref_sp: int = 1
    actor_micro: int | None = None  # actor.ppo_micro_batch_size_per_gpu: the update's micro-batches
    log_prob_micro: int | None = None  # rollout.log_prob_micro_batch_size_per_gpu: the actor engine's passes
    ref_micro: int | None = None  # ref.log_prob_micro_batch_size_per_gpu
    actor_dynamic: bool = False  # actor.use_dynamic_bsz: the actor engine (update and log-prob passes)
    log_prob_dynamic: bool = False  # rollout.log_prob_use_dynamic_bsz, asserted equal to the actor's
    ref_dynamic: bool = False  # ref.log_prob_use_dynamic_bsz
    old_log_prob: bool = True  # False in bypass mode
    ref: str | None = None  # the engine of the reference pass: "ref", "actor" (LoRA: ref_in_actor) or None
    sync_steps: int = 1  # v1: parameter_sync_step of the trainer mode
    critic_mini: int | None = None  # critic.ppo_mini_batch_size when a critic trains
    critic_warmup: int = 0
    prompt_multiple: int = 1  # what else data.train_batch_size must be a multiple of (a suggestion keeps it)

    @property
    def dp(self) -> int:
        return max(self.gpus // self.actor_sp, 1)

    @property
    def ref_dp(self) -> int:
        return max(self.gpus // self.ref_sp, 1)


def engine_batch(config: Any, ext: ExtAlgorithmConfig | None = None) -> EngineBatch | None:
    """The run's :class:`EngineBatch`; None where nothing is checked (another engine than FSDP, no training, sizes
    verl's ``validate_config`` refuses itself, a v1 sample size verl asserts on at its first step)."""
    if str(config_value(config, f"{ACTOR}.strategy", "fsdp")) not in FSDP_STRATEGIES or not runs_training(config):
        return None
    n = int(config_value(config, f"{ROLLOUT}.n", 1))
    prompts = int(config_value(config, PROMPTS_KEY, 0) or 0)
    mini = int(config_value(config, MINI_KEY, 0) or 0)
    gpus = int(config_value(config, "trainer.n_gpus_per_node", 1)) * int(config_value(config, "trainer.nnodes", 1))
    actor_dynamic = bool(config_value(config, ACTOR_DYNAMIC_KEY, False))
    uses_ref = bool(config_value(config, "algorithm.use_kl_in_reward", False)
                    or config_value(config, f"{ACTOR}.use_kl_loss", False))  # verl's need_reference_policy
    if min(n, prompts, mini, gpus) <= 0 or not actor_dynamic and (
            prompts * n % gpus or prompts < mini or _unset(config, ACTOR_MICRO_KEY)
            or _unset(config, LOG_PROB_MICRO_KEY) or uses_ref and _unset(config, REF_MICRO_KEY)):
        return None  # verl's validate_config refuses these itself
    v1 = bool(config_value(config, "trainer.use_v1", True))
    mode = config_value(config, "trainer.v1.trainer_mode", None)
    sync_steps = int(config_value(config, f"trainer.v1.{mode}.parameter_sync_step", 1) or 1) if v1 and mode else 1
    if prompts % sync_steps:
        return None  # verl's v1 trainer asserts it at its first step; separate_async's own check at start-up
    critic = config_value(config, "critic.enable", None)
    if critic is None:
        critic = config_value(config, "algorithm.adv_estimator", "") == "gae"  # verl's need_critic
    ref_in_actor = (int(config_value(config, "actor_rollout_ref.model.lora.rank", 0) or 0) > 0
                    or int(config_value(config, "actor_rollout_ref.model.lora_rank", 0) or 0) > 0
                    or config_value(config, "actor_rollout_ref.model.lora_adapter_path", None) is not None)
    prompt_multiple = 1
    if ext is not None and ext.gec.enable and ext.gec.edit_scope == "all_wrong_groups" and not v1:
        prompt_multiple = int(config_value(config, f"{ROLLOUT}.agent.num_workers", 1) or 1)  # check_gec_credit_options
    return EngineBatch(
        v1=v1, gpus=gpus, n=n, prompts=prompts, mini=mini,
        actor_sp=ulysses_size(config, "actor"), ref_sp=ulysses_size(config, "ref"),
        actor_micro=_size(config_value(config, ACTOR_MICRO_KEY, None)),
        log_prob_micro=_size(config_value(config, LOG_PROB_MICRO_KEY, None)),
        ref_micro=_size(config_value(config, REF_MICRO_KEY, None)),
        actor_dynamic=actor_dynamic,
        log_prob_dynamic=bool(config_value(config, LOG_PROB_DYNAMIC_KEY, False)),
        ref_dynamic=bool(config_value(config, REF_DYNAMIC_KEY, False)),
        old_log_prob=not config_value(config, "algorithm.rollout_correction.bypass_mode", False),
        ref=("actor" if ref_in_actor else "ref") if uses_ref else None,
        sync_steps=sync_steps,
        critic_mini=_size(config_value(config, "critic.ppo_mini_batch_size", None)) if critic else None,
        critic_warmup=int(config_value(config, "trainer.critic_warmup", 0) or 0),
        prompt_multiple=prompt_multiple)


@dataclasses.dataclass(frozen=True)
class StepBatch:
    """One shape of a step's batch: its responses, and whether the actor updates on it."""

    rows: int
    updates: bool
    how: str  # how verl gets to that many rows, for the messages


def step_batches(b: EngineBatch) -> list[StepBatch]:
    """The shapes of the batch a training step hands the engine (v1: one per padding multiple the run uses)."""
    if not b.v1:
        return [StepBatch(b.prompts * b.n, True, f"{PROMPTS_KEY}={b.prompts} x n={b.n}")]
    sample = b.prompts // b.sync_steps * b.n
    base = b.dp if b.critic_mini is None else math.lcm(b.dp, b.critic_mini * b.n)
    multiples = [(math.lcm(base, b.mini * b.n), True)] + ([(base, False)] if b.critic_warmup > 1 else [])
    sync = f" / parameter_sync_step={b.sync_steps}" if b.sync_steps > 1 else ""
    return [StepBatch(-(-sample // m) * m, updates,
                      f"{PROMPTS_KEY}={b.prompts}{sync} x n={b.n}, padded by the v1 trainer to a multiple of {m}")
            for m, updates in multiples]


def dispatched(rows: int, dp: int, v1: bool) -> tuple[int, ...] | None:
    """The rows each of ``dp`` ranks gets of a batch of ``rows``: the legacy trainer's TensorDict chunks must be equal
    (None when they cannot be); v1's ``KVBatchMeta.chunk`` gives the first ``rows % dp`` ranks one more."""
    if not v1:
        return (rows // dp,) * dp if rows % dp == 0 else None
    return tuple(rows // dp + (rank < rows % dp) for rank in range(dp))


@dataclasses.dataclass(frozen=True)
class EnginePass:
    """Rows that verl's ``prepare_micro_batches`` cuts on each data-parallel rank, in one pass."""

    what: str
    micro_key: str
    micro: int | None
    dynamic: bool
    dynamic_key: str
    ranks: tuple[int, ...]


def split_problems(b: EngineBatch) -> tuple[list[str], list[str]]:
    """What verl 0.9.1's engine would stop on in a training step of ``b`` (:func:`engine_passes`), and what it may
    stop on (a rank handed no rows): two lists of descriptions naming the settings."""
    problems, doubts = [], []
    if b.log_prob_dynamic != b.actor_dynamic:
        problems.append(f"{LOG_PROB_DYNAMIC_KEY}={str(b.log_prob_dynamic).lower()} with {ACTOR_DYNAMIC_KEY}="
                        f"{str(b.actor_dynamic).lower()} (verl's actor worker asserts they are equal when it starts)")
    passes = engine_passes(b, problems)
    for p in passes:
        if p.dynamic:
            continue
        if p.micro is None:
            problems.append(f"{p.micro_key}=null with dynamic batch size off ({p.dynamic_key}=false) in the {p.what}")
            continue
        for rows in sorted(set(p.ranks)):
            if rows == 0:
                continue
            if rows % p.micro:
                problems.append(f"{p.micro_key}={p.micro} against {rows} responses per rank in each {p.what}")
    for p in passes:
        if 0 in p.ranks:
            doubts.append(f"the {p.what} hands {p.ranks.count(0)} of its {len(p.ranks)} data-parallel ranks no rows")
    return list(dict.fromkeys(problems)), list(dict.fromkeys(doubts))


def engine_passes(b: EngineBatch, problems: list[str]) -> list[EnginePass]:
    """The passes of a training step of ``b`` that cut micro-batches; what stops verl before them (a mini-batch the
    ranks cannot share, a batch the legacy trainer cannot dispatch evenly) is appended to ``problems``."""
    dp, responses = b.dp, b.mini * b.n
    if responses % dp:
        problems.append(f"{MINI_KEY}={b.mini} x n={b.n} = {responses} responses per mini-batch, which verl's update "
                        f"shares evenly over {dp} data-parallel ranks (GPUs {b.gpus} / Ulysses size {b.actor_sp})")
    if not b.v1 and b.prompts % b.mini:
        problems.append(f"{PROMPTS_KEY}={b.prompts}, not a multiple of {MINI_KEY}={b.mini}: the legacy trainer "
                        "(trainer.use_v1=false) cuts each step's batch into whole mini-batches (v1 pads it instead)")
    actor_engine = (LOG_PROB_MICRO_KEY, b.log_prob_micro, b.actor_dynamic, ACTOR_DYNAMIC_KEY, dp)
    engines = [("old-log-prob pass", actor_engine)] if b.old_log_prob else []
    if b.ref == "ref":
        engines.append(("reference pass", (REF_MICRO_KEY, b.ref_micro, b.ref_dynamic, REF_DYNAMIC_KEY, b.ref_dp)))
    elif b.ref == "actor":
        engines.append(("reference pass (LoRA: on the actor's engine)", actor_engine))
    passes = []
    for step in step_batches(b):
        for name, (key, micro, dynamic, dynamic_key, ranks_dp) in engines + (
                [("actor update", actor_engine)] if step.updates else []):
            ranks = dispatched(step.rows, ranks_dp, b.v1)
            if ranks is None:
                problems.append(f"{step.how} = {step.rows} responses, which the legacy trainer hands the {name}'s "
                                f"{ranks_dp} data-parallel ranks in equal parts (it does not pad)")
                continue
            what = f"{name} ({step.how}, over {ranks_dp} data-parallel ranks)"
            if name != "actor update":
                passes.append(EnginePass(what, key, micro, dynamic, dynamic_key, ranks))
            elif not responses % dp and not any(rows % (responses // dp) for rows in ranks):
                passes.append(EnginePass(f"actor mini-batch ({MINI_KEY}={b.mini} x n={b.n} / {dp} ranks)",
                                         ACTOR_MICRO_KEY, b.actor_micro, b.actor_dynamic, ACTOR_DYNAMIC_KEY,
                                         (responses // dp,)))
    return passes


def _mini_and_prompts(b: EngineBatch) -> tuple[int, int]:
    """The mini-batch size (and, where no mini-batch size can do it, train_batch_size) closest to ``b``'s that the
    update can split: the largest at most ``b.mini``, else the smallest above it."""
    dp, n = b.dp, b.n
    step = dp // math.gcd(n, dp)  # the mini-batch sizes whose responses the ranks share: multiples of step

    def fits(mini: int, prompts: int) -> bool:
        return mini * n % dp == 0 and (b.v1 or prompts % mini == 0) and (b.actor_dynamic or mini <= prompts)

    share = math.lcm(dp, b.ref_dp if b.ref == "ref" else 1)  # the ranks the legacy trainer's batch is dispatched to
    if not b.v1 and b.prompts * n % share:  # dynamic batch size on the legacy trainer: train_batch_size too
        mini = -(-b.mini // step) * step
        multiple = math.lcm(mini, b.prompt_multiple, share // math.gcd(n, share))
        return mini, -(-b.prompts // multiple) * multiple
    if fits(b.mini, b.prompts):
        return b.mini, b.prompts
    below = [m for m in range(b.mini, 0, -1) if fits(m, b.prompts)]
    if below:
        return below[0], b.prompts
    above = range(b.mini + 1, max(b.mini, b.prompts) + step + 1)  # holds one (a multiple of step, or prompts)
    return next((m for m in above if fits(m, b.prompts)), b.mini), b.prompts


def repaired(b: EngineBatch) -> tuple[dict[str, Any], EngineBatch]:
    """Settings that split (``{key: value}``, the fewest changes this picks) and the batch with them: the mini-batch
    (and train_batch_size) first, then each micro-batch size against every pass it cuts with those."""
    changes: dict[str, Any] = {}
    if b.log_prob_dynamic != b.actor_dynamic:
        changes[LOG_PROB_DYNAMIC_KEY] = b.actor_dynamic
    mini, prompts = _mini_and_prompts(b)
    if prompts != b.prompts:
        changes[PROMPTS_KEY] = prompts
    if mini != b.mini:
        changes[MINI_KEY] = mini
    fixed = dataclasses.replace(b, mini=mini, prompts=prompts, log_prob_dynamic=b.actor_dynamic)
    passes = engine_passes(fixed, [])
    micros = {}
    for key, field in ((ACTOR_MICRO_KEY, "actor_micro"), (LOG_PROB_MICRO_KEY, "log_prob_micro"),
                       (REF_MICRO_KEY, "ref_micro")):
        rows = [r for p in passes if p.micro_key == key and not p.dynamic for r in p.ranks if r]
        value = getattr(fixed, field)
        if rows and (value is None or any(r % value for r in rows)):
            micros[field] = changes[key] = math.gcd(value or 0, *rows)
    return changes, dataclasses.replace(fixed, **micros)


def padding_row_budget_doubts(config: Any, b: EngineBatch) -> list[str]:
    """v1 with dynamic batch size, on a step verl pads: the token budgets of the dynamic passes below the length of
    verl's padding rows (``V1_PADDING_ROW_TOKENS``), on which ``rearrange_micro_batches`` stops ("max_token_len must
    be greater than the sequence length"). A warning: verl_ext does not model how Ulysses scales the budget."""
    batches = step_batches(b)
    if not b.v1 or all(s.rows == b.prompts // b.sync_steps * b.n for s in batches):
        return []
    roles = ["actor"] if b.actor_dynamic else []
    roles += ["ref"] if b.ref == "ref" and b.ref_dynamic else []
    low = [(key, value) for role in roles for key in TOKEN_BUDGET_KEYS[role]
           if (value := config_value(config, key, None)) is not None and int(value) < V1_PADDING_ROW_TOKENS]
    if not low:
        return []
    return [f"{', '.join(_setting(k, v) for k, v in low)} with dynamic batch size: the v1 trainer pads this step "
            f"({batches[0].how}) with rows of {V1_PADDING_ROW_TOKENS} tokens, longer than that budget, and verl 0.9.1 "
            f"stops at the first pass that cuts them; set them >= {V1_PADDING_ROW_TOKENS}, or batch sizes that need "
            "no padding"]


def _setting(key: str, value: Any) -> str:
    return f"{key}={str(value).lower() if isinstance(value, bool) else value}"


def check_engine_batch_split(config: Any, ext: ExtAlgorithmConfig | None = None) -> None:
    """Refuse, naming the settings and values that split, batch sizes verl 0.9.1's FSDP engine would stop on in a
    worker at the first training step (module docstring); warn where it may (a rank handed no rows)."""
    b = engine_batch(config, ext)
    if b is None:
        return
    problems, doubts = split_problems(b)
    for budget in padding_row_budget_doubts(config, b):
        warnings.warn(f"verl_ext: {budget}", stacklevel=2)
    for doubt in doubts:
        warnings.warn(f"verl_ext: {doubt}; verl 0.9.1 may stop there (keep the reference's Ulysses size equal to "
                      "the actor's)", stacklevel=2)
    if not problems:
        return
    changes, fixed = repaired(b)
    message = ("verl's workers would stop on these batch settings, when they start or at the first training step, "
               "with an assertion that names no setting: " + "; ".join(problems))
    if not split_problems(fixed)[0]:  # always, by construction (tests/unit/test_batch_split_grid.py)
        message += ". Settings that split: " + ", ".join(_setting(k, v) for k, v in changes.items())
        micro_keys = {ACTOR_MICRO_KEY: (ACTOR_DYNAMIC_KEY, LOG_PROB_DYNAMIC_KEY),
                      LOG_PROB_MICRO_KEY: (ACTOR_DYNAMIC_KEY, LOG_PROB_DYNAMIC_KEY), REF_MICRO_KEY: (REF_DYNAMIC_KEY,)}
        if set(changes) <= set(micro_keys):  # only micro-batch sizes: dynamic batch size splits them too
            dynamic = dict.fromkeys(key for k in changes for key in micro_keys[k])
            message += " (or dynamic batch size: " + ", ".join(_setting(k, True) for k in dynamic) + ")"
    raise ConfigError(message)
