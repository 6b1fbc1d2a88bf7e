"""verl_ext's batch-size start-up check (``verl_ext.batch_split.check_engine_batch_split``) against verl 0.9.1's own
splitting code, on a grid of plain verl configurations (issue 54).

Each grid point sets, on the toy's plain ``grpo`` config (composed and resolved once): the trainer (legacy or v1),
GPUs and a Ulysses size (actor and reference), ``rollout.n``, ``train_batch_size``, ``ppo_mini_batch_size``, the
actor's and the old-log-prob pass's micro-batch sizes, a reference pass or none (``use_kl_loss``) with its micro-batch
size (null included), dynamic batch size on or off for the actor and for the reference, and ``val_only`` (off; on;
on with ``val_before_train=false``). For each point:

(a) the start-up checks (``STARTUP_CHECKS``, as ``validate_run_config`` walks them) run on the config as a plain
    dict (what they read of it is the same as of a DictConfig);
(b) verl's own code splits a batch of the step's shape, per pass (the calls are cached by shape):
    - the step's rows: legacy ``train_batch_size × n``; v1 ``PPOTrainer._get_required_batch_multiple`` (verl's
      method, on a stand-in trainer holding the point's values at global step 1) and
      ``padding_utils.upsample_batch_to_divisible_size`` on a ``KVBatchMeta`` of that many keys (TransferQueue
      replaced by ``tests.unit.helpers.FakeTransferQueue``);
    - the dispatch to the data-parallel ranks (GPUs / Ulysses size): legacy ``chunk_tensordict`` (what
      ``dispatch_nd_compute_dataproto`` does to the TensorDict the legacy trainer sends), v1 ``KVBatchMeta.chunk``
      (how the BatchMeta it sends is split);
    - the old-log-prob and reference passes: ``prepare_micro_batches`` (the FSDP engine's call) on each rank's rows,
      with the engine settings ``ActorRolloutRefWorker.init_model`` gives each pass: old-log-prob
      ``actor.use_dynamic_bsz`` and ``rollout.log_prob_micro_batch_size_per_gpu``, reference
      ``ref.log_prob_use_dynamic_bsz`` and ``ref.log_prob_micro_batch_size_per_gpu``;
    - the actor update: ``TrainingWorker.train_mini_batch`` itself (unwrapped from its Ray dispatch) on each rank's
      rows, on a stand-in worker whose engine reports the dp size and whose ``train_batch`` hands each mini-batch to
      ``prepare_micro_batches`` with ``actor.ppo_micro_batch_size_per_gpu`` (as ``TrainingWorker.train_batch`` does);
    - nothing where verl's ``fit`` returns before training (``val_only`` with ``val_before_train``).
    Not run: Ray, torch.distributed (dynamic micro-batches are cut per rank without the cross-rank count sync, which
    only matters for uneven ranks, absent here), the model;
(c) verl_ext refuses the point exactly when verl's code raised, wherever verl's ``validate_config`` accepts the point
    (it is called where the two differ and on every suggestion, cached by the grid values it reads: it reads the
    micro-batch sizes only for being set, and neither the trainer, ``val_only`` nor the reference's dynamic setting);
(d) every refusal names settings that split (``Settings that split: k=v, ...`` and, where only micro-batch sizes
    change, ``or dynamic batch size: k=true, ...``): the point with them passes every start-up check, verl's
    ``validate_config`` and verl's splitting code.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import io
import itertools
import random
import re
import time
import types

import pytest

from verl_ext.batch_split import (
    ACTOR_DYNAMIC_KEY,
    ACTOR_MICRO_KEY,
    LOG_PROB_DYNAMIC_KEY,
    LOG_PROB_MICRO_KEY,
    MINI_KEY,
    PROMPTS_KEY,
    REF_DYNAMIC_KEY,
    REF_MICRO_KEY,
)
from verl_ext.config import ConfigError

PLAIN = ["algorithm.adv_estimator=grpo", "algorithm.gec.enable=false",
         "actor_rollout_ref.rollout.agent.default_agent_loop=single_turn_agent"]
ARR = "actor_rollout_ref"
MAX_TOKENS = 16  # max_token_len_per_gpu of the dynamic passes; every dummy sequence has 4 tokens

# the grid: every (trainer, GPUs/Ulysses, n, prompts, mini, actor dynamic), each with INNER_SAMPLES draws of the rest
TRAINERS = (False, True)  # trainer.use_v1
GPUS_SP = ((1, 1), (4, 1), (4, 2))  # dp 1, 4, and 2 with Ulysses
NS = (2, 3, 8)
PROMPTS = (1, 2, 3, 6)
MINIS = (1, 2, 3, 4)
MICROS = (1, 2, 3, 4, 16)
REFS = ("none", None, 1, 2, 3, 16)  # "none": no reference pass; else use_kl_loss with this ref micro-batch size
VALS = ("train", "val_only", "val_only_without_val_before_train")
INNER_SAMPLES = 8


def _values(v1, gpus, sp, n, prompts, mini, actor_dynamic, actor_micro, log_prob_micro, ref, ref_dynamic, val):
    """The point's settings, as config keys."""
    return {
        "trainer.use_v1": v1, "trainer.n_gpus_per_node": gpus, "trainer.nnodes": 1,
        f"{ARR}.actor.ulysses_sequence_parallel_size": sp, f"{ARR}.ref.ulysses_sequence_parallel_size": sp,
        f"{ARR}.model.use_remove_padding": True,  # verl refuses Ulysses without it
        f"{ARR}.rollout.n": n, f"{ARR}.actor.rollout_n": n, f"{ARR}.ref.rollout_n": n,
        PROMPTS_KEY: prompts, MINI_KEY: mini, ACTOR_MICRO_KEY: actor_micro, LOG_PROB_MICRO_KEY: log_prob_micro,
        REF_MICRO_KEY: None if ref == "none" else ref, f"{ARR}.actor.use_kl_loss": ref != "none",
        ACTOR_DYNAMIC_KEY: actor_dynamic, LOG_PROB_DYNAMIC_KEY: actor_dynamic,  # verl's default interpolation
        REF_DYNAMIC_KEY: ref_dynamic,
        "trainer.val_only": val != "train", "trainer.val_before_train": val != "val_only_without_val_before_train",
    }


