"""CPU mode is explicit: without ``VERL_PLATFORM=cpu`` the plugin leaves verl's platform choice exactly as stock verl
makes it (whether or not the host has an accelerator); with it, verl runs on the ``cpu`` platform."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import psutil
import pytest

CONFIG_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "hydra_configs")

# What `import verl` leaves behind in a fresh process, as far as platform selection goes.
_SNAPSHOT = r"""
import json, os, sys
import verl
import verl.utils.distributed as dist
from verl.plugin.platform import platform_manager as pm
from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY
from verl.workers.rollout.base import _ROLLOUT_REGISTRY
from verl.workers.rollout.replica import RolloutReplicaRegistry

resolved_at_import = pm._current_platform is not None
from verl.utils.device import get_device_name
hooks = sys.modules.get("verl_ext.import_hooks")
# verl's checkpoint engines (whose hccl engine imports vLLM) are left to the processes that use them
checkpoint_engines_imported = "verl.checkpoint_engine" in sys.modules or "vllm" in sys.modules
from verl.checkpoint_engine.base import CheckpointEngineRegistry

print("SNAPSHOT " + json.dumps({
    "plugin_loaded": "verl_ext.plugin" in sys.modules,
    "edge_grpo_registered": "edge_grpo" in ADV_ESTIMATOR_REGISTRY,
    "platforms": list(pm.PlatformRegistry.registered_names()),
    "resolved_at_import": resolved_at_import,
    "detected": pm._detect_platform_name(),
    "device_name": get_device_name(),
    "platform_class": type(pm.get_platform()).__name__,
    "VERL_PLATFORM": os.environ.get("VERL_PLATFORM"),
    "VERL_ENGINE_DEVICE": os.environ.get("VERL_ENGINE_DEVICE"),
    "hf_replica": "hf" in RolloutReplicaRegistry._registry,
    "hf_adapter": ("hf", "async") in _ROLLOUT_REGISTRY,
    "gloo_wrapper": bool(getattr(dist.initialize_global_process_group_ray, "_verl_ext_cpu_patched", False)),
    # separate_async's worker module: CPU mode wraps verl's FSDP2 save to CPU when it is imported
    "sharded_save_hooked": hooks is not None and "verl.experimental.separation.engine_workers" in hooks.watched(),
    "checkpoint_engines_imported": checkpoint_engines_imported,
    "cpu_checkpoint_engine": "cpu" in CheckpointEngineRegistry._registry,  # once the registry is imported
}))
"""


# verl_ext.main: trainer.device=cpu turns the switch on for the driver and, through the job's runtime_env, for every
# Ray worker. Run in a subprocess: it changes os.environ and verl's process-wide platform.
_SELECT = r"""
import json, os, sys
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from verl_ext.config import ConfigError, register_structured_configs
from verl_ext.main import select_platform
from verl_ext.cpu import is_cpu_support_active

register_structured_configs()


def config(name):
    with initialize_config_dir(config_dir=sys.argv[1], version_base=None):
        return compose(config_name=name)


def ray_init_env_vars(cfg):
    # what verl's run_ppo hands to ray.init: its defaults merged with ray_kwargs.ray_init.runtime_env
    from verl.trainer.constants_ppo import get_ppo_ray_runtime_env

    merged = OmegaConf.merge(get_ppo_ray_runtime_env(cfg), cfg.ray_kwargs.ray_init.get("runtime_env", {}))
    return OmegaConf.to_container(merged).get("env_vars") or {}


out = {"active_at_start": is_cpu_support_active()}
gpu = config("verl_ext")  # trainer.device=cuda (verl's default)
select_platform(gpu)
out["gpu"] = {"active": is_cpu_support_active(), "VERL_PLATFORM": os.environ.get("VERL_PLATFORM")}
os.environ["VERL_PLATFORM"] = "nvidia"  # a contradiction: trainer.device=cpu on a named GPU platform
try:
    select_platform(config("toy_cpu"))
    out["conflict_error"] = None
except ConfigError as e:
    out["conflict_error"] = str(e)
