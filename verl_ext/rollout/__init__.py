"""Rollout extensions: Guided Error Correction (GEC) and +Force-R as the ``gec_agent`` verl agent loop.

``verl_ext.rollout.gec`` is the pure logic (numpy only); the registered agent loop lives in
``verl_ext.rollout.gec_agent_loop`` (imports verl's agent-loop stack) and is not imported here, so importing this
package stays cheap. The trainer-side step metrics are ``verl_ext.trainer.gec_metrics``.
"""
