"""verl's v1 trainers (``trainer.use_v1=true``: sync, colocate_async, separate_async) with verl_ext's glue.

What the subclass adds to verl's step:

* ``_compute_advantage``: fetches what verl's own fetch leaves out (the old-log-prob pass's ``entropy``,
  ``data_source``, GEC's fields) from TransferQueue, routes verl_ext's estimators through
  ``advantage.compute_extension_advantage`` (any other estimator stays verl's; its step diagnostics are read from
  verl's output), applies GEC's credit options (``gec_advantage.py``) to either and logs the outcome metrics
  (``gec/...``, all-wrong groups);
* ``_compute_old_log_prob`` and ``_compute_advantage``, with GEC on: verl's rollout-vs-actor diagnostics over the
  sampled tokens only (``rollout_diagnostics.py``), and ``gec/injected_token_frac``;
* ``_next_train_batch`` / ``_validate``: tag the rows sent to rollout as training or validation for ``gec_agent``;
* ``on_init_end``: installs verl_ext's actor loss when one is on (``edge_grpo.entropy_grad``, GEC's shaped loss),
  whose per-response / per-token fields go to TransferQueue next to the advantages;
* ``_log_rollout_data``: GEC's columns in verl's rollout dump (``trainer.rollout_data_dir``; ``gec_dump.py``);
* ``step``: verl's mini-batch metrics folded with ``step_metrics_aggregator`` (verl_ext's counts summed).
"""

from __future__ import annotations

import contextlib
import functools
import uuid

import numpy as np
import torch
import transfer_queue as tq
from tensordict import NonTensorData, NonTensorStack, TensorDict
from verl.trainer.ppo.core_algos import AdvantageEstimator
from verl.trainer.ppo.v1 import trainer_base
from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY, PPOTrainer

from verl_ext import verl_compat
from verl_ext.algos.registry import EDA_H_BAR_KEY, EDA_H_OLD_KEY
from verl_ext.names import TRAINING_ROLLOUT_KEY
from verl_ext.run_checks import bypass_mode
from verl_ext.trainer.advantage import (
    ENTROPY_KEY,
    as_object_array,
    final_outputs,
    fit_width,
    is_extension_estimator,
    on_final_outputs,
)
from verl_ext.trainer.eda_loss import summarize_entropy_grad_metrics
from verl_ext.trainer.gec_advantage import OFF_POLICY_MASK_KEY
from verl_ext.trainer.gec_dump import blank_rows
from verl_ext.trainer.gec_loss import summarize_shaped_loss_metrics
from verl_ext.trainer.gec_metrics import is_count_metric
from verl_ext.trainer.mixin import ExtTrainerMixin, replaced
from verl_ext.trainer.rollout_diagnostics import spans_of_rows
from verl_ext.trainer.v1_replay import data_order_class, has_custom_sampler, ordered_uid, sampler_settings


