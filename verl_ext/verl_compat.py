"""Start-up checks of what verl_ext relies on inside verl beyond verl's registries (docs/verl-integration.md).

verl_ext extends verl through its registries where verl has one (advantage estimators, agent loops, rollout
replicas, platforms, checkpoint engines).  The few other places it reaches into verl (a module-level function it
reroutes, a method it overrides, a field name it reads) are listed in docs/verl-integration.md; each is checked
here, when the code that relies on it starts, and a missing piece raises one :class:`VerlCompatError` naming the
verl version verl_ext was written for, instead of becoming a silent no-op (an override verl never calls, a
rebinding nobody reads).  The checks are attribute, signature and code-object lookups on modules that are already
imported at that point: they cost microseconds.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable, Iterable
from typing import Any

VERL_VERSION = "0.9.1"  # the verl release verl_ext is written and tested against


class VerlCompatError(RuntimeError):
    """The installed verl lacks something verl_ext relies on (see docs/verl-integration.md)."""


@functools.lru_cache(maxsize=1)
def installed_verl_version() -> str:
    try:
        from importlib.metadata import version

        return version("verl")
    except Exception:
        return str(getattr(importlib.import_module("verl"), "__version__", "unknown"))


def require(condition: Any, what: str, hint: str = "") -> None:
    """Raise :class:`VerlCompatError` ("verl_ext was written for verl 0.9.1: <what> not found in verl X") unless
    ``condition``."""
    if condition:
        return
    message = f"verl_ext was written for verl {VERL_VERSION}: {what} not found in verl {installed_verl_version()}"
    if hint:
        message += f" ({hint})"
    message += "; install verl==" + VERL_VERSION + " or see docs/verl-integration.md for what to adapt"
    raise VerlCompatError(message)


def _qualname(owner: Any) -> str:
    if inspect.ismodule(owner):
        return owner.__name__
    return f"{getattr(owner, '__module__', '?')}.{getattr(owner, '__qualname__', owner)}"


def require_module(name: str, hint: str = "") -> Any:
    """The module ``name``; a clear error if it cannot be imported."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        require(False, f"module {name}", hint or str(e))


def require_attrs(owner: Any, *names: str, hint: str = "") -> None:
    """Every name in ``names`` is an attribute of ``owner`` (a module or a class)."""
    for name in names:
        require(hasattr(owner, name), f"{_qualname(owner)}.{name}", hint)


def _code_words(func: Callable) -> set[str]:
    """Global/attribute names and string constants a function's code uses, nested code (comprehensions,
    closures) included; decorators that keep ``__wrapped__`` are looked through."""
    func = inspect.unwrap(func)
    code = getattr(func, "__code__", None)
    words: set[str] = set()
    stack = [code] if code is not None else []
    while stack:
        current = stack.pop()
        words.update(current.co_names)
        consts = list(current.co_consts)
        while consts:
            const = consts.pop()
            if isinstance(const, str):
                words.add(const)
            elif isinstance(const, (tuple, frozenset)):  # e.g. the keys of a dict literal
                consts.extend(const)
            elif inspect.iscode(const):
                stack.append(const)
    return words


def require_uses(func: Callable, words: Iterable[str], where: str, hint: str = "") -> None:
    """``func``'s code uses every name / string in ``words`` (e.g. calls a module global verl_ext reroutes, or
    reads a field name verl_ext reads too): verl_ext's rerouting or override is then actually reached."""
    used = _code_words(func)
    for word in words:
        require(word in used, f"{where} using {word!r}", hint)


def require_parameters(func: Callable, names: Iterable[str], where: str, hint: str = "") -> None:
    """``func`` takes every keyword in ``names``: as a parameter, or through ``**kwargs`` when its code names it (pops
    or passes it on) -- a ``**kwargs`` alone accepts any name and may drop it."""
    params = inspect.signature(inspect.unwrap(func)).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    used = _code_words(func) if takes_any else set()
    for name in names:
        require(name in params or name in used, f"parameter {name!r} of {where}", hint)


# ---------------------------------------------------------------- the checks, one per integration area