def grid() -> list[dict]:
    rng = random.Random(54)
    points = []
    for outer in itertools.product(TRAINERS, GPUS_SP, NS, PROMPTS, MINIS, (False, True)):
        v1, (gpus, sp), n, prompts, mini, dynamic = outer
        for _ in range(INNER_SAMPLES):
            points.append(_values(v1, gpus, sp, n, prompts, mini, dynamic, rng.choice(MICROS), rng.choice(MICROS),
                                  rng.choice(REFS), rng.choice((False, True)), rng.choice(VALS)))
    return points


def _with(container: dict, values: dict) -> dict:
    """``container`` with ``values`` set (copies only the nodes on the way)."""
    out = dict(container)
    for key, value in values.items():
        node, *path, last = [out, *key.split(".")]
        for part in path:
            node[part] = dict(node[part])
            node = node[part]
        node[last] = value
    return out


# ---- verl's splitting code, on batches of a shape -----------------------------------------------------------------
def _rows(rows: int):
    import torch
    from tensordict import TensorDict

    return TensorDict({"attention_mask": torch.ones(rows, 4, dtype=torch.int64)}, batch_size=[rows])


@functools.cache
def _v1_padded_rows(rows: int, dp: int, mini: int, n: int) -> int:
    from omegaconf import OmegaConf
    from verl.trainer.ppo import padding_utils
    from verl.trainer.ppo.v1.trainer_base import KVBatchMeta, PPOTrainer

    from tests.unit.helpers import FakeTransferQueue

    trainer = types.SimpleNamespace(use_critic=False, global_steps=1, config=OmegaConf.create(
        {"trainer": {"critic_warmup": 0}, f"{ARR}": {"actor": {"ppo_mini_batch_size": mini}, "rollout": {"n": n}}}))
    multiple = PPOTrainer._get_required_batch_multiple(trainer, dp)
    store = FakeTransferQueue()
    keys = [f"k{i}" for i in range(rows)]
    store.kv_batch_put(keys, "train", fields=_rows(rows).set("input_ids", _rows(rows)["attention_mask"]))
    real_tq = padding_utils.tq
    padding_utils.tq = store
    try:
        batch = KVBatchMeta(keys=keys, tags=[{"seq_len": 4} for _ in keys], partition_id="train")
        return len(padding_utils.upsample_batch_to_divisible_size(batch, multiple, eos_token_id=0))
    finally:
        padding_utils.tq = real_tq


