"""verl's legacy ``RayPPOTrainer`` (``trainer.use_v1=false``) with verl_ext's advantage routing.

Hooks: ``_compute_old_log_prob`` keeps a copy of the per-token entropy (``fit()`` pops ``entropys``
after logging it), ``fit`` routes the module-level ``compute_advantage`` (the only advantage call site of the
legacy loop, looked up at call time) through the shared function while it runs (any other estimator: verl's own
function, and the step diagnostics from its output) and, with GEC on, hands verl's rollout-vs-actor diagnostics the
sampled tokens only (``rollout_diagnostics.py``), ``_update_actor`` adds the step's advantage and GEC metrics to
the actor metrics that ``fit()`` logs, ``_log_rollout_data`` adds GEC's columns to verl's rollout dump, ``_get_gen_batch`` tags rows as training or validation rollouts while GEC is
on (``_validate`` marks its calls); the mixin's checkpoint hooks keep the history; GEC's credit options
(``gec_advantage.py``) act on the advantages of either kind of estimator; ``init_workers`` installs verl_ext's actor
loss when one is on (entropy_grad, GEC's shaped loss).
"""

from __future__ import annotations

import contextlib

from verl.trainer.ppo import ray_trainer
from verl.trainer.ppo.ray_trainer import RayPPOTrainer, compute_response_mask

from verl_ext.names import TRAINING_ROLLOUT_KEY
from verl_ext.trainer.advantage import ENTROPY_KEY, is_extension_estimator
from verl_ext.trainer.eda_loss import summarize_entropy_grad_metrics
from verl_ext.trainer.gec_loss import summarize_shaped_loss_metrics
from verl_ext.trainer.mixin import ExtTrainerMixin, replaced
from verl_ext.trainer.rollout_diagnostics import spans_of_rows


class ExtRayPPOTrainer(ExtTrainerMixin, RayPPOTrainer):
    def init_workers(self):
        super().init_workers()
        self._ext_install_actor_loss()

    def _validate(self, *args, **kwargs):
        self._ext_validating = True  # read by _get_gen_batch, which verl calls from fit() and _validate() alike
        try:
            return super()._validate(*args, **kwargs)
        finally:
            self._ext_validating = False

    def _get_gen_batch(self, batch):
        gen_batch = super()._get_gen_batch(batch)
        tags = self._ext_rollout_tags(len(batch), training=not getattr(self, "_ext_validating", False))
        if tags is not None:
            gen_batch.non_tensor_batch[TRAINING_ROLLOUT_KEY] = tags
        return gen_batch

    def _compute_old_log_prob(self, batch):
        old_log_prob, mfu = super()._compute_old_log_prob(batch)
        old_log_prob.batch[ENTROPY_KEY] = old_log_prob.batch["entropys"]  # any estimator: for the step diagnostics
        return old_log_prob, mfu

    def fit(self):
        with (replaced(ray_trainer, "compute_advantage", self._routed_compute_advantage) as verl_compute_advantage,
              self._ext_rollout_diagnostics()):
            self._verl_compute_advantage = verl_compute_advantage
            return super().fit()

    @contextlib.contextmanager
    def _ext_rollout_diagnostics(self):
        """While ``fit`` runs with GEC on, verl's rollout-vs-actor diagnostics see the tokens an engine sampled only
        (``rollout_diagnostics``): ``fit`` imports ``calculate_debug_metrics`` and
        ``compute_rollout_correction_and_add_to_batch`` from their modules at every step, and both are handed the
        batch, whose ``gec_spans`` column says which tokens GEC injected."""
        if not self._ext_diagnoses_sampled_tokens():
            yield
            return
        from verl.trainer.ppo import rollout_corr_helper
        from verl.utils.debug import metrics as debug_metrics

        verl_correction = rollout_corr_helper.compute_rollout_correction_and_add_to_batch

        def correction(batch, rollout_corr_config):
            with self._ext_offpolicy_metrics_on_sampled_tokens(spans_of_rows(batch.non_tensor_batch, len(batch))):
                return verl_correction(batch, rollout_corr_config)

        with (self._ext_debug_metrics_on_sampled_tokens(
                debug_metrics, lambda data: spans_of_rows(data.non_tensor_batch, len(data))),
              replaced(rollout_corr_helper, "compute_rollout_correction_and_add_to_batch", correction)):
            yield

    def _routed_compute_advantage(self, data, adv_estimator, *args, **kwargs):
        self._check_gec_errors(data.non_tensor_batch)  # before the step trains on rows GEC could not use
        if "response_mask" not in data.batch.keys():  # as verl's compute_advantage adds it
            data.batch["response_mask"] = compute_response_mask(data)
        if not is_extension_estimator(adv_estimator):  # verl's own computation, on the batch verl would pass it
            entropy = data.batch.pop(ENTROPY_KEY, None)
            passes = self._ext_verl_passes(
                lambda batch: self._verl_compute_advantage(batch, adv_estimator, *args, **kwargs), entropy)
        else:
            passes = self._ext_estimator_passes()
        data = self._ext_credited_advantage(data, data.non_tensor_batch, passes)
        data.batch.pop(ENTROPY_KEY, None)  # not needed by the actor update
        return data

    def _log_rollout_data(self, batch, reward_extra_infos_dict, timing_raw, rollout_data_dir):
        # verl dumps every list of per-row values it is handed next to its own columns: add what GEC wrote
        columns = self._gec_dump_columns(batch.non_tensor_batch, batch.batch["responses"],
                                         batch.non_tensor_batch["uid"], batch.non_tensor_batch.get("data_source"))
        return super()._log_rollout_data(batch, {**reward_extra_infos_dict, **columns}, timing_raw, rollout_data_dir)

    def _update_actor(self, batch):
        actor_output = super()._update_actor(batch)
        metrics = actor_output.meta_info["metrics"]
        summarize_entropy_grad_metrics(metrics)
        summarize_shaped_loss_metrics(metrics)
        metrics.update(self._ext_take_metrics())
        final_scores = batch.batch["token_level_scores"].sum(-1)
        metrics.update(self._gec_metrics(batch.non_tensor_batch, batch.non_tensor_batch["uid"], final_scores))
        metrics.update(self._gec_token_metrics(batch.non_tensor_batch, batch.batch["response_mask"]))
        metrics.update(self._outcome_metrics(batch.non_tensor_batch, batch.non_tensor_batch["uid"], final_scores,
                                             batch.non_tensor_batch.get("data_source")))
        return actor_output