# the v1 trainer's two known breaks on verl's next release (docs/verl-integration.md, "verl's next release")
NO_V1_TRAINER_HINT = ("this verl has no v1 trainer (verl's `neo` branch removes it and TransferQueue): "
                      "run with trainer.use_v1=false")
NO_TRANSFER_QUEUE_HINT = ("verl's v1 trainer (trainer.use_v1=true) needs TransferQueue, an optional extra on verl "
                          "main: pip install 'TransferQueue>=0.1.10', or run with trainer.use_v1=false")


ROLLOUT_DIAGNOSTICS_HINT = ("verl_ext hands verl's rollout-vs-actor diagnostics the tokens an engine sampled, "
                            "without GEC's injected ones")


def check_rollout_diagnostics() -> None:
    """``verl_ext.trainer.rollout_diagnostics``: verl's two rollout-vs-actor diagnostics, run by verl_ext on the
    response mask less GEC's injected tokens (``compute_offpolicy_metrics`` rebound in its module while verl's rollout
    correction runs)."""
    debug_metrics = require_module("verl.utils.debug.metrics")
    require_attrs(debug_metrics, "calculate_debug_metrics", hint=ROLLOUT_DIAGNOSTICS_HINT)
    require_uses(debug_metrics.calculate_debug_metrics, ("response_mask", "rollout_log_probs", "old_log_probs"),
                 "verl.utils.debug.metrics.calculate_debug_metrics", ROLLOUT_DIAGNOSTICS_HINT)
    helper = require_module("verl.trainer.ppo.rollout_corr_helper")
    require_attrs(helper, "compute_rollout_correction_and_add_to_batch", "compute_rollout_correction_and_rejection_mask",
                  "compute_offpolicy_metrics", hint=ROLLOUT_DIAGNOSTICS_HINT)
    require_uses(helper.compute_rollout_correction_and_add_to_batch, ("compute_rollout_correction_and_rejection_mask",),
                 "rollout_corr_helper.compute_rollout_correction_and_add_to_batch", ROLLOUT_DIAGNOSTICS_HINT)
    require_uses(helper.compute_rollout_correction_and_rejection_mask, ("compute_offpolicy_metrics",),
                 "rollout_corr_helper.compute_rollout_correction_and_rejection_mask", ROLLOUT_DIAGNOSTICS_HINT)
    require_parameters(helper.compute_offpolicy_metrics, ("old_log_prob", "rollout_log_prob", "response_mask"),
                       "rollout_corr_helper.compute_offpolicy_metrics", ROLLOUT_DIAGNOSTICS_HINT)


def check_legacy_trainer() -> None:
    """``trainer.use_v1=false``: ``verl_ext.trainer.legacy`` and ``ExtTaskRunnerLegacy``."""
    from verl.trainer import main_ppo_v0
    from verl.trainer.ppo import ray_trainer

    trainer = ray_trainer.RayPPOTrainer
    require_attrs(ray_trainer, "RayPPOTrainer", "compute_advantage", "compute_response_mask")
    require_attrs(trainer, "init_workers", "fit", "_compute_old_log_prob", "_update_actor", "_validate",
                  "_get_gen_batch", "_save_checkpoint", "_load_checkpoint",
                  hint="methods verl_ext's legacy trainer overrides")
    require_uses(trainer.fit, ("compute_advantage", "_get_gen_batch", "_validate", "_update_actor",
                               "_compute_old_log_prob", "entropys"), "RayPPOTrainer.fit",
                 "verl_ext reroutes the advantage call of fit() and hooks the calls around it")
    require_uses(trainer._compute_old_log_prob, ("entropys",), "RayPPOTrainer._compute_old_log_prob")
    require_uses(trainer._validate, ("_get_gen_batch",), "RayPPOTrainer._validate",
                 "verl_ext tags validation rows in _get_gen_batch")
    require_parameters(trainer._log_rollout_data, ("batch", "reward_extra_infos_dict", "timing_raw",
                                                   "rollout_data_dir"), "RayPPOTrainer._log_rollout_data",
                       "verl_ext adds GEC's columns to verl's rollout dump there")
    require_uses(trainer.fit, ("_log_rollout_data",), "RayPPOTrainer.fit")
    # verl_ext.trainer.legacy._ext_rollout_diagnostics rebinds both in their modules while fit runs (GEC on)
    require_uses(trainer.fit, ("verl.utils.debug.metrics", "calculate_debug_metrics",
                               "verl.trainer.ppo.rollout_corr_helper", "compute_rollout_correction_and_add_to_batch"),
                 "RayPPOTrainer.fit", ROLLOUT_DIAGNOSTICS_HINT)
    check_rollout_diagnostics()
    require(hasattr(main_ppo_v0, "TaskRunner") and hasattr(main_ppo_v0, "RayPPOTrainer"),
            "verl.trainer.main_ppo_v0.TaskRunner and its module global RayPPOTrainer")
    require_uses(main_ppo_v0.TaskRunner.__ray_actor_class__.run, ("RayPPOTrainer",), "main_ppo_v0.TaskRunner.run",
                 "ExtTaskRunnerLegacy rebinds that global to verl_ext's trainer")


