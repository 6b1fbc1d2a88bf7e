"""GroupEntropyHistory: GEPO's driver-side thresholds (Eq. 8-9), one running entry per scope.

    Ĥ_low = μ_H − β_low·σ_H,  Ĥ_high = μ_H + β_high·σ_H     (an estimate from group entropies H_g)
    H_*  ← (1 − γ)·H_* + γ·Ĥ_*                              (threshold_source "ema", the paper)

Each scope (``"global"``, the paper, or a data_source with ``stats_scope: per_data_source``) keeps the EMA
thresholds and a bounded window of the last ``window_size`` batches' entropy moments (count, mean, Σ(H−mean)²).
Moments pool exactly (Chan et al.), so the window gives the same μ/σ as the concatenated group entropies while
staying a few numbers per batch.  The window serves

* ``ema_init: warmup_pool``: the first ``warmup_steps`` batches are pooled and nothing is shaped; the thresholds are
  seeded from the pool's μ/σ at batch ``warmup_steps`` (which is shaped), then the EMA takes over.  ``first_batch``
  (the default) seeds from the first batch alone.  Never from 0 (with γ = 0.01 that would damp every negative for
  ~100 steps).
* ``threshold_source: window``: the thresholds are Ĥ of the pooled window itself (follows a shift within
  ``window_size`` batches instead of the EMA's ~1/γ).

The state is a plain JSON-serialisable dict, so a checkpoint carries it and a resumed run shapes exactly as an
unbroken one; states of version 1 (EMA only, no window) still load.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GLOBAL_SCOPE = "global"


@dataclass(frozen=True)
class EntropyMoments:
    """count, mean and M2 = Σ(H − mean)² of a set of group entropies."""

    count: int
    mean: float
    m2: float

    @classmethod
    def of(cls, values) -> EntropyMoments:
        """Moments of a 1-D tensor (or sequence) of finite values, in float64."""
        import torch

        h = torch.as_tensor(values, dtype=torch.float64).reshape(-1)
        if h.numel() == 0:
            return cls(0, 0.0, 0.0)
        mean = h.mean()
        return cls(int(h.numel()), mean.item(), ((h - mean) ** 2).sum().item())

    @staticmethod
    def pooled(parts) -> EntropyMoments:
        """The moments of the union of ``parts`` (parallel-variance combination; exact up to rounding)."""
        count, mean, m2 = 0, 0.0, 0.0
        for p in parts:
            if p.count == 0:
                continue
            total = count + p.count
            delta = p.mean - mean
            mean += delta * p.count / total
            m2 += p.m2 + delta * delta * count * p.count / total
            count = total
        return EntropyMoments(count, mean, m2)

    def std(self, unbiased: bool = False) -> float:
        if self.count == 0:
            return 0.0
        denom = self.count - 1 if (unbiased and self.count > 1) else self.count
        return math.sqrt(max(self.m2, 0.0) / denom)

    def as_list(self) -> list:
        return [self.count, self.mean, self.m2]


@dataclass(frozen=True)
class ThresholdRule:
    """How a scope turns batches into thresholds (the ``algorithm.gepo`` keys of the same names)."""

    beta_low: float = 0.2
    beta_high: float = 0.3
    ema_gamma: float = 0.01
    std_unbiased: bool = False
    threshold_source: str = "ema"
    ema_init: str = "first_batch"
    warmup_steps: int = 0
    window_size: int = 20

    def estimate(self, moments: EntropyMoments) -> tuple[float, float]:
        """(Ĥ_low, Ĥ_high) from the moments of some group entropies (Eq. 8)."""
        sigma = moments.std(self.std_unbiased)
        return moments.mean - self.beta_low * sigma, moments.mean + self.beta_high * sigma

    def batches_to_seed(self) -> int:
        return max(1, self.warmup_steps) if self.ema_init == "warmup_pool" else 1


class GroupEntropyHistory:
    """Running entropy thresholds per scope; one instance per run, owned by the trainer (driver) process."""

    STATE_VERSION = 2
    LOADABLE_VERSIONS = (1, 2)

    def __init__(self):
        # scope -> {"h_low": float|None, "h_high": float|None, "num_updates": int, "window": [EntropyMoments]}
        self._scopes: dict[str, dict] = {}

    def __len__(self) -> int:
        return len(self._scopes)

    def scopes(self) -> list[str]:
        return sorted(self._scopes)

    def thresholds(self, scope: str = GLOBAL_SCOPE) -> tuple[float, float] | None:
        """(H_low, H_high) of ``scope``, or None before it is seeded (no batch yet, or still warming up)."""
        entry = self._scopes.get(scope)
        if entry is None or entry["h_low"] is None:
            return None
        return entry["h_low"], entry["h_high"]

    def num_updates(self, scope: str = GLOBAL_SCOPE) -> int:
        """Batches folded into ``scope`` so far (warm-up batches included)."""
        entry = self._scopes.get(scope)
        return 0 if entry is None else int(entry["num_updates"])

    def window(self, scope: str = GLOBAL_SCOPE) -> list[EntropyMoments]:
        """The moments of the last batches of ``scope``, oldest first."""
        entry = self._scopes.get(scope)
        return [] if entry is None else list(entry["window"])

    def update(self, scope: str, moments: EntropyMoments, rule: ThresholdRule) -> tuple[float, float] | None:
        """Fold one batch's group-entropy moments into ``scope``; returns the thresholds now in force (or None)."""
        scope = str(scope)
        if moments.count <= 0 or not (math.isfinite(moments.mean) and math.isfinite(moments.m2)):
            raise ValueError(f"GEPO entropy moments for scope {scope!r} are empty or not finite: {moments}")
        entry = self._scopes.setdefault(scope, {"h_low": None, "h_high": None, "num_updates": 0, "window": []})
        window = entry["window"]
        window.append(moments)
        entry["num_updates"] += 1
        seeded = entry["h_low"] is not None
        need = rule.batches_to_seed()
        if not seeded and len(window) < need:
            return None  # warming up: pool, shape nothing
        if rule.threshold_source == "window":  # the warm-up pool seeds even when it is longer than the window
            span = rule.window_size if seeded else max(need, rule.window_size)
            low, high = rule.estimate(EntropyMoments.pooled(window[-span:]))
        elif not seeded:
            low, high = rule.estimate(EntropyMoments.pooled(window[-need:]))
        else:
            low_hat, high_hat = rule.estimate(moments)
            g = rule.ema_gamma
            low, high = (1.0 - g) * entry["h_low"] + g * low_hat, (1.0 - g) * entry["h_high"] + g * high_hat
        if not (math.isfinite(low) and math.isfinite(high)):
            raise ValueError(f"GEPO thresholds for scope {scope!r} are not finite: ({low}, {high})")
        entry["h_low"], entry["h_high"] = float(low), float(high)
        del window[: max(0, len(window) - rule.window_size)]  # bounded (the warm-up pool may exceed it until seeded)
        return entry["h_low"], entry["h_high"]

    def state_dict(self) -> dict:
        return {
            "version": self.STATE_VERSION,
            "scopes": {
                scope: {"h_low": e["h_low"], "h_high": e["h_high"], "num_updates": e["num_updates"],
                        "window": [m.as_list() for m in e["window"]]}
                for scope, e in self._scopes.items()
            },
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore a state of version 2, or of version 1 (EMA thresholds only; the window starts empty)."""
        if (not isinstance(state, dict) or state.get("version") not in self.LOADABLE_VERSIONS
                or not isinstance(state.get("scopes"), dict)):
            raise ValueError(f"not a GroupEntropyHistory state (versions {self.LOADABLE_VERSIONS}): {state!r:.200}")
        scopes = {}
        for scope, e in state["scopes"].items():
            h_low, h_high = e.get("h_low"), e.get("h_high")
            if (h_low is None) != (h_high is None):
                raise ValueError(f"GroupEntropyHistory state of scope {scope!r} has only one threshold: {e!r:.200}")
            scopes[str(scope)] = {
                "h_low": None if h_low is None else float(h_low),
                "h_high": None if h_high is None else float(h_high),
                "num_updates": int(e["num_updates"]),
                "window": [EntropyMoments(int(c), float(m), float(m2)) for c, m, m2 in e.get("window", [])],
            }
        self._scopes = scopes

    def __repr__(self) -> str:
        return f"GroupEntropyHistory({self.state_dict()['scopes']})"