class ExtV1TrainerMixin(ExtTrainerMixin):
    def on_init_end(self):
        self._ext_install_actor_loss()
        return super().on_init_end()

    def _build_replay_buffer(self):
        # verl_ext's settings of verl's built-in buffer (trainer.v1.sampler.sampler_kwargs; v1_replay.py); a custom
        # sampler is the user's, with its own kwargs
        sampler = self.config.trainer.v1.sampler
        if has_custom_sampler(sampler):
            return super()._build_replay_buffer()
        settings, _ = sampler_settings(sampler.get("sampler_kwargs", None))  # refused at start-up if bad
        self._ext_fetched_prompts = 0 if settings["data_order"] else None
        if settings["data_order"] or settings["poll_interval"] is not None:
            verl_compat.check_v1_replay_buffer()
        with contextlib.ExitStack() as swapped:  # data_order: verl's two buffer classes, each with DataOrderMixin
            for name in ("ReplayBuffer", "ReplayBufferAsync") if settings["data_order"] else ():
                swapped.enter_context(replaced(trainer_base, name, data_order_class(getattr(trainer_base, name))))
            buffer = super()._build_replay_buffer()
        if settings["poll_interval"] is not None:
            buffer.poll_interval = float(settings["poll_interval"])
        return buffer

    def _fetch_one_gen_batch(self):
        batch = super()._fetch_one_gen_batch()
        start = getattr(self, "_ext_fetched_prompts", None)
        if start is None:  # data_order off: verl's uuids
            return batch
        uids = [ordered_uid(start + i, uuid.uuid4().hex) for i in range(len(batch))]
        self._ext_fetched_prompts = start + len(uids)
        batch["uid"] = NonTensorStack.from_list([NonTensorData(u) for u in uids])
        return batch

    def _next_train_batch(self, *args, **kwargs):
        batch = super()._next_train_batch(*args, **kwargs)
        tags = self._ext_rollout_tags(len(batch), training=True)
        if tags is not None:  # per row, so async modes persist it with the prompt (re-issued after a resume)
            batch[TRAINING_ROLLOUT_KEY] = NonTensorStack.from_list([NonTensorData(t) for t in tags])
        return batch

    def _validate(self, *args, **kwargs):
        tags = self._ext_rollout_tags(0, training=False)
        if tags is None:
            return super()._validate(*args, **kwargs)
        loader = self.val_dataloader  # verl's _validate builds each batch from it: tag the rows as they come
        self.val_dataloader = _TaggedBatches(loader, training=False)
        try:
            return super()._validate(*args, **kwargs)
        finally:
            self.val_dataloader = loader

    def step(self, *args, **kwargs):
        with replaced(trainer_base, "MetricsAggregator", step_metrics_aggregator()):
            return super().step(*args, **kwargs)

    def _update_actor(self, batch, metrics):
        batch = super()._update_actor(batch, metrics)
        summarize_entropy_grad_metrics(metrics)
        summarize_shaped_loss_metrics(metrics)
        return batch

    def _compute_old_log_prob(self, batch, metrics):
        # verl compares the rollout's log-probs with the actor's here (calculate_log_probs): over sampled tokens only
        if not (self._ext_diagnoses_sampled_tokens() and self.config.actor_rollout_ref.rollout.calculate_log_probs
                and not bypass_mode(self.config)):
            return super()._compute_old_log_prob(batch, metrics)
        extra = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["extra_fields"])
        spans = spans_of_rows({"extra_fields": as_object_array(extra["extra_fields"])}, len(batch))
        with self._ext_debug_metrics_on_sampled_tokens(trainer_base, lambda data: spans):
            return super()._compute_old_log_prob(batch, metrics)

    def _compute_advantage(self, batch, metrics):
        extension = self._ext_active()
        # verl's padding rows (``_balance_batch`` pads the batch to a multiple of the ranks' sizes): they keep
        # advantage 0 and enter no verl_ext statistic, metric or GEPO history
        real = real_rows(batch.tags)
        # an agent loop's several outputs of one sample: only the last is a group member (verl's GRPO rule)
        members = real & last_outputs(batch.keys)
        # one fetch for what verl's own leaves out: the step's outcome (uid, rewards, GEC's fields, data_source) for the
        # metrics, the old-log-prob pass's entropy (absent in bypass mode, which skips that pass) and, for verl_ext's
        # estimators, data_source
        fields = ["uid", "rm_scores", "extra_fields", "response_mask", "data_source"]
        if not bypass_mode(self.config):
            fields.append("entropy")
        extra = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
        extra_fields = as_object_array(extra.pop("extra_fields"))
        uid = as_object_array(extra.pop("uid"))
        data_source = as_object_array(extra.pop("data_source"))
        padded = extra.to_padded_tensor()
        entropy = padded.get("entropy", None)
        scores = padded["rm_scores"].sum(-1)
        metrics.update(self._v1_outcome_metrics(extra_fields[members], uid[members],
                                                scores[torch.from_numpy(members)], data_source[members]))
        metrics.update(self._gec_token_metrics({"extra_fields": extra_fields[real]},
                                               padded["response_mask"][torch.from_numpy(real)]))
        spans = spans_of_rows({"extra_fields": extra_fields}, len(batch))  # verl's rollout correction: every row
        if not extension:
            data_source = None

        loss_fields = {}
        gec_rows = {"extra_fields": extra_fields}  # GEC's per-row fields, in the batch's row order

        def routed(data, batch_keys, adv_estimator, *args, **kwargs):
            fitted = None if entropy is None else fit_width(entropy, data.batch["response_mask"])
            if not is_extension_estimator(adv_estimator):  # verl's own computation; diagnostics from its output
                grouped = members if adv_estimator == AdvantageEstimator.GRPO else real
                passes = self._ext_verl_passes(
                    lambda batch: verl_fn(batch, batch_keys, adv_estimator, *args, **kwargs), fitted, grouped)
            else:
                if fitted is not None:  # bypass mode has none: only estimators that need no entropy run (config.py)
                    data.batch[ENTROPY_KEY] = fitted
                if data_source is not None:
                    data.non_tensor_batch["data_source"] = as_object_array(data_source)
                passes = self._ext_estimator_passes(
                    lambda compute: lambda batch: on_final_outputs(batch, batch_keys, real, compute))
            data = self._ext_credited_advantage(data, gec_rows, passes, rows=real)
            # the actor losses' fields (edge_grpo.entropy_grad's, GEC's shaped loss's): none from verl's estimators
            loss_fields.update({k: data.batch[k] for k in (EDA_H_BAR_KEY, EDA_H_OLD_KEY, OFF_POLICY_MASK_KEY)
                                if k in data.batch.keys()})
            return data

        with (replaced(trainer_base, "compute_advantage_for_multi_trajectories", routed) as verl_fn,
              self._ext_offpolicy_metrics_on_sampled_tokens(spans)):
            batch = super()._compute_advantage(batch, metrics)
        if loss_fields:  # verl writes back only advantages/returns; verl_ext's actor losses also read these
            batch = tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id,
                                    fields=TensorDict(loss_fields, batch_size=len(batch)))
        metrics.update(self._ext_take_metrics())
        return batch

    def _compute_metrics(self, batch, metrics, *args, **kwargs):
        # after verl averaged the step's mini-batch metrics (parameter_sync_step > 1): the history's exact count
        metrics.update(self._history_metrics())
        return super()._compute_metrics(batch, metrics, *args, **kwargs)

    def _log_rollout_data(self, batch, timing_raw, rollout_data_dir):
        if not self.ext_config.gec.enable:
            return super()._log_rollout_data(batch, timing_raw, rollout_data_dir)
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                               select_fields=["uid", "responses", "extra_fields", "data_source"])
        responses = data["responses"]
        if getattr(responses, "is_nested", False):  # jagged in TransferQueue; the padding lies past every span
            responses = responses.to_padded_tensor(padding=0)
        real = real_rows(batch.tags)  # verl's padding rows copy row 0's fields: their GEC cells stay empty
        picked = torch.from_numpy(np.nonzero(real)[0])
        columns = self._gec_dump_columns({"extra_fields": as_object_array(data["extra_fields"])[real]},
                                         responses[picked], as_object_array(data["uid"])[real],
                                         as_object_array(data["data_source"])[real])
        columns = blank_rows(columns, real)
        # verl's dump sorts the rows and names each by its TransferQueue key ("uid" column): put ours in its order
        self._ext_dump_rows = ({key: i for i, key in enumerate(batch.keys)}, columns)
        try:
            return super()._log_rollout_data(batch, timing_raw, rollout_data_dir)
        finally:
            self._ext_dump_rows = None

    def _dump_generations(self, inputs, outputs, gts, scores, reward_extra_infos_dict, dump_path):
        pending = getattr(self, "_ext_dump_rows", None)  # set only while _log_rollout_data dumps a training step
        if pending and pending[1] and "uid" in reward_extra_infos_dict:
            row_of, columns = pending
            order = [row_of[key] for key in reward_extra_infos_dict["uid"]]
            reward_extra_infos_dict = {**reward_extra_infos_dict,
                                       **{name: [col[i] for i in order] for name, col in columns.items()}}
        return super()._dump_generations(inputs, outputs, gts, scores, reward_extra_infos_dict, dump_path)

    def _v1_outcome_metrics(self, extra_fields, uid, scores, data_source) -> dict[str, float]:
        """GEC's metrics (when on) and the all-wrong groups per data source, from the step's TransferQueue rows."""
        non_tensor = {"extra_fields": extra_fields}
        self._check_gec_errors(non_tensor)
        return {**self._gec_metrics(non_tensor, uid, scores),
                **self._outcome_metrics(non_tensor, uid, scores, data_source)}