def check_v1_trainer() -> None:
    """``trainer.use_v1=true``: ``verl_ext.trainer.v1`` and ``ExtTaskRunnerV1``."""
    from verl.trainer import main_ppo

    require_attrs(main_ppo, "TaskRunnerV1", hint=NO_V1_TRAINER_HINT)
    require_module("transfer_queue", hint=NO_TRANSFER_QUEUE_HINT)  # before verl's v1 modules, which import it
    trainer_base = require_module("verl.trainer.ppo.v1.trainer_base")

    trainer = trainer_base.PPOTrainer
    require_attrs(trainer_base, "PPOTrainer", "TRAINER_REGISTRY", "get_trainer_cls",
                  "compute_advantage_for_multi_trajectories")
    require(isinstance(trainer_base.TRAINER_REGISTRY, dict) and "sync" in trainer_base.TRAINER_REGISTRY,
            "verl.trainer.ppo.v1.trainer_base.TRAINER_REGISTRY as a dict with the 'sync' trainer")
    require_uses(trainer_base.get_trainer_cls, ("TRAINER_REGISTRY",), "trainer_base.get_trainer_cls")
    require_uses(main_ppo.TaskRunnerV1.__ray_actor_class__.run, ("get_trainer_cls",), "main_ppo.TaskRunnerV1.run")
    require_attrs(trainer, "on_init_end", "_compute_old_log_prob", "_update_actor", "_compute_advantage",
                  "_compute_metrics",
                  "_next_train_batch", "_validate", "_save_checkpoint", "_load_checkpoint",
                  hint="methods verl_ext's v1 trainers override")
    require_uses(trainer._compute_advantage, ("compute_advantage_for_multi_trajectories", "uid", "rm_scores",
                                              "response_mask", "advantages"), "PPOTrainer._compute_advantage",
                 "verl_ext reroutes that call and reads these TransferQueue fields")
    require_uses(trainer._compute_old_log_prob, ("entropy",), "PPOTrainer._compute_old_log_prob",
                 "verl_ext reads the old-log-prob pass's entropy from TransferQueue under this name")
    # verl_ext.trainer.v1 rebinds these module globals of trainer_base around the two methods (GEC on)
    require_attrs(trainer_base, "calculate_debug_metrics", "compute_rollout_correction_and_add_to_batch",
                  hint=ROLLOUT_DIAGNOSTICS_HINT)
    require_uses(trainer._compute_old_log_prob, ("calculate_debug_metrics",), "PPOTrainer._compute_old_log_prob",
                 ROLLOUT_DIAGNOSTICS_HINT)
    require_uses(trainer._compute_advantage, ("compute_rollout_correction_and_add_to_batch",),
                 "PPOTrainer._compute_advantage", ROLLOUT_DIAGNOSTICS_HINT)
    check_rollout_diagnostics()
    require_uses(trainer._add_batch_to_generate, ("_next_train_batch",), "PPOTrainer._add_batch_to_generate")
    # verl_ext.trainer.v1.real_rows: verl's padding rows carry this tag (verl's own metrics filter on it too)
    padding = require_module("verl.trainer.ppo.padding_utils")
    require_uses(padding.construct_minimal_padding_template, ("is_padding",),
                 "verl.trainer.ppo.padding_utils.construct_minimal_padding_template",
                 "verl_ext leaves the rows verl pads the batch with out of its statistics by this tag")
    require_uses(trainer._validate, ("val_dataloader", "raw_prompt"), "PPOTrainer._validate",
                 "verl_ext tags validation rows as they come out of val_dataloader")
    require_parameters(trainer._dump_generations, ("inputs", "outputs", "gts", "scores", "reward_extra_infos_dict",
                                                   "dump_path"), "PPOTrainer._dump_generations",
                       "verl_ext adds GEC's columns to verl's rollout dump there")
    require_uses(trainer._log_rollout_data, ("_dump_generations", "uid"), "PPOTrainer._log_rollout_data",
                 "verl_ext matches its rows to the dump's TransferQueue keys (its 'uid' column)")