@functools.cache
def _dispatched(rows: int, dp: int, v1: bool) -> tuple[int, ...] | None:
    """Rows per rank as verl's dispatch splits the batch; None where it raises."""
    if v1:
        from verl.trainer.ppo.v1.trainer_base import KVBatchMeta

        batch = KVBatchMeta(keys=[f"k{i}" for i in range(rows)], tags=[{}] * rows, partition_id="train")
        return tuple(len(chunk) for chunk in batch.chunk(dp))
    from verl.utils.tensordict_utils import chunk_tensordict

    try:
        return tuple(len(chunk) for chunk in chunk_tensordict(_rows(rows), dp))
    except AssertionError:
        return None


def _cut(data, micro, dynamic) -> None:
    """What the FSDP engine does with a rank's rows in one pass: ``prepare_micro_batches``."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.engine.utils import prepare_micro_batches

    if dynamic:
        data["input_ids"] = data["attention_mask"]
    tu.assign_non_tensor(data, use_dynamic_bsz=dynamic, micro_batch_size_per_gpu=micro,
                         max_token_len_per_gpu=MAX_TOKENS)
    prepare_micro_batches(data)


@functools.cache
def _log_prob_pass_raises(rows: int, micro, dynamic: bool) -> bool:
    try:
        _cut(_rows(rows), micro, dynamic)
    except (AssertionError, TypeError, ValueError, ZeroDivisionError):
        return True
    return False


class _UpdateRank:
    """What ``TrainingWorker.train_mini_batch`` uses of its worker: the engine's dp size and rank, train mode, and
    ``train_batch``, here handing each mini-batch to the engine's ``prepare_micro_batches``."""

    def __init__(self, dp: int, micro, dynamic: bool):
        self.engine = types.SimpleNamespace(
            get_data_parallel_size=lambda: dp, get_data_parallel_rank=lambda: 0, is_mp_src_rank_with_outputs=lambda: False,
            train_mode=lambda **kwargs: contextlib.nullcontext())
        self.profiler = types.SimpleNamespace(step=lambda: None)
        self.micro, self.dynamic = micro, dynamic

    def train_batch(self, mini_batch):
        _cut(mini_batch, self.micro, self.dynamic)


@functools.cache
def _update_raises(rows: int, responses_per_mini_batch: int, dp: int, micro, dynamic: bool) -> bool:
    from verl.utils import tensordict_utils as tu
    from verl.workers.engine_workers import TrainingWorker

    data = _rows(rows)
    tu.assign_non_tensor(data, mini_batch_size=responses_per_mini_batch, epochs=1, seed=42,
                         dataloader_kwargs={"shuffle": False})
    try:
        inspect.unwrap(TrainingWorker.train_mini_batch)(_UpdateRank(dp, micro, dynamic), data)
    except (AssertionError, TypeError, ValueError, ZeroDivisionError):
        return True
    return False


