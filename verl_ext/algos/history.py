"""GroupEntropyHistory: GEPO's driver-side EMA of the entropy thresholds (Eq. 8-9), one entry per scope.

    Ĥ_low = μ_H − β_low·σ_H,  Ĥ_high = μ_H + β_high·σ_H     (this batch's estimate)
    H_*  ← (1 − γ)·H_* + γ·Ĥ_*                              (EMA; seeded by the first estimate, never by 0)

A scope is ``"global"`` (the paper) or a data_source (``stats_scope: per_data_source``).  The state is a plain
JSON-serialisable dict so a checkpoint can carry it and a resumed run shapes exactly as an unbroken one.
"""

from __future__ import annotations

import math

GLOBAL_SCOPE = "global"


class GroupEntropyHistory:
    """Running entropy thresholds per scope; one instance per run, owned by the trainer (driver) process."""

    STATE_VERSION = 1

    def __init__(self):
        self._scopes: dict[str, dict[str, float]] = {}

    def __len__(self) -> int:
        return len(self._scopes)

    def scopes(self) -> list[str]:
        return sorted(self._scopes)

    def thresholds(self, scope: str = GLOBAL_SCOPE) -> tuple[float, float] | None:
        """(H_low, H_high) of ``scope``, or None before its first update."""
        entry = self._scopes.get(scope)
        return None if entry is None else (entry["h_low"], entry["h_high"])

    def num_updates(self, scope: str = GLOBAL_SCOPE) -> int:
        entry = self._scopes.get(scope)
        return 0 if entry is None else int(entry["num_updates"])

    def update(self, scope: str, low_estimate: float, high_estimate: float, gamma: float) -> tuple[float, float]:
        """Fold one batch's (Ĥ_low, Ĥ_high) into ``scope``; the first estimate seeds the EMA."""
        scope = str(scope)
        if not (math.isfinite(low_estimate) and math.isfinite(high_estimate)):
            raise ValueError(f"GEPO threshold estimate for scope {scope!r} is not finite: "
                             f"({low_estimate}, {high_estimate})")
        entry = self._scopes.get(scope)
        if entry is None:
            entry = {"h_low": float(low_estimate), "h_high": float(high_estimate), "num_updates": 1}
        else:
            entry = {
                "h_low": (1.0 - gamma) * entry["h_low"] + gamma * float(low_estimate),
                "h_high": (1.0 - gamma) * entry["h_high"] + gamma * float(high_estimate),
                "num_updates": entry["num_updates"] + 1,
            }
        self._scopes[scope] = entry
        return entry["h_low"], entry["h_high"]

    def state_dict(self) -> dict:
        return {"version": self.STATE_VERSION, "scopes": {k: dict(v) for k, v in self._scopes.items()}}

    def load_state_dict(self, state: dict) -> None:
        if not isinstance(state, dict) or state.get("version") != self.STATE_VERSION or "scopes" not in state:
            raise ValueError(f"not a GroupEntropyHistory state (version {self.STATE_VERSION}): {state!r:.200}")
        scopes = {}
        for scope, entry in state["scopes"].items():
            scopes[str(scope)] = {
                "h_low": float(entry["h_low"]),
                "h_high": float(entry["h_high"]),
                "num_updates": int(entry["num_updates"]),
            }
        self._scopes = scopes

    def __repr__(self) -> str:
        return f"GroupEntropyHistory({self._scopes})"
