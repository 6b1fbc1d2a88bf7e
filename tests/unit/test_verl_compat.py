"""verl_ext.verl_compat: the start-up checks of what verl_ext relies on inside verl pass on the installed verl, and
each one fails with the one clear error (naming the verl version verl_ext was written for) when a piece is missing."""

from __future__ import annotations

import pytest

import verl_ext.plugin
from verl_ext import verl_compat
from verl_ext.verl_compat import VERL_VERSION, VerlCompatError, installed_verl_version


def _assert_clear(error: pytest.ExceptionInfo, *names: str) -> None:
    message = str(error.value)
    assert message.startswith(f"verl_ext was written for verl {VERL_VERSION}: ")
    assert f"not found in verl {installed_verl_version()}" in message
    for name in names:
        assert name in message


@pytest.mark.parametrize("check", ["check_legacy_trainer", "check_v1_trainer", "check_agent_loop",
                                   "check_reward_manager", "check_actor_loss_fn", "check_fsdp_optimizer_config",
                                   "check_cpu_platform", "check_cpu_mode", "check_cpu_checkpoint_engine",
                                   "check_file_logger",
                                   "check_plugin_hooks", "check_cpu_sharded_save"])
def test_checks_pass_on_installed_verl(check):
    getattr(verl_compat, check)()


def test_plugin_hooks_check_sees_every_hooked_module():
    from verl_ext import import_hooks

    assert set(verl_ext.plugin.HOOKS) <= set(import_hooks.watched())  # the plugin registered all its hooks here


def test_a_hooked_module_verl_no_longer_has(monkeypatch):
    """A hook on a module verl moved would never fire: the registration would silently not happen."""
    from verl_ext import import_hooks

    hooks = dict(import_hooks._HOOKS, **{"verl.trainer.ppo.core_algos_moved": [("register it", lambda m: None, False)]})
    monkeypatch.setattr(import_hooks, "_HOOKS", hooks)
    with pytest.raises(VerlCompatError) as e:
        verl_compat.check_plugin_hooks()
    _assert_clear(e, "verl.trainer.ppo.core_algos_moved", "register it")


def test_fsdp_engine_check_passes():
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngine

    verl_compat.check_fsdp_engine(FSDPEngine)


@pytest.mark.parametrize("target, check", [
    ("verl.trainer.ppo.ray_trainer.compute_advantage", "check_legacy_trainer"),  # the rerouted function
    ("verl.trainer.main_ppo_v0.RayPPOTrainer", "check_legacy_trainer"),  # the global the legacy runner rebinds
    ("verl.trainer.ppo.ray_trainer.RayPPOTrainer._get_gen_batch", "check_legacy_trainer"),  # an overridden hook
    ("verl.trainer.ppo.v1.trainer_base.PPOTrainer._next_train_batch", "check_v1_trainer"),
    ("verl.trainer.ppo.v1.trainer_base.TRAINER_REGISTRY", "check_v1_trainer"),
    ("verl.trainer.ppo.v1.trainer_base.compute_advantage_for_multi_trajectories", "check_v1_trainer"),
    ("verl.trainer.ppo.reward.load_reward_manager", "check_reward_manager"),
    ("verl.workers.utils.losses.ppo_loss", "check_actor_loss_fn"),
    ("verl.workers.rollout.base._ROLLOUT_REGISTRY", "check_cpu_mode"),
    ("verl.checkpoint_engine.base.CheckpointEngineRegistry", "check_cpu_checkpoint_engine"),
])
def test_missing_piece(monkeypatch, target, check):
    monkeypatch.delattr(target)
    with pytest.raises(VerlCompatError) as e:
        getattr(verl_compat, check)()
    _assert_clear(e, target.rsplit(".", 1)[1])


def test_legacy_fit_no_longer_calling_the_rerouted_function(monkeypatch):
    """The silent no-op the checks exist for: the global is still there, but fit() stopped reading it."""
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    def fit(self):
        return self._get_gen_batch(self._validate(self._update_actor(self._compute_old_log_prob("entropys"))))

    monkeypatch.setattr(RayPPOTrainer, "fit", fit)
    with pytest.raises(VerlCompatError) as e:
        verl_compat.check_legacy_trainer()
    _assert_clear(e, "RayPPOTrainer.fit", "'compute_advantage'")


def test_v1_transfer_queue_field_renamed(monkeypatch):
    """verl's old-log-prob pass writes the entropy under another TransferQueue field name."""
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    def _compute_old_log_prob(self, batch, metrics):
        return {"old_log_probs": None, "token_entropy": None}

    monkeypatch.setattr(PPOTrainer, "_compute_old_log_prob", _compute_old_log_prob)
    with pytest.raises(VerlCompatError) as e:
        verl_compat.check_v1_trainer()
    _assert_clear(e, "PPOTrainer._compute_old_log_prob", "'entropy'")