def check_agent_loop() -> None:
    """The ``gec_agent`` agent loop (``verl_ext.rollout.gec_agent_loop``), in every agent-loop worker."""
    from verl.experimental.agent_loop import agent_loop
    from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop

    require_attrs(agent_loop, "register", "AgentLoopOutput", "AgentLoopWorker")
    require_attrs(SingleTurnAgentLoop, "run")
    fields = getattr(agent_loop.AgentLoopOutput, "model_fields", {})
    # not required: mm_processor_output (verl 0.9.1's SGLang video payload, absent on verl main), passed on when set
    for name in ("prompt_ids", "response_ids", "response_mask", "response_logprobs", "routed_experts",
                 "multi_modal_data", "mm_processor_kwargs", "extra_fields", "num_turns", "metrics"):
        require(name in fields, f"field {name!r} of AgentLoopOutput", "gec_agent edits the output in place")
    # mode=hint, hint_placement=user: the hinted prompt is built by the builder verl's single turn builds the row's with
    require_uses(SingleTurnAgentLoop.run, ("ct_build_initial_tokens",), "SingleTurnAgentLoop.run",
                 "gec_agent builds a user-placed hint's prompt as verl builds the row's")
    require_uses(agent_loop.AgentLoopBase.ct_build_initial_tokens, ("continuous_token_builder",
                                                                      "build_initial_tokens"),
                 "AgentLoopBase.ct_build_initial_tokens", "gec_agent builds a user-placed hint's prompt with it")
    worker = agent_loop.AgentLoopWorker
    require_uses(worker.generate_sequences, ("non_tensor_batch", "_run_agent_loop"),
                 "AgentLoopWorker.generate_sequences", "rows reach agent loops as keyword arguments")
    # verl_ext.rollout.gec_agent_loop.build_reward_input copies this layout for the first response's reward
    require_uses(worker._compute_score, ("prompts", "responses", "input_ids", "attention_mask", "position_ids",
                                         "__num_turns__", "tool_extra_fields", "prompt_len", "response_len"),
                 "AgentLoopWorker._compute_score", "gec_agent builds the reward input the same way")
    from verl.workers.rollout.llm_server import LLMServerClient

    # priority comes through its **kwargs: verl pops it and forwards it to the rollout server (vLLM's scheduling)
    require_parameters(LLMServerClient.generate, ("request_id", "prompt_ids", "sampling_params", "image_data",
                                                  "audio_data", "video_data", "priority"),
                       "LLMServerClient.generate", "gec_agent continues a response through it")
    check_agent_loop_routing()  # check_agent_loop_sample_keys: at the first gec_agent loop (v1's worker module may be
    # mid-import when the plugin's hook runs this)


# gec_agent_loop.GroupFirstAttempts (edit_scope=all_wrong_groups) counts the samples of a group that started in a worker
GROUP_START_HINT = ("gec_agent's edit_scope=all_wrong_groups expects a worker to start all the samples it runs of a "
                    "group at once, each as a task")


