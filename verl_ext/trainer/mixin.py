"""The verl_ext side of a trainer, shared by verl's v1 and legacy trainers (``ExtTrainerMixin``).

It routes each step's batch to a verl_ext estimator through ``compute_extension_advantage`` (any other
``adv_estimator`` goes through verl untouched), logs the step's outcome metrics (``gec/...`` with GEC on, all-wrong
groups always), tags the rows it sends to rollout as training or validation while GEC is on
(``names.TRAINING_ROLLOUT_KEY``, read by the ``gec_agent`` loop), adds GEC's columns to verl's rollout dump
(``gec_dump.py``), hands verl's rollout-vs-actor diagnostics the sampled tokens only while GEC is on
(``rollout_diagnostics.py``) and installs the actor loss of ``edge_grpo.entropy_grad``. GEPO's history and its checkpointing:
``history_checkpoint.py``.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
from collections.abc import Callable

import numpy as np
from verl import DataProto

from verl_ext.config import ExtAlgorithmConfig, load_algorithm_config
from verl_ext.trainer.advantage import compute_extension_advantage, is_extension_estimator, verl_step_diagnostics
from verl_ext.trainer.gec_advantage import EstimatorPass, advantages_with_credit
from verl_ext.trainer.gec_dump import gec_dump_columns
from verl_ext.trainer.gec_metrics import all_wrong_group_metrics, check_gec_errors, gec_step_metrics, hint_metrics
from verl_ext.trainer.history_checkpoint import EntropyHistoryMixin
from verl_ext.trainer.rollout_diagnostics import (
    debug_metrics_on_sampled_tokens,
    injected_token_frac,
    offpolicy_metrics_on_sampled_tokens,
    spans_of_rows,
)

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "INFO"))


class FrozenHistory:
    """A read-only view of a ``GroupEntropyHistory``: ``update`` returns the current thresholds and changes nothing."""

    def __init__(self, history):
        self._history = history

    def update(self, scope, moments, rule):
        return self._history.thresholds(scope)

    def __getattr__(self, name):
        return getattr(self._history, name)


@contextlib.contextmanager
def replaced(module, name: str, replacement):
    """Rebind ``module.name`` for the duration of the block (verl looks these names up at call time)."""
    original = getattr(module, name)
    setattr(module, name, replacement)
    try:
        yield original
    finally:
        setattr(module, name, original)


class ExtTrainerMixin(EntropyHistoryMixin):
    """Mixed in front of a verl trainer class; see ``v1.py`` and ``legacy.py`` for the per-trainer hooks."""

    @property
    def ext_config(self) -> ExtAlgorithmConfig:
        if getattr(self, "_ext_config", None) is None:
            self._ext_config = load_algorithm_config(self.config.algorithm)
        return self._ext_config

    def _ext_active(self) -> bool:
        return is_extension_estimator(self.config.algorithm.adv_estimator)

    def _gec_metrics(self, non_tensor_batch: dict, uid, final_scores) -> dict[str, float]:
        """GEC's before/after metrics of the step (any adv_estimator); {} when GEC is off."""
        gec = self.ext_config.gec
        if not gec.enable:
            return {}
        metrics = gec_step_metrics(non_tensor_batch, uid, final_scores, correct_threshold=gec.correct_threshold)
        if gec.mode == "hint":
            metrics.update(hint_metrics(non_tensor_batch, uid, len(gec.hint_levels)))
        return metrics

    def _gec_token_metrics(self, non_tensor_batch: dict, response_mask) -> dict[str, float]:
        """``gec/injected_token_frac``: the share of the step's trained tokens (``response_mask``) GEC injected, so a
        GEC step tells itself apart from a rollout/actor mismatch at a glance; {} when GEC is off."""
        if not self.ext_config.gec.enable:
            return {}
        spans = spans_of_rows(non_tensor_batch, len(response_mask))
        return {"gec/injected_token_frac": injected_token_frac(response_mask, spans)}

    def _ext_diagnoses_sampled_tokens(self) -> bool:
        """Whether verl's rollout-vs-actor diagnostics must leave GEC's injected tokens out (``rollout_diagnostics``):
        GEC on and its injected tokens in the response mask (``mask_injected=true`` takes them out itself)."""
        gec = self.ext_config.gec
        return gec.enable and not gec.mask_injected

    @contextlib.contextmanager
    def _ext_debug_metrics_on_sampled_tokens(self, module, spans_of: Callable[[DataProto], list]):
        """While the block runs, verl's ``calculate_debug_metrics`` (the name ``module`` calls) sees the tokens an
        engine sampled only; ``spans_of(data)``: GEC's pieces of each row of the batch verl passes it."""
        if not self._ext_diagnoses_sampled_tokens():
            yield
            return
        verl_fn = module.calculate_debug_metrics

        def calculate_debug_metrics(data: DataProto) -> dict:
            return debug_metrics_on_sampled_tokens(verl_fn, data, spans_of(data))

        with replaced(module, "calculate_debug_metrics", calculate_debug_metrics):
            yield

    @contextlib.contextmanager
    def _ext_offpolicy_metrics_on_sampled_tokens(self, spans_rows: list):
        """While the block runs, verl's ``compute_offpolicy_metrics`` (``rollout_corr/*``, called by verl's rollout
        correction) sees the tokens an engine sampled only; ``spans_rows``: GEC's pieces of each row it is given."""
        if not self._ext_diagnoses_sampled_tokens():
            yield
            return
        from verl.trainer.ppo import rollout_corr_helper

        verl_fn = rollout_corr_helper.compute_offpolicy_metrics

        def compute_offpolicy_metrics(old_log_prob, rollout_log_prob, response_mask) -> dict:
            return offpolicy_metrics_on_sampled_tokens(verl_fn, spans_rows, old_log_prob, rollout_log_prob,
                                                       response_mask)

        with replaced(rollout_corr_helper, "compute_offpolicy_metrics", compute_offpolicy_metrics):
            yield

    def _check_gec_errors(self, non_tensor_batch: dict) -> None:
        """Stop the run when too many of the step's GEC rows had unusable data (before the step trains on them)."""
        gec = self.ext_config.gec
        if gec.enable:
            check_gec_errors(non_tensor_batch, gec.max_error_frac)

    def _outcome_metrics(self, non_tensor_batch: dict, uid, final_scores, data_source) -> dict[str, float]:
        """All-wrong groups of the step before correction, overall and per data source (any estimator, GEC or not)."""
        return all_wrong_group_metrics(non_tensor_batch, uid, final_scores, data_source,
                                       correct_threshold=self.ext_config.gec.correct_threshold)

    def _gec_dump_columns(self, non_tensor_batch: dict, responses, uid, data_source) -> dict[str, list]:
        """What GEC wrote, as extra columns of verl's rollout dump (``gec_dump.py``); {} when GEC is off."""
        if not self.ext_config.gec.enable:
            return {}

        def batch_decode(pieces):
            return self.tokenizer.batch_decode(pieces, skip_special_tokens=True)  # as verl's own dump decodes

        return gec_dump_columns(non_tensor_batch, responses, uid, data_source, batch_decode) or {}

    def _ext_rollout_tags(self, num_rows: int, training: bool) -> np.ndarray | None:
        """The ``names.TRAINING_ROLLOUT_KEY`` column for rows sent to rollout (None while GEC is off: verl's batch
        stays as verl builds it). ``gec_agent`` corrects only rows tagged True."""
        if not self.ext_config.gec.enable:
            return None
        column = np.empty(num_rows, dtype=object)
        column[:] = bool(training)
        return column

    def _ext_compute_advantage(self, data: DataProto, rows: np.ndarray | None = None) -> DataProto:
        """verl_ext's estimator on ``data`` (only ``rows``, when given: see ``compute_extension_advantage``)."""
        data, metrics = compute_extension_advantage(
            data, str(self.config.algorithm.adv_estimator), self.config.algorithm, self.entropy_history, rows
        )
        metrics.update(self._history_metrics())
        self._ext_metrics = metrics
        return data

    def _ext_estimator_passes(self, per_session=None) -> tuple[EstimatorPass, Callable[[], EstimatorPass]]:
        """verl_ext's estimator as the two passes of ``advantages_with_credit``: the step's (``_ext_compute_advantage``:
        the step's metrics, one update of GEPO's history) and the r0 pass, prepared before it: no step metrics, the
        thresholds the step's pass shaped with and no second update of the run's history (``update_before_shaping``,
        the paper: the history as the step leaves it, read-only; otherwise a copy taken before the step's pass).

        ``per_session(compute)``: the pass made of ``compute(data, rows)`` (v1: ``on_final_outputs``); None:
        ``compute`` itself.
        """
        per_session = per_session or (lambda compute: compute)

        def prepare_r0_pass() -> EstimatorPass:
            snapshot = None if self.ext_config.gepo.update_before_shaping else copy.deepcopy(self.entropy_history)

            def compute(data: DataProto, rows: np.ndarray | None = None) -> DataProto:
                history = FrozenHistory(self.entropy_history) if snapshot is None else snapshot
                return compute_extension_advantage(data, str(self.config.algorithm.adv_estimator),
                                                   self.config.algorithm, history, rows)[0]
            return per_session(compute)

        return per_session(self._ext_compute_advantage), prepare_r0_pass

    def _ext_verl_passes(self, verl_pass: EstimatorPass, entropy,
                         diagnosed_rows: np.ndarray | None = None) -> tuple[EstimatorPass, Callable[[], EstimatorPass]]:
        """verl's own estimator (``verl_pass``) as the two passes of ``advantages_with_credit``: the step's also logs
        the step diagnostics of its output (``verl_step_diagnostics`` of ``diagnosed_rows``, with the old-log-prob
        pass's per-token ``entropy``); the r0 pass is ``verl_pass`` itself."""
        def step_pass(data: DataProto) -> DataProto:
            data = verl_pass(data)
            self._ext_metrics = verl_step_diagnostics(data, entropy, diagnosed_rows)
            return data
        return step_pass, lambda: verl_pass

    def _ext_credited_advantage(self, data: DataProto, non_tensor_batch: dict, passes,
                                rows: np.ndarray | None = None) -> DataProto:
        """The step's advantages from ``passes`` (``_ext_estimator_passes`` / ``_ext_verl_passes``) with GEC's credit
        options on them (``gec_advantage.advantages_with_credit``), their metrics added to the step's."""
        data, metrics = advantages_with_credit(data, non_tensor_batch, self.ext_config.gec, *passes, rows=rows)
        if metrics:
            self._ext_metrics = {**(getattr(self, "_ext_metrics", None) or {}), **metrics}
        return data

    def _ext_install_actor_loss(self) -> None:
        """verl_ext's actor loss, when one is on (at most one: ``run_checks``); called once the actor worker group
        exists."""
        if self.ext_config.gec.enable and self.ext_config.gec.injected_loss == "shaped":
            from verl_ext.trainer.gec_loss import shaped_injected_loss

            self.actor_rollout_wg.set_loss_fn(shaped_injected_loss(self.config))
            logger.info("[verl_ext] gec.injected_loss=shaped: injected answer/solution tokens trained off-policy "
                        "(LUFFY's policy shaping, gamma=%s)", self.ext_config.gec.shaping_gamma)
        self._ext_install_entropy_grad_loss()

    def _ext_install_entropy_grad_loss(self) -> None:
        """edge_grpo.entropy_grad: make verl compute the entropy with gradients in the actor update and give the
        actor the loss that divides by it (``eda_loss.py``)."""
        if not (self._ext_active() and self.ext_config.edge_grpo.entropy_grad):
            return
        from omegaconf import open_dict

        from verl_ext.trainer.eda_loss import entropy_grad_loss

        with open_dict(self.config):
            self.config.actor_rollout_ref.actor.calculate_entropy = True  # read by verl at every actor update
        self.actor_rollout_wg.set_loss_fn(entropy_grad_loss(self.config))
        logger.info("[verl_ext] edge_grpo.entropy_grad=true: the actor loss back-propagates through H_i(θ)")

    def _ext_take_metrics(self) -> dict[str, float]:
        metrics, self._ext_metrics = getattr(self, "_ext_metrics", None) or {}, None
        return metrics