out["conflict_active"] = is_cpu_support_active()
del os.environ["VERL_PLATFORM"]
toy = config("toy_cpu")  # bare `python -m verl_ext.main`: no VERL_PLATFORM in the environment
from verl.plugin.platform import platform_manager
out["resolved_before_toy"] = platform_manager._current_platform is not None  # as in a real run: not yet
select_platform(toy)
from verl.utils.device import get_device_name
out["toy"] = {"active": is_cpu_support_active(), "VERL_PLATFORM": os.environ.get("VERL_PLATFORM"),
              "device_name": get_device_name(), "env_vars": ray_init_env_vars(toy)}
out["gpu"]["env_vars"] = ray_init_env_vars(gpu)  # here: importing verl's constants resolves the platform
print("SELECT " + json.dumps(out))
"""


# A fresh Ray worker that unpickles the hf rollout server imports verl_ext.cpu.hf_rollout before verl: its
# `import verl` loads the plugin, which turns CPU mode on while the module is half-executed.
_ACTOR_MODULE_FIRST = r"""
import json
import verl_ext.cpu.hf_rollout
import verl_ext.cpu.checkpoint_engine
from verl.checkpoint_engine.base import CheckpointEngineRegistry
from verl.workers.rollout.base import _ROLLOUT_REGISTRY
from verl.workers.rollout.replica import RolloutReplicaRegistry
from verl_ext.cpu import is_cpu_support_active