@functools.lru_cache(maxsize=1)
def check_agent_loop_sample_keys() -> None:
    """GEC's branch draws are independent across the n samples of a uid because verl hands each sample a key of its
    own: v1's ``AgentLoopWorkerTQ._run_prompt`` a ``session_id`` (0..n-1), the legacy ``AgentLoopManager`` a per-row
    ``priority`` (its rows are already repeated n times). Without them every sample of a group would draw the
    same branch (``GecAgentLoop._rng``)."""
    from verl.experimental.agent_loop import agent_loop

    require_uses(agent_loop.AgentLoopManager.generate_sequences, ("priority",), "AgentLoopManager.generate_sequences",
                 "gec_agent keys each sample's branch draw on it (legacy trainer)")
    require_uses(agent_loop.AgentLoopWorker.generate_sequences, ("create_task",), "AgentLoopWorker.generate_sequences",
                 GROUP_START_HINT)
    try:  # v1's worker; a verl without TransferQueue or the v1 trainer has none (check_v1_trainer refuses v1 there)
        agent_loop_tq = importlib.import_module("verl.trainer.ppo.v1.agent_loop_tq")
    except ImportError:
        return
    worker = getattr(agent_loop_tq, "AgentLoopWorkerTQ", None)
    require(worker is not None, "verl.trainer.ppo.v1.agent_loop_tq.AgentLoopWorkerTQ")
    worker = getattr(worker, "__ray_actor_class__", worker)
    require_attrs(worker, "_run_prompt")
    require_uses(worker._run_prompt, ("session_id", "_run_agent_loop"), "AgentLoopWorkerTQ._run_prompt",
                 "gec_agent keys each sample's branch draw on it (v1 trainer)")
    require_uses(worker._run_prompt, ("create_task",), "AgentLoopWorkerTQ._run_prompt", GROUP_START_HINT)


def check_agent_loop_routing() -> None:
    """A reflection continuation reuses the first generation's request id, which ``SingleTurnAgentLoop.run`` passes to
    ``server_manager.generate`` and verl's ``LLMServerClient`` routes by (its load balancer's sticky sessions: the same
    replica, whose prefix cache holds prompt + core)."""
    from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop
    from verl.workers.rollout.llm_server import LLMServerClient

    require_uses(SingleTurnAgentLoop.run, ("server_manager", "generate", "request_id", "routed_experts"),
                 "SingleTurnAgentLoop.run", "gec_agent records the first generation's request id there")
    require_attrs(LLMServerClient, "_acquire_server", hint="verl's routing by request id")
    require_parameters(LLMServerClient._acquire_server, ("request_id",), "LLMServerClient._acquire_server",
                       "verl's sticky routing key")
    require_uses(LLMServerClient.generate, ("_acquire_server",), "LLMServerClient.generate",
                 "the continuation is routed like the first generation")


def check_reward_manager() -> None:
    """What ``gec_agent`` scores the first response with (checked where it is first built)."""
    reward = require_module("verl.trainer.ppo.reward")
    require_attrs(reward, "load_reward_manager")


def check_actor_loss_fn() -> None:
    """The actor losses verl_ext installs with verl's ``set_loss_fn``: ``edge_grpo.entropy_grad``,
    ``gec.injected_loss=shaped``."""
    losses = require_module("verl.workers.utils.losses")
    padding = require_module("verl.workers.utils.padding")
    engine_workers = require_module("verl.workers.engine_workers")
    require_attrs(losses, "ppo_loss")
    require_attrs(require_module("verl.trainer.ppo.core_algos"), "agg_loss")
    require_attrs(padding, "no_padding_2_padding")
    require_attrs(engine_workers.ActorRolloutRefWorker, "set_loss_fn")


def check_fsdp_optimizer_config() -> None:
    """``lr_scheduler_type: linear`` (``verl_ext.lr_schedule.install``): verl's FSDP optimizer config."""
    import dataclasses

    from verl.workers.config.optimizer import FSDPOptimizerConfig

    names = {f.name for f in dataclasses.fields(FSDPOptimizerConfig)}
    for name in ("lr_scheduler_type", "warmup_style", "total_training_steps", "lr_warmup_steps",
                 "lr_warmup_steps_ratio", "min_lr_ratio"):
        require(name in names, f"field {name!r} of FSDPOptimizerConfig")
    require_attrs(FSDPOptimizerConfig, "__post_init__")