class _TaggedBatches:
    """A dataloader whose batches (dicts of columns) carry the ``TRAINING_ROLLOUT_KEY`` column."""

    def __init__(self, loader, training: bool):
        self.loader = loader
        self.training = training

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        for batch_dict in self.loader:
            column = np.empty(len(batch_dict["raw_prompt"]), dtype=object)
            column[:] = self.training
            yield {**batch_dict, TRAINING_ROLLOUT_KEY: column}  # a new dict: the loader's batches stay as they are


# the tag verl's ``padding_utils.upsample_batch_to_divisible_size`` gives its synthetic rows (checked in verl_compat)
PADDING_TAG = "is_padding"


def real_rows(tags) -> np.ndarray:
    """(B,) bool: the rows of a v1 batch that are not verl's padding (read from the KVBatchMeta tags)."""
    return np.array([not (tag or {}).get(PADDING_TAG, False) for tag in tags], dtype=bool)


def last_outputs(keys) -> np.ndarray:
    """(B,) bool: the rows that are the last output of their ``{uid}_{session}`` (``advantage.final_outputs``)."""
    mask = np.zeros(len(keys), dtype=bool)
    mask[final_outputs(keys)[0]] = True
    return mask


# the last component of verl_ext's metric names that report a running count (the step's value is the last)
RUNNING_COUNTS = ("history_updates", "warmup_batches")
EXT_METRIC_ROOTS = ("gec", "gepo", "edge_grpo", "verl_ext", "hint")


