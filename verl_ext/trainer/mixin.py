"""The trainer-side glue shared by verl's v1 and legacy trainers.

It owns the run's GroupEntropyHistory on the driver, routes each step's batch to the estimator through
``compute_extension_advantage``, tags the rows it sends to rollout as training or validation while GEC is on
(``names.TRAINING_ROLLOUT_KEY``, read by the ``gec_agent`` loop) and keeps the history in every checkpoint (``global_step_N/verl_ext_state.json``,
written before verl writes its ``latest_checkpointed_iteration.txt``, so a checkpoint verl can resume from always
has it).  Any other ``adv_estimator`` goes through verl untouched; GEC's metrics (``gec/...``) are logged with any estimator,
and with ``trainer.rollout_data_dir`` set verl's rollout dump carries what GEC wrote (``gec_dump.py``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os

import numpy as np
from verl import DataProto

from verl_ext.algos.history import GLOBAL_SCOPE, GroupEntropyHistory
from verl_ext.config import ExtAlgorithmConfig, load_algorithm_config
from verl_ext.trainer.advantage import compute_extension_advantage, is_extension_estimator
from verl_ext.trainer.gec_dump import gec_dump_columns
from verl_ext.trainer.gec_metrics import all_wrong_group_metrics, check_gec_errors, gec_step_metrics

logger = logging.getLogger(__name__)

STATE_FILE = "verl_ext_state.json"


@contextlib.contextmanager
def replaced(module, name: str, replacement):
    """Rebind ``module.name`` for the duration of the block (verl looks these names up at call time)."""
    original = getattr(module, name)
    setattr(module, name, replacement)
    try:
        yield original
    finally:
        setattr(module, name, original)


class EntropyAdvantageMixin:
    """Mixed in front of a verl trainer class; see ``v1.py`` and ``legacy.py`` for the per-trainer hooks."""

    @property
    def entropy_history(self) -> GroupEntropyHistory:
        if getattr(self, "_entropy_history", None) is None:
            self._entropy_history = GroupEntropyHistory()
        return self._entropy_history

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
        return gec_step_metrics(non_tensor_batch, uid, final_scores, correct_threshold=gec.correct_threshold)

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

    def _history_metrics(self) -> dict[str, float]:
        """Batches folded into each GEPO scope so far (one per trained batch, so it shows the history is exact)."""
        history = getattr(self, "_entropy_history", None)
        if history is None:
            return {}
        return {("gepo" if scope == GLOBAL_SCOPE else f"gepo/{scope}") + "/history_updates":
                float(history.num_updates(scope)) for scope in history.scopes()}

    def _ext_install_entropy_grad_loss(self) -> None:
        """edge_grpo.entropy_grad: make verl compute the entropy with gradients in the actor update and give the
        actor the loss that divides by it (``eda_loss.py``); called once the actor worker group exists."""
        if not (self._ext_active() and self.ext_config.edge_grpo.entropy_grad):
            return
        from omegaconf import open_dict

        from verl_ext.trainer.eda_loss import entropy_grad_loss

        with open_dict(self.config):
            self.config.actor_rollout_ref.actor.calculate_entropy = True  # read by verl at every actor update
        self.actor_rollout_wg.set_loss_fn(entropy_grad_loss(self.config))
        print("[verl_ext] edge_grpo.entropy_grad=true: the actor loss back-propagates through H_i(θ)")

    def _ext_take_metrics(self) -> dict[str, float]:
        metrics, self._ext_metrics = getattr(self, "_ext_metrics", None) or {}, None
        return metrics

    # ---- checkpoints (the same hook names in verl's v1 and legacy trainers) ------------------------------------
    def _save_checkpoint(self):
        self._ext_save_state()  # first: verl marks the step complete (latest_checkpointed_iteration.txt) last
        return super()._save_checkpoint()

    def _load_checkpoint(self):
        result = super()._load_checkpoint()
        self._ext_load_state()
        return result

    def _ext_step_dir(self) -> str:
        root = self.config.trainer.default_local_dir
        if not os.path.isabs(root):
            root = os.path.join(os.getcwd(), root)
        return os.path.join(root, f"global_step_{self.global_steps}")

    def _ext_save_state(self) -> None:
        step_dir = self._ext_step_dir()
        os.makedirs(step_dir, exist_ok=True)
        state = {"global_step": self.global_steps, "entropy_history": self.entropy_history.state_dict()}
        tmp = os.path.join(step_dir, STATE_FILE + ".tmp")
        with open(tmp, "w") as f:
            json.dump(state, f, indent=1)
        os.replace(tmp, os.path.join(step_dir, STATE_FILE))  # atomic: never a half-written state

    def _ext_load_state(self) -> None:
        if self.global_steps <= 0:
            return  # training from scratch
        trainer_cfg = self.config.trainer
        if trainer_cfg.resume_mode == "resume_path":
            step_dir = trainer_cfg.resume_from_path
            if not os.path.isabs(step_dir):
                step_dir = os.path.join(os.getcwd(), step_dir)
        else:
            step_dir = self._ext_step_dir()
        path = os.path.join(step_dir, STATE_FILE)
        if not os.path.exists(path):
            # a checkpoint written without verl_ext (or by a run of another estimator): there is no state to lose
            logger.warning("verl_ext: %s not found; GEPO thresholds start from the next batch", path)
            print(f"[verl_ext] WARNING: no {STATE_FILE} in {step_dir}; entropy history starts fresh")
            return
        with open(path) as f:
            state = json.load(f)
        self.entropy_history.load_state_dict(state["entropy_history"])
        print(f"[verl_ext] restored entropy history from {path}: {json.dumps(self.entropy_history.state_dict())}")
