"""verl's next release (verl main, 0.10.0.dev; docs/verl-integration.md, "verl's next release"): each break found
there is one clear :class:`VerlCompatError` at start-up, or made to work on both verls. These tests run on the
installed verl (0.9.1) by removing the piece the way verl main or its ``neo`` branch does."""

from __future__ import annotations

import importlib.util
import sys

import pytest
import ray
from omegaconf import OmegaConf

from tests.unit.test_gec import (  # noqa: F401
    FakeServer,
    make_config,
    reward_path,
    run_loop,
    tok,
    verl_loop,
)
from tests.unit.test_verl_compat import _assert_clear
from verl_ext import verl_compat
from verl_ext.verl_compat import VerlCompatError

REFLECT = {"p_reflect": 1.0, "p_answer": 0.0, "p_solution": 0.0}
PAYLOAD = [{"format": "processor_output", "pixel_values_videos": [0.0]}]


def test_v1_trainer_without_transfer_queue(monkeypatch):
    """verl main makes TransferQueue an optional extra; its v1 modules import it at the top."""
    monkeypatch.setitem(sys.modules, "transfer_queue", None)  # `import transfer_queue` raises ImportError
    with pytest.raises(VerlCompatError) as e:
        verl_compat.check_v1_trainer()
    _assert_clear(e, "transfer_queue", "TransferQueue>=0.1.10", "trainer.use_v1=false")


def test_v1_trainer_removed(monkeypatch):
    """verl's ``neo`` branch drops ``TaskRunnerV1`` (and routes ``main_ppo`` to the legacy trainer)."""
    monkeypatch.delattr("verl.trainer.main_ppo.TaskRunnerV1")
    with pytest.raises(VerlCompatError) as e:
        verl_compat.check_v1_trainer()
    _assert_clear(e, "TaskRunnerV1", "trainer.use_v1=false")


def test_main_refuses_v1_without_transfer_queue_before_ray(monkeypatch):
    from verl_ext import main

    monkeypatch.setattr(main, "prepare", lambda config: None)
    monkeypatch.setitem(sys.modules, "transfer_queue", None)
    started = []
    monkeypatch.setattr("verl.trainer.main_ppo.run_ppo", lambda *a, **k: started.append(a))
    with pytest.raises(VerlCompatError) as e:
        main.run(OmegaConf.create({"trainer": {"use_v1": True}}))
    _assert_clear(e, "transfer_queue")
    assert not started and not ray.is_initialized()


def test_runner_module_loads_without_the_v1_trainer(monkeypatch):
    """The legacy runner stays usable on a verl without ``TaskRunnerV1`` (the module is loaded afresh, beside the
    imported one)."""
    from verl_ext.trainer import runner

    monkeypatch.delattr("verl.trainer.main_ppo.TaskRunnerV1")
    spec = importlib.util.spec_from_file_location("verl_ext_runner_without_v1", runner.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.ExtTaskRunnerV1 is None
    assert module.ExtTaskRunnerLegacy.__ray_actor_class__.run is not None


class RecordingServer(FakeServer):
    def __init__(self, tokenizer):
        super().__init__(tokenizer)
        self.kwargs = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        self.kwargs.append(kwargs)
        return await super().generate(request_id, prompt_ids=prompt_ids, sampling_params=sampling_params)


def test_gec_continuation_sends_no_video_payload_it_does_not_have(tok, reward_path, verl_loop):  # noqa: F811
    """verl main's server ``generate`` has no ``mm_processor_output`` argument (verl 0.9.1's client consumes it,
    verl main's forwards it: a TypeError on the server): the continuation passes it only when set."""
    server = RecordingServer(tok)
    out = run_loop(tok, make_config(reward_path, **REFLECT), server)
    assert out.extra_fields["gec_branch"] == "reflect" and len(server.kwargs) == 2
    assert "mm_processor_output" not in server.kwargs[1]


def test_gec_continuation_keeps_a_set_video_payload(tok, reward_path, verl_loop):  # noqa: F811
    """verl 0.9.1's SGLang video payload (``AgentLoopOutput.mm_processor_output``) still reaches the continuation."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopOutput

    from verl_ext.rollout.gec_agent_loop import GecAgentLoop

    if "mm_processor_output" not in AgentLoopOutput.model_fields:
        pytest.skip("this verl has no AgentLoopOutput.mm_processor_output (verl main)")

    class WithPayload(GecAgentLoop):
        async def _correct(self, output, *args):
            output.mm_processor_output = PAYLOAD
            return await super()._correct(output, *args)

    server = RecordingServer(tok)
    out = run_loop(tok, make_config(reward_path, **REFLECT), server, agent_cls=WithPayload)
    assert out.extra_fields["gec_branch"] == "reflect"
    assert server.kwargs[1]["mm_processor_output"] == PAYLOAD