def check_fsdp_engine(engine_cls: type) -> None:
    """``lr_scheduler_type: linear``: the FSDP engine method that builds the scheduler."""
    require_attrs(engine_cls, "_build_lr_scheduler")
    require_uses(engine_cls._build_lr_scheduler, ("optimizer_config",), "FSDPEngine._build_lr_scheduler")


def check_cpu_platform() -> None:
    """CPU mode (``VERL_PLATFORM=cpu``, ``verl_ext.cpu``), before the platform is installed: verl's platform
    registry (nothing here may import a verl module that resolves the platform)."""
    platform = require_module("verl.plugin.platform")
    require_attrs(platform, "PlatformBase", "PlatformRegistry", "platform_manager")
    require_attrs(platform.PlatformRegistry, "register")
    require_attrs(platform.platform_manager, "_current_platform", "set_platform")


def check_cpu_mode() -> None:
    """CPU mode, once the ``cpu`` platform is registered: process group and rollout registries (the checkpoint
    registry: :func:`check_cpu_checkpoint_engine`, when a process imports it).

    (verl's engine lookup reading ``VERL_ENGINE_DEVICE`` is not checked here: importing the engine module costs
    seconds, and without it verl fails loudly anyway, with "No engine registered for device='cpu'".)"""
    distributed = require_module("verl.utils.distributed")
    require_attrs(distributed, "initialize_global_process_group_ray")
    require_parameters(distributed.initialize_global_process_group_ray, ("timeout_second", "backend"),
                       "verl.utils.distributed.initialize_global_process_group_ray")
    rollout_base = require_module("verl.workers.rollout.base")
    replica = require_module("verl.workers.rollout.replica")
    require_attrs(rollout_base, "BaseRollout", "get_rollout_class")
    # no registration function for server adapters in verl 0.9.1: the hf backend adds its entry to this dict
    require(isinstance(getattr(rollout_base, "_ROLLOUT_REGISTRY", None), dict),
            "verl.workers.rollout.base._ROLLOUT_REGISTRY (a dict)")
    require_uses(rollout_base.get_rollout_class, ("_ROLLOUT_REGISTRY",), "verl.workers.rollout.base.get_rollout_class")
    require_attrs(replica, "RolloutReplica", "RolloutReplicaRegistry", "TokenOutput")
    require_attrs(replica.RolloutReplicaRegistry, "register")


def check_cpu_checkpoint_engine() -> None:
    """CPU mode's ``cpu`` checkpoint engine, registered once ``verl.checkpoint_engine.base`` is imported."""
    checkpoint = require_module("verl.checkpoint_engine.base")
    require_attrs(checkpoint, "CheckpointEngine", "CheckpointEngineRegistry")
    require_attrs(checkpoint.CheckpointEngineRegistry, "register")


SHARDED_SAVE_HINT = ("in CPU mode verl_ext wraps verl's FSDP2 save to CPU memory so that separate_async's pi_old is "
                     "a copy, not the parameters the optimizer updates in place")


def check_cpu_sharded_save() -> None:
    """CPU mode, when separate_async's worker module is imported (``verl_ext.cpu.sharded_save``): verl's
    ``DetachActorWorker`` looks up ``fsdp2_sharded_save_to_cpu`` in ``verl.utils.fsdp_utils`` when it first saves
    (an import inside the method, so the function verl_ext rebinds there is the one called)."""
    fsdp_utils = require_module("verl.utils.fsdp_utils")
    require_attrs(fsdp_utils, "fsdp2_sharded_save_to_cpu", "fsdp2_sharded_load_from_cpu", hint=SHARDED_SAVE_HINT)
    workers = require_module("verl.experimental.separation.engine_workers")
    require_attrs(workers, "DetachActorWorker", hint=SHARDED_SAVE_HINT)
    worker = getattr(workers.DetachActorWorker, "__ray_actor_class__", workers.DetachActorWorker)
    require_attrs(worker, "_get_strategy_handlers", "save_model_to_cpu", hint=SHARDED_SAVE_HINT)
    require_uses(worker._get_strategy_handlers, ("verl.utils.fsdp_utils", "fsdp2_sharded_save_to_cpu"),
                 "DetachActorWorker._get_strategy_handlers", SHARDED_SAVE_HINT)