def ext_aggregation(name: str) -> str | None:
    """How a step folds verl_ext's metric ``name`` over its mini-batches: "sum" (counts), "last" (running counts);
    None: verl's rule (for verl_ext's names, on the last component only: a data source may read as "min")."""
    if is_count_metric(name):
        return "sum"
    if name.rpartition("/")[2] in RUNNING_COUNTS:
        return "last"
    return None


@functools.cache
def step_metrics_aggregator() -> type:
    """verl's ``MetricsAggregator`` (what ``PPOTrainer.step`` folds its ``parameter_sync_step`` mini-batches' metrics
    with: it averages, weighted by real rows) with ``ext_aggregation`` for verl_ext's metrics."""
    verl_compat.check_v1_step_metrics()

    class ExtMetricsAggregator(trainer_base.MetricsAggregator):
        def _get_aggregation_type(self, metric_name: str) -> str:
            if metric_name.partition("/")[0] not in EXT_METRIC_ROOTS:
                return super()._get_aggregation_type(metric_name)
            return ext_aggregation(metric_name) or super()._get_aggregation_type(metric_name.rpartition("/")[2])

    return ExtMetricsAggregator


def extended_trainer_cls(base: type[PPOTrainer]) -> type[PPOTrainer]:
    if issubclass(base, ExtV1TrainerMixin):
        return base
    return type(f"Ext{base.__name__}", (ExtV1TrainerMixin, base), {"__module__": __name__})


def install_extension_trainers() -> None:
    """In this (driver) process, map every v1 trainer mode to its verl_ext subclass.

    The mode names stay verl's own ("sync", ...) because verl branches on them (e.g. trainer_mode != "sync") and
    reads ``trainer.v1.<mode>`` options under them. verl's ``register_trainer`` refuses to re-register a name to
    another class, so the registry entries are replaced directly; ``verl_compat.check_v1_trainer`` checks at
    start-up that ``get_trainer_cls`` still reads this registry.
    """
    verl_compat.check_v1_multi_output()
    verl_compat.check_v1_step_metrics()
    for mode, cls in list(TRAINER_REGISTRY.items()):
        TRAINER_REGISTRY[mode] = extended_trainer_cls(cls)