print("ACTOR " + json.dumps({
    "active": is_cpu_support_active(),
    "replica": RolloutReplicaRegistry.get("hf").__name__,
    "adapter": _ROLLOUT_REGISTRY.get(("hf", "async")),
    "checkpoint_engine": "cpu" in CheckpointEngineRegistry._registry,
}))
"""


def _start(script: str, *args: str, **env_changes) -> subprocess.Popen:
    env = dict(os.environ)
    for key in ("VERL_PLATFORM", "VERL_ENGINE_DEVICE", "VERL_USE_EXTERNAL_PLUGINS"):
        env.pop(key, None)
    env.update(env_changes)
    return subprocess.Popen([sys.executable, "-c", script, *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _result(proc: subprocess.Popen, prefix: str, keep_stderr: bool = False) -> dict:
    try:
        out, err = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    line = [ln for ln in out.splitlines() if ln.startswith(prefix + " ")][-1]
    return {**json.loads(line[len(prefix) + 1:]), **({"stderr": err} if keep_stderr else {})}


@pytest.fixture(scope="module")
def runs() -> dict:
    """Each fresh process once, all started together (each spends most of its time importing verl)."""
    procs = {
        "stock": (_start(_SNAPSHOT, VERL_USE_EXTERNAL_PLUGINS="none"), "SNAPSHOT"),  # verl without any plugin
        "switch_off": (_start(_SNAPSHOT), "SNAPSHOT"),  # verl_ext's entry point loads, VERL_PLATFORM unset
        "switch_on": (_start(_SNAPSHOT, VERL_PLATFORM="cpu"), "SNAPSHOT"),
        "main": (_start(_SELECT, os.path.abspath(CONFIG_DIR)), "SELECT"),
        "actor_module_first": (_start(_ACTOR_MODULE_FIRST, VERL_PLATFORM="cpu"), "ACTOR"),
    }
    return {name: _result(proc, prefix, keep_stderr=name == "actor_module_first")
            for name, (proc, prefix) in procs.items()}


def test_switch_off_leaves_verl_platform_as_stock_verl_chooses_it(runs):
    stock, with_ext = runs["stock"], runs["switch_off"]
    assert not stock["plugin_loaded"] and not stock["edge_grpo_registered"]
    assert with_ext["plugin_loaded"] and with_ext["edge_grpo_registered"]  # the plugin did run
    assert {k: v for k, v in with_ext.items() if k not in ("plugin_loaded", "edge_grpo_registered")} == {
        k: v for k, v in stock.items() if k not in ("plugin_loaded", "edge_grpo_registered")
    }
    # and concretely: nothing of CPU mode is there
    assert "cpu" not in with_ext["platforms"] and with_ext["platform_class"] != "PlatformCPU"
    assert with_ext["VERL_PLATFORM"] is None and with_ext["VERL_ENGINE_DEVICE"] is None
    assert not (with_ext["hf_replica"] or with_ext["hf_adapter"] or with_ext["gloo_wrapper"]
                or with_ext["sharded_save_hooked"] or with_ext["cpu_checkpoint_engine"])


def test_switch_on_selects_the_cpu_platform(runs):
    snap = runs["switch_on"]
    assert snap["plugin_loaded"] and not snap["resolved_at_import"]
    assert "cpu" in snap["platforms"] and snap["detected"] == "cpu"
    assert snap["platform_class"] == "PlatformCPU" and snap["device_name"] == "cpu"
    assert snap["VERL_ENGINE_DEVICE"] == "cuda"  # engine-class selection only (see verl_ext.cpu.platform)
    assert snap["hf_replica"] and snap["hf_adapter"] and snap["gloo_wrapper"]
    assert snap["sharded_save_hooked"]  # separate_async's pi_old is a copy (verl_ext.cpu.sharded_save)
    # the cpu checkpoint engine is there once verl's registry is imported, and CPU mode did not import it (nor vLLM,
    # which verl's hccl engine imports: ~1.2 s of CPU in each of a run's processes that never use an engine)
    assert snap["cpu_checkpoint_engine"] and not snap["checkpoint_engines_imported"]


def test_a_worker_importing_the_hf_server_first_gets_cpu_mode_without_a_plugin_error(runs):
    # the circular import (plugin -> verl_ext.cpu -> the half-imported hf_rollout) once logged "verl_ext's verl
    # plugin failed in this process" in every CPU run's rollout server
    r = runs["actor_module_first"]
    assert "failed in this process" not in r["stderr"] and "circular import" not in r["stderr"], r["stderr"][-2000:]
    assert r["active"] and r["replica"] == "HFReplica" and r["checkpoint_engine"]
    assert r["adapter"] == "verl_ext.cpu.hf_rollout.HFServerAdapter"


def test_only_verl_platform_cpu_requests_cpu_mode(monkeypatch):
    from verl_ext.cpu import cpu_mode_requested

    for value, expected in ((None, False), ("", False), ("nvidia", False), ("amd", False), ("cpu", True),
                            (" CPU ", True)):
        if value is None:
            monkeypatch.delenv("VERL_PLATFORM", raising=False)
        else:
            monkeypatch.setenv("VERL_PLATFORM", value)
        assert cpu_mode_requested() is expected, value


def test_main_turns_cpu_mode_on_only_for_a_cpu_config_and_hands_it_to_ray_workers(runs):
    out = runs["main"]
    assert not out["active_at_start"]
    # the GPU-ready config: untouched
    assert not out["gpu"]["active"] and out["gpu"]["VERL_PLATFORM"] is None
    assert "VERL_PLATFORM" not in out["gpu"]["env_vars"]
    # trainer.device=cpu with VERL_PLATFORM naming another platform: a clear start-up error, CPU mode stays off
    assert "trainer.device=cpu" in out["conflict_error"] and "VERL_PLATFORM='nvidia'" in out["conflict_error"]
    assert not out["conflict_active"]
    # the embedded toy config (trainer.device=cpu): on in the driver and passed to every Ray actor of the job
    assert not out["resolved_before_toy"]
    toy = out["toy"]
    assert toy["active"] and toy["VERL_PLATFORM"] == "cpu" and toy["device_name"] == "cpu"
    assert toy["env_vars"]["VERL_PLATFORM"] == "cpu" and toy["env_vars"]["NCCL_DEBUG"] == "WARN"  # verl's kept
    # TransferQueue's torch threads at most the physical cores (else a warning on every put and get)
    assert 1 <= int(toy["env_vars"]["TQ_NUM_THREADS"]) <= min(8, psutil.cpu_count(logical=False))
    assert "TQ_NUM_THREADS" not in out["gpu"]["env_vars"]