def check_file_logger() -> None:
    """``trainer.file_logger_path`` (``verl_ext.trainer.runner.point_file_logger``): the variable verl's file
    logger reads its path from."""
    tracking = require_module("verl.utils.tracking")
    require_attrs(tracking, "FileLogger")
    require_uses(tracking.FileLogger.__init__, ("VERL_FILE_LOGGER_PATH",), "verl.utils.tracking.FileLogger")


def check_plugin_hooks() -> None:
    """The verl modules ``verl_ext.plugin`` registers on (``verl_ext.import_hooks``): each must exist, or its
    registration would never run (verl would then report an unknown estimator or agent loop); and none that ran in
    this process may have failed (a failure is logged where it fired, never raised out of verl's import: raised
    here, as ``PluginHookError``)."""
    from importlib.util import find_spec

    from verl_ext.import_hooks import raise_hook_failures, watched

    raise_hook_failures()
    for name, whats in watched().items():
        try:
            found = find_spec(name) is not None
        except ImportError:  # a parent package is missing
            found = False
        require(found, f"module {name}", f"verl_ext's plugin hooks its import to {'; '.join(whats)}")


BATCH_SPLIT_HINT = ("verl_ext's start-up check of batch sizes (verl_ext.batch_split) models how verl's engine splits "
                    "a step's batch; tests/unit/test_batch_split_grid.py checks the model against this verl")


def check_batch_split(use_v1: bool) -> None:
    """What ``verl_ext.batch_split`` reads of verl's engine workers and trainers: which settings each pass takes its
    micro-batches and dynamic batch size from, where the update and the engine assert, and when ``fit`` returns
    before training."""
    workers = require_module("verl.workers.engine_workers")
    engine_utils = require_module("verl.workers.engine.utils")
    require_uses(workers.ActorRolloutRefWorker.init_model, (
        "log_prob_use_dynamic_bsz", "log_prob_micro_batch_size_per_gpu", "use_dynamic_bsz",
        "infer_micro_batch_size_per_gpu", "ppo_micro_batch_size_per_gpu"), "ActorRolloutRefWorker.init_model",
        BATCH_SPLIT_HINT)
    require_uses(workers.TrainingWorker.train_mini_batch, ("mini_batch_size", "get_data_parallel_size",
                                                           "make_iterator"), "TrainingWorker.train_mini_batch",
                 BATCH_SPLIT_HINT)
    require_uses(engine_utils.prepare_micro_batches, ("micro_batch_size_per_gpu", "use_dynamic_bsz"),
                 "verl.workers.engine.utils.prepare_micro_batches", BATCH_SPLIT_HINT)
    if use_v1:
        trainer = require_module("verl.trainer.ppo.v1.trainer_base").PPOTrainer
        require_uses(trainer._balance_batch, ("_get_required_batch_multiple", "upsample_batch_to_divisible_size"),
                     "PPOTrainer._balance_batch", BATCH_SPLIT_HINT)
    else:
        trainer = require_module("verl.trainer.ppo.ray_trainer").RayPPOTrainer
    require_uses(trainer.fit, ("val_before_train", "val_only"), f"{trainer.__name__}.fit", BATCH_SPLIT_HINT)


def check_trainers(use_v1: bool) -> None:
    """The checks of the trainer a run uses (called by ``verl_ext.main`` before Ray starts and by the runners)."""
    if use_v1:
        check_v1_trainer()
    else:
        check_legacy_trainer()
    check_batch_split(use_v1)
    check_file_logger()
    check_plugin_hooks()


def check_v1_step_metrics() -> None:
    """``parameter_sync_step > 1``: ``verl_ext.trainer.v1.step_metrics_aggregator``, the subclass of verl's
    ``MetricsAggregator`` that ``PPOTrainer.step`` is given, picks how verl_ext's metrics fold over the mini-batches."""
    trainer_base = require_module("verl.trainer.ppo.v1.trainer_base")
    require_attrs(trainer_base, "MetricsAggregator")
    require_uses(trainer_base.PPOTrainer.step, ("MetricsAggregator", "add_step_metrics", "get_aggregated_metrics"),
                 "PPOTrainer.step", "verl_ext hands step its aggregator, which sums verl_ext's counts")
    aggregator = trainer_base.MetricsAggregator
    require_attrs(aggregator, "_get_aggregation_type", "_aggregate_single_metric")
    require_uses(aggregator._aggregate_single_metric, ("_get_aggregation_type", "sum", "last"),
                 "MetricsAggregator._aggregate_single_metric")