def test_reward_input_layout_changed(monkeypatch):
    """gec_agent copies AgentLoopWorker._compute_score's reward-input layout: a changed layout is caught."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    async def _compute_score(self, outputs, kwargs):
        return {"prompts": 1, "responses": 2, "input_ids": 3, "attention_mask": 4, "position_ids": 5}

    monkeypatch.setattr(AgentLoopWorker, "_compute_score", _compute_score)
    with pytest.raises(VerlCompatError) as e:
        verl_compat.check_agent_loop()
    _assert_clear(e, "AgentLoopWorker._compute_score", "'__num_turns__'")


def test_llm_server_client_no_longer_forwarding_priority(monkeypatch):
    """gec_agent's continuation passes ``priority`` to LLMServerClient.generate, which takes it through ``**kwargs``:
    a signature that accepts it says nothing; a generate whose code never handles it must fail the check."""
    from verl.workers.rollout.llm_server import LLMServerClient

    async def generate(self, request_id, *, prompt_ids, sampling_params, image_data=None, video_data=None,
                       audio_data=None, mm_processor_kwargs=None, **kwargs):
        server_id, server = await self._acquire_server(request_id, prompt_ids=prompt_ids)
        return await server.generate.remote(request_id=request_id, prompt_ids=prompt_ids,
                                            sampling_params=sampling_params, image_data=image_data)

    monkeypatch.setattr(LLMServerClient, "generate", generate)
    with pytest.raises(VerlCompatError) as e:
        verl_compat.check_agent_loop()
    _assert_clear(e, "'priority'", "LLMServerClient.generate")


def test_agent_loop_output_field_missing(monkeypatch):
    from verl.experimental.agent_loop.agent_loop import AgentLoopOutput

    fields = {k: v for k, v in AgentLoopOutput.model_fields.items() if k != "routed_experts"}
    monkeypatch.setattr(AgentLoopOutput, "model_fields", fields)
    with pytest.raises(VerlCompatError) as e:
        verl_compat.check_agent_loop()
    _assert_clear(e, "'routed_experts'", "AgentLoopOutput")


def test_fsdp_optimizer_config_field_missing(monkeypatch):
    from verl.workers.config.optimizer import FSDPOptimizerConfig

    fields = {k: v for k, v in FSDPOptimizerConfig.__dataclass_fields__.items() if k != "lr_scheduler_type"}
    monkeypatch.setattr(FSDPOptimizerConfig, "__dataclass_fields__", fields)
    with pytest.raises(VerlCompatError) as e:
        verl_compat.check_fsdp_optimizer_config()
    _assert_clear(e, "'lr_scheduler_type'", "FSDPOptimizerConfig")


def test_process_group_signature_changed(monkeypatch):
    from verl.utils import distributed

    monkeypatch.setattr(distributed, "initialize_global_process_group_ray", lambda timeout_second=None: None)
    with pytest.raises(VerlCompatError) as e:
        verl_compat.check_cpu_mode()
    _assert_clear(e, "'backend'", "initialize_global_process_group_ray")


def test_separate_async_worker_no_longer_looking_up_the_sharded_save_at_call_time(monkeypatch):
    """CPU mode rebinds verl.utils.fsdp_utils.fsdp2_sharded_save_to_cpu; a worker holding its own reference (a module
    import) would never call the copy."""
    from verl.experimental.separation.engine_workers import DetachActorWorker
    from verl.utils.fsdp_utils import fsdp2_sharded_load_from_cpu, fsdp2_sharded_save_to_cpu

    def _get_strategy_handlers(self):
        return fsdp2_sharded_save_to_cpu, fsdp2_sharded_load_from_cpu

    monkeypatch.setattr(DetachActorWorker, "_get_strategy_handlers", _get_strategy_handlers)
    with pytest.raises(VerlCompatError) as e:
        verl_compat.check_cpu_sharded_save()
    _assert_clear(e, "DetachActorWorker._get_strategy_handlers", "'verl.utils.fsdp_utils'")


def test_main_refuses_before_ray_starts(monkeypatch):
    """``python -m verl_ext.main`` runs the trainer's checks before it starts Ray (and its TaskRunner)."""
    import ray
    from omegaconf import OmegaConf
    from verl.trainer.ppo import ray_trainer

    from verl_ext import main

    monkeypatch.setattr(main, "prepare", lambda config: None)
    monkeypatch.delattr(ray_trainer, "compute_advantage")
    started = []
    monkeypatch.setattr("verl.trainer.main_ppo.run_ppo", lambda *a, **k: started.append(a))
    with pytest.raises(VerlCompatError):
        main.run(OmegaConf.create({"trainer": {"use_v1": False}}))
    assert not started and not ray.is_initialized()


@pytest.mark.parametrize("use_v1", [False, True], ids=["legacy", "v1"])
def test_batch_split_check_passes_and_sees_the_reference_pass_lose_its_own_dynamic_setting(monkeypatch, use_v1):
    """verl_ext.batch_split takes the reference pass's dynamic batch size from ref.log_prob_use_dynamic_bsz, as
    verl 0.9.1's ActorRolloutRefWorker.init_model does: a verl that stops reading it is caught at start-up."""
    from verl.workers.engine_workers import ActorRolloutRefWorker

    verl_compat.check_batch_split(use_v1)

    def init_model(self):
        return self.config.actor.use_dynamic_bsz, "log_prob_micro_batch_size_per_gpu", "infer_micro_batch_size_per_gpu", \
            "ppo_micro_batch_size_per_gpu"

    monkeypatch.setattr(ActorRolloutRefWorker, "init_model", init_model)
    with pytest.raises(VerlCompatError) as e:
        verl_compat.check_batch_split(use_v1)
    _assert_clear(e, "ActorRolloutRefWorker.init_model", "'log_prob_use_dynamic_bsz'")
