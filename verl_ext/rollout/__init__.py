"""Rollout extensions: Guided Error Correction (GEC) and +Force-R as the ``gec_agent`` verl agent loop.

``verl_ext.rollout.gec`` is the pure logic (numpy only) and :func:`gec_step_metrics`; the registered agent loop
lives in ``verl_ext.rollout.gec_agent_loop`` (imports verl's agent-loop stack) and is not imported here, so
importing this package stays cheap.
"""

from verl_ext.rollout.gec import BRANCHES, EXTRA_KEYS, gec_step_metrics

GEC_AGENT_NAME = "gec_agent"

__all__ = ["BRANCHES", "EXTRA_KEYS", "GEC_AGENT_NAME", "gec_step_metrics"]