DATA_ORDER_HINT = "trainer.v1.sampler.sampler_kwargs.data_order=true (verl_ext.trainer.v1_replay)"


def check_v1_replay_buffer() -> None:
    """``data_order``: ``verl_ext.trainer.v1_replay.DataOrderMixin`` over verl's two built-in replay buffers (handed to
    ``PPOTrainer._build_replay_buffer`` under their module names), its uids from ``_fetch_one_gen_batch``."""
    trainer_base = require_module("verl.trainer.ppo.v1.trainer_base")
    replay_buffer = require_module("verl.trainer.ppo.v1.replay_buffer")
    require_attrs(trainer_base, "ReplayBuffer", "ReplayBufferAsync", hint=DATA_ORDER_HINT)
    require_uses(trainer_base.PPOTrainer._build_replay_buffer, ("ReplayBuffer", "ReplayBufferAsync"),
                 "PPOTrainer._build_replay_buffer", DATA_ORDER_HINT)
    require_uses(trainer_base.PPOTrainer._fetch_one_gen_batch, ("uid",), "PPOTrainer._fetch_one_gen_batch",
                 DATA_ORDER_HINT)
    for cls in (replay_buffer.ReplayBuffer, replay_buffer.ReplayBufferAsync):
        require_uses(cls.sample, ("_select_prompt_uids", "_materialize_batch"), f"{cls.__name__}.sample",
                     DATA_ORDER_HINT)
    require_parameters(replay_buffer.ReplayBuffer._materialize_batch,
                       ("partition_id", "selected_prompt_uids", "partition_snapshot"),
                       "ReplayBuffer._materialize_batch", DATA_ORDER_HINT)
    require_uses(replay_buffer.ReplayBuffer._wait_for_next_poll, ("poll_interval",),
                 "ReplayBuffer._wait_for_next_poll", "trainer.v1.sampler.sampler_kwargs.poll_interval")


@functools.lru_cache(maxsize=1)
def check_v1_multi_output() -> None:
    """Several outputs per sample: ``verl_ext.trainer.advantage.on_final_outputs`` gives verl_ext's estimators the
    rule verl's ``compute_advantage_for_multi_trajectories`` applies to GRPO; both run GRPO on a small batch here."""
    import torch
    from verl import DataProto
    from verl.trainer.ppo.core_algos import AdvantageEstimator

    from verl_ext.trainer.advantage import on_final_outputs

    utils = require_module("verl.trainer.ppo.v1.utils")
    require_attrs(utils, "compute_advantage_for_multi_trajectories", "compute_advantage")
    keys = ["a_0_1", "a_0_0", "a_1_0", "a_2_0", "b_0_0", "b_1_2", "b_1_0", "b_1_1", "b_2_0"]
    rewards = torch.zeros(len(keys), 3)
    rewards[:, -1] = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 0.0])
    mask = torch.ones(len(keys), 3, dtype=torch.int64)
    mask[[1, 6], 2] = 0

    def batch():
        return DataProto.from_dict(tensors={"token_level_rewards": rewards.clone(), "response_mask": mask.clone()},
                                   non_tensors={"uid": [k.split("_")[0] for k in keys]})

    theirs = utils.compute_advantage_for_multi_trajectories(batch(), keys, AdvantageEstimator.GRPO)
    ours = on_final_outputs(batch(), keys, None,
                            lambda data, rows: utils.compute_advantage(data, AdvantageEstimator.GRPO))
    require(torch.allclose(theirs.batch["advantages"], ours.batch["advantages"]),
            "compute_advantage_for_multi_trajectories keeping each {uid}_{session}'s last output and copying its "
            "advantage to the others", "verl_ext applies that rule to edge_grpo/gepo")