def verl_raises(v: dict) -> bool:
    """Whether verl 0.9.1's splitting code raises in a training step of the point ``v``."""
    if v["trainer.val_only"] and v["trainer.val_before_train"]:
        return False  # verl's fit returns after the validation before training
    v1, n, prompts, mini = v["trainer.use_v1"], v[f"{ARR}.rollout.n"], v[PROMPTS_KEY], v[MINI_KEY]
    dp = v["trainer.n_gpus_per_node"] // v[f"{ARR}.actor.ulysses_sequence_parallel_size"]
    ref_dp = v["trainer.n_gpus_per_node"] // v[f"{ARR}.ref.ulysses_sequence_parallel_size"]
    rows = _v1_padded_rows(prompts * n, dp, mini, n) if v1 else prompts * n
    passes = [(dp, v[LOG_PROB_MICRO_KEY], v[ACTOR_DYNAMIC_KEY])]  # old log-probs
    if v[f"{ARR}.actor.use_kl_loss"]:
        passes.append((ref_dp, v[REF_MICRO_KEY], v[REF_DYNAMIC_KEY]))
    for pass_dp, micro, dynamic in passes:
        ranks = _dispatched(rows, pass_dp, v1)
        if ranks is None or any(_log_prob_pass_raises(r, micro, dynamic) for r in ranks):
            return True
    ranks = _dispatched(rows, dp, v1)
    return ranks is None or any(_update_raises(r, mini * n, dp, v[ACTOR_MICRO_KEY], v[ACTOR_DYNAMIC_KEY])
                                for r in ranks)


# ---- verl_ext's checks and verl's validate_config ------------------------------------------------------------------
@pytest.fixture(scope="module")
def toy():
    from omegaconf import OmegaConf

    from verl_ext.dry_run import compose_run_config
    from verl_ext.main import prepare

    config = compose_run_config("toy_cpu", PLAIN)
    prepare(config, [])
    return config, OmegaConf.to_container(config)


def _refusal(container: dict, v: dict) -> str | None:
    from verl_ext.run_checks import validate_run_config

    try:
        validate_run_config(_with(container, v))
    except ConfigError as e:
        return str(e)
    return None


def _validate_key(v: dict) -> tuple:
    read = {k: (value is None if k.endswith("micro_batch_size_per_gpu") else value) for k, value in v.items()
            if k not in ("trainer.use_v1", "trainer.val_only", "trainer.val_before_train", REF_DYNAMIC_KEY)}
    return tuple(sorted(read.items()))


def _validate_refusal(config, v: dict, cache: dict) -> str | None:
    """What verl's ``validate_config`` raises on the toy's DictConfig with the point's values set in place."""
    from omegaconf import OmegaConf
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    key = _validate_key(v)
    if key not in cache:
        for k, value in v.items():
            OmegaConf.update(config, k, value, merge=False)
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                validate_config(config, use_reference_policy=need_reference_policy(config),
                                use_critic=need_critic(config))
            cache[key] = None
        except (AssertionError, ValueError) as e:
            cache[key] = f"{type(e).__name__}: {e}"
    return cache[key]


SUGGESTED = re.compile(r"Settings that split: (?P<set>[^()]+?)(?: \(or dynamic batch size: (?P<dynamic>[^()]+)\))?$")


def _settings(text: str) -> dict:
    return {key: {"true": True, "false": False}.get(value, value if not value.isdigit() else int(value))
            for key, value in (item.split("=") for item in text.split(", "))}


def test_the_check_refuses_exactly_what_verls_splitting_code_raises_on_and_suggests_settings_that_split(toy):
    import warnings

    config, container = toy
    validated: dict = {}
    points = grid()
    start = time.perf_counter()
    refused = disagreed = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for v in points:
            message = _refusal(container, v)
            raises = verl_raises(v)
            if (message is not None) != raises:
                disagreed += 1
                assert _validate_refusal(config, v, validated), (v, message, raises)
            if message is None:
                continue
            refused += 1
            found = SUGGESTED.search(message)
            assert found, message
            for suggestion in filter(None, (found["set"], found["dynamic"])):
                fixed = {**v, **_settings(suggestion)}
                assert _refusal(container, fixed) is None, (v, suggestion, _refusal(container, fixed))
                assert not verl_raises(fixed), (v, suggestion)
                assert _validate_refusal(config, fixed, validated) is None, (
                    v, suggestion, _validate_refusal(config, fixed, validated))
    elapsed = time.perf_counter() - start
    print(f"{len(points)} points, {refused} refused, {disagreed} refused by verl's validate_config only, "
          f"{len(validated)} validate_config calls, {elapsed:.1f} s")
    assert refused > len(points) // 10 and disagreed  # the grid reaches both sides of the property
