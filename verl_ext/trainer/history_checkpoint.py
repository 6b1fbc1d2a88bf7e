"""GEPO's driver-side history on the trainer, and its place in every checkpoint.

The run's ``GroupEntropyHistory`` lives on the driver. ``_save_checkpoint`` writes it to
``global_step_N/verl_ext_state.json`` before verl writes its ``latest_checkpointed_iteration.txt`` (so a checkpoint verl
can resume from always has it); ``_load_checkpoint`` restores it, so a resumed run shapes exactly like an unbroken one.
A GEPO run resumed from a checkpoint without it stops, unless ``algorithm.gepo.allow_fresh_history=true``.
The hook names are the same in verl's v1 and legacy trainers.
"""

from __future__ import annotations

import json
import logging
import os

from verl_ext.algos.history import GLOBAL_SCOPE, GroupEntropyHistory
from verl_ext.config import load_algorithm_config

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "INFO"))  # what a resume restored shows (verl's root handler)

STATE_FILE = "verl_ext_state.json"


class EntropyHistoryMixin:
    """Mixed in front of a verl trainer class (through ``mixin.ExtTrainerMixin``)."""

    @property
    def entropy_history(self) -> GroupEntropyHistory:
        if getattr(self, "_entropy_history", None) is None:
            self._entropy_history = GroupEntropyHistory()
        return self._entropy_history

    def _history_metrics(self) -> dict[str, float]:
        """Batches folded into each GEPO scope so far (one per trained batch, so it shows the history is exact)."""
        history = getattr(self, "_entropy_history", None)
        if history is None:
            return {}
        return {("gepo" if scope == GLOBAL_SCOPE else f"gepo/{scope}") + "/history_updates":
                float(history.num_updates(scope)) for scope in history.scopes()}

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

    def _ext_resume_dir(self) -> str:
        """The step folder a resumed run loads (``resume_path``: trainer.resume_from_path; else the latest step)."""
        trainer_cfg = self.config.trainer
        if trainer_cfg.resume_mode != "resume_path":
            return self._ext_step_dir()
        step_dir = trainer_cfg.resume_from_path
        return step_dir if os.path.isabs(step_dir) else os.path.join(os.getcwd(), step_dir)

    def _ext_load_state(self) -> None:
        if self.global_steps <= 0:
            return  # training from scratch
        path = os.path.join(self._ext_resume_dir(), STATE_FILE)
        if not os.path.exists(path):
            self._ext_missing_state(path)
            return
        with open(path) as f:
            state = json.load(f)
        self.entropy_history.load_state_dict(state["entropy_history"])
        logger.info("[verl_ext] restored entropy history from %s: %s", path,
                    json.dumps(self.entropy_history.state_dict()))

    def _ext_missing_state(self, path: str) -> None:
        """A checkpoint without verl_ext's state: GEPO would restart its thresholds, so it stops unless
        ``algorithm.gepo.allow_fresh_history=true``; other estimators have no state to lose."""
        if str(self.config.algorithm.adv_estimator) != "gepo":
            logger.debug("verl_ext: %s not found (no GEPO history to restore)", path)
            return
        if not load_algorithm_config(self.config.algorithm).gepo.allow_fresh_history:
            raise RuntimeError(
                f"verl_ext: resuming algorithm.adv_estimator=gepo at step {self.global_steps}, but {path} does not "
                f"exist (a checkpoint written without verl_ext or by a run of another estimator), so GEPO's entropy "
                f"thresholds would restart from the next batch instead of continuing; resume from a checkpoint "
                f"that has it, or set algorithm.gepo.allow_fresh_history=true to start the history fresh")
        logger.warning("verl_ext: %s not found and algorithm.gepo.allow_fresh_history=true: GEPO's entropy "
                       "history starts fresh from the next batch", path)
