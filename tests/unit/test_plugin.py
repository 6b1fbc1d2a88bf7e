"""verl_ext's plugin is lazy: ``import verl`` loads almost nothing of verl_ext, and every registration appears when
the verl module it extends is imported, in any fresh process (a driver, a Ray worker), with no import of verl_ext
in user code. A registration that fails is loud where it fires, naming the cause."""

from __future__ import annotations

import importlib
import inspect
import json
import logging
import os
import subprocess
import sys

import pytest

from verl_ext import import_hooks
from verl_ext.import_hooks import PluginHookError, when_imported

# verl modules the plugin hooks, and the verl_ext modules that must not be loaded before them
HOOKED = ("verl.trainer.ppo.core_algos", "verl.experimental.agent_loop", "verl.workers.config.optimizer")
HEAVY_EXT = ("verl_ext.algos.registry", "verl_ext.rollout.gec_agent_loop", "verl_ext.lr_schedule", "verl_ext.config",
             "verl_ext.verl_compat")

_REGISTRATIONS = r"""
from verl.trainer.ppo.core_algos import get_adv_estimator_fn
from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
from verl.workers.config.optimizer import FSDPOptimizerConfig


def registrations():
    fns = {name: get_adv_estimator_fn(name) for name in ("edge_grpo", "gepo")}
    cfg = FSDPOptimizerConfig(lr=1e-6, lr_scheduler_type="linear", total_training_steps=4, lr_warmup_steps=0,
                              weight_decay=0.0)
    return {"estimators": {name: f"{fn.__module__}.{fn.__name__}" for name, fn in fns.items()},
            "gec_agent": _agent_loop_registry.get("gec_agent"), "linear": cfg.lr_scheduler_type}
"""

# a driver: what `import verl` loads, then the registrations as verl's trainer would look them up
_DRIVER = r"""
import json, sys
import verl
loaded = {name: name in sys.modules for name in sys.argv[1].split(",")}
""" + _REGISTRATIONS + r"""
print("PROBE " + json.dumps({"after_import_verl": loaded, **registrations()}))
"""

# a Ray worker: the driver never imports verl; the task's process gets everything from verl's entry point
_RAY = r"""
import json, os, sys
import ray


@ray.remote
def probe():
    before = "verl" in sys.modules
""" + "\n".join("    " + line for line in _REGISTRATIONS.splitlines()) + r"""
    return {"pid": os.getpid(), "verl_before": before, **registrations()}


ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
try:
    out = ray.get(probe.remote(), timeout=240)
finally:
    ray.shutdown()
out["driver_pid"], out["driver_imported_verl"] = os.getpid(), "verl" in sys.modules
print("PROBE " + json.dumps(out))
"""

# a registration that fails inside a hook: a broken install of the module it imports (None in sys.modules)
_HOOK_FAILURE = r"""
import importlib, json, sys
import verl
from verl_ext import import_hooks
out = {"imports": {}}
for broken, target in (("verl_ext.algos.registry", "verl.trainer.ppo.core_algos"),
                       ("verl_ext.rollout.gec_agent_loop", "verl.experimental.agent_loop")):
    sys.modules[broken] = None
    try:
        importlib.import_module(target)
        out["imports"][target] = None
    except Exception as e:
        out["imports"][target] = f"{type(e).__name__}: {e}"
    del sys.modules[broken]  # repaired: the next target's import (it imports core_algos again) gets that far
out["failures"] = import_hooks.hook_failures()
from verl_ext.verl_compat import check_plugin_hooks
try:
    check_plugin_hooks()  # what verl_ext.main and the trainers run at start-up
    out["start_up"] = None
except Exception as e:
    out["start_up"] = {"type": type(e).__name__, "message": str(e), "import_error": isinstance(e, ImportError)}
print("PROBE " + json.dumps(out))
"""

# the plugin's own body failing (CPU mode cannot start): verl catches plugin errors and logs them at DEBUG
_PLUGIN_FAILURE = r"""
import json, sys
sys.modules["verl_ext.cpu.platform"] = None
import verl
print("PROBE " + json.dumps({"plugin_loaded": "verl_ext.plugin" in sys.modules}))
"""


def _start(script: str, *args: str, **env_changes) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items()
           if k not in ("VERL_PLATFORM", "VERL_USE_EXTERNAL_PLUGINS", "VERL_USE_EXTERNAL_MODULES", "RAY_ADDRESS")}
    env.update(env_changes)
    return subprocess.Popen([sys.executable, "-c", script, *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=os.path.dirname(__file__))


def _result(proc: subprocess.Popen) -> tuple[dict, str]:
    try:
        out, err = proc.communicate(timeout=420)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    assert proc.returncode == 0, (out + err)[-4000:]
    line = [ln for ln in out.splitlines() if ln.startswith("PROBE ")][-1]
    return json.loads(line[len("PROBE "):]), err


@pytest.fixture(scope="module")
def runs() -> dict:
    """Each fresh process once, all started together (each spends most of its time importing verl)."""
    watch = ",".join(("verl_ext.plugin", *HEAVY_EXT, *HOOKED))
    procs = {
        "driver": _start(_DRIVER, watch),
        "driver_cpu": _start(_DRIVER, watch, VERL_PLATFORM="cpu"),
        "hook_failure": _start(_HOOK_FAILURE),
        "plugin_failure": _start(_PLUGIN_FAILURE, VERL_PLATFORM="cpu"),
    }
    return {name: _result(proc) for name, proc in procs.items()}


def _assert_registered(out: dict) -> None:
    assert out["estimators"] == {"edge_grpo": "verl_ext.algos.registry.compute_edge_grpo_outcome_advantage",
                                 "gepo": "verl_ext.algos.registry.compute_gepo_outcome_advantage"}
    assert out["gec_agent"] == {"_target_": "verl_ext.rollout.gec_agent_loop.GecAgentLoop"}
    assert out["linear"] == "linear"  # verl's FSDP optimizer config accepted the linear schedule


def test_import_verl_loads_only_the_plugin(runs):
    loaded = runs["driver"][0]["after_import_verl"]
    assert loaded.pop("verl_ext.plugin")  # verl's entry point did load it
    assert not any(loaded.values()), loaded  # nothing heavy of verl_ext, and none of the modules it extends


@pytest.mark.parametrize("run", ["driver", "driver_cpu"])
def test_a_fresh_driver_has_every_registration(runs, run):
    _assert_registered(runs[run][0])


@pytest.fixture(scope="module")
def ray_run() -> dict:
    """Not with the other processes (this test comes after them): Ray's node gives up after 30 s of start-up."""
    return _result(_start(_RAY))[0]


def test_a_ray_worker_has_every_registration(ray_run):
    out = ray_run
    assert out["pid"] != out["driver_pid"] and not out["verl_before"] and not out["driver_imported_verl"]
    _assert_registered(out)


def test_a_failing_registration_never_breaks_verls_import_and_stops_verl_ext_at_start_up(runs):
    out, stderr = runs["hook_failure"]
    assert out["imports"] == {"verl.trainer.ppo.core_algos": None, "verl.experimental.agent_loop": None}
    assert len(out["failures"]) == 2
    start_up = out["start_up"]
    assert start_up is not None and start_up["type"] == "PluginHookError" and not start_up["import_error"]
    for (target, what), message in zip(
            (("verl.trainer.ppo.core_algos", "register the edge_grpo and gepo advantage estimators"),
             ("verl.experimental.agent_loop", "register the gec_agent agent loop")), out["failures"], strict=True):
        assert message.startswith(f"verl_ext could not {what} when {target} was imported: ModuleNotFoundError: ")
        assert message in stderr  # logged at ERROR where it fired
        assert message in start_up["message"]


def test_a_failing_plugin_is_logged_although_verl_swallows_it(runs):
    out, stderr = runs["plugin_failure"]
    assert not out["plugin_loaded"]  # verl went on without it
    assert "verl_ext's verl plugin (verl_ext.plugin) failed in this process" in stderr
    assert "verl_ext.cpu.platform" in stderr  # the cause, with its traceback


# ---------------------------------------------------------------- the hook mechanism, on a module of its own


@pytest.fixture
def fresh_module(tmp_path, monkeypatch):
    """A package ``hookprobe_pkg`` with a module ``mod`` on sys.path; hooks and modules removed afterwards."""
    pkg = tmp_path / "hookprobe_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "mod.py").write_text("VALUE = 41 + 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(import_hooks, "_HOOKS", {k: list(v) for k, v in import_hooks._HOOKS.items()})
    monkeypatch.setattr(import_hooks, "_FAILURES", [])
    importlib.invalidate_caches()
    yield "hookprobe_pkg.mod"
    for name in ("hookprobe_pkg.mod", "hookprobe_pkg"):
        sys.modules.pop(name, None)


def test_hook_runs_after_the_module_and_leaves_it_untouched(fresh_module):
    seen = []
    when_imported(fresh_module, "probe", lambda module: seen.append((module.VALUE, module.__loader__)))
    assert not seen  # not imported yet
    module = importlib.import_module(fresh_module)
    assert [value for value, _ in seen] == [42]  # once, after the module's code ran
    assert type(module.__loader__).__name__ == "SourceFileLoader" and module.__spec__.loader is module.__loader__
    assert seen[0][1] is module.__loader__
    assert inspect.getsource(module) == "VALUE = 41 + 1\n"
    importlib.reload(module)  # executed again: the hook runs again
    assert [value for value, _ in seen] == [42, 42]


def test_hook_on_an_imported_module_runs_at_once(fresh_module):
    module = importlib.import_module(fresh_module)
    seen = []
    when_imported(fresh_module, "probe", lambda m: seen.append(m))
    assert seen == [module]


def test_a_failing_hook_is_loud_and_names_the_cause(fresh_module, caplog):
    def hook(module):
        raise ValueError("the registry moved")

    when_imported(fresh_module, "register the probe", hook)
    with caplog.at_level(logging.ERROR, logger="verl_ext.import_hooks"):
        module = importlib.import_module(fresh_module)  # the import itself goes through
    assert module.VALUE == 42 and sys.modules[fresh_module] is module
    message = f"verl_ext could not register the probe when {fresh_module} was imported: ValueError: the registry moved"
    assert any(r.levelno == logging.ERROR and r.getMessage().startswith(message) for r in caplog.records)
    assert [m for m in import_hooks.hook_failures() if m.startswith(message)]
    with pytest.raises(PluginHookError) as e:  # at start-up (verl_compat.check_plugin_hooks)
        import_hooks.raise_hook_failures()
    assert message in str(e.value) and not isinstance(e.value, ImportError)


def test_an_around_hook_that_fails_fails_the_import(fresh_module):
    def hook(exec_module, module):
        raise ValueError("cannot patch")

    when_imported(fresh_module, "patch the probe", hook, around=True)
    with pytest.raises(PluginHookError, match="cannot patch"):
        importlib.import_module(fresh_module)
    assert fresh_module not in sys.modules  # its code never ran: a failed import


def test_the_finders_lookup_guard_is_per_thread(fresh_module):
    """A thread looking up a watched name must not make another thread's import of it skip the hook."""
    import threading

    finder = next(f for f in sys.meta_path if isinstance(f, import_hooks._PostImportFinder))
    seen = []
    when_imported(fresh_module, "probe", lambda m: seen.append(m))
    path = importlib.import_module(fresh_module.rpartition(".")[0]).__path__
    finder._searching().add(fresh_module)  # this thread is mid-lookup of the name
    try:
        specs = []
        thread = threading.Thread(target=lambda: specs.append(finder.find_spec(fresh_module, path)))
        thread.start()
        thread.join(timeout=30)
        assert specs and isinstance(specs[0].loader, import_hooks._HookedLoader)  # the other thread's is hooked
        assert finder.find_spec(fresh_module, path) is None  # this thread's own nested lookup passes through
    finally:
        finder._searching().discard(fresh_module)


def test_module_initializing_is_true_only_while_the_module_body_runs(tmp_path, monkeypatch):
    (tmp_path / "initprobe_mod.py").write_text(
        "from verl_ext.import_hooks import module_initializing\nDURING = module_initializing(__name__)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    try:
        module = importlib.import_module("initprobe_mod")
        assert module.DURING and not import_hooks.module_initializing("initprobe_mod")
        assert not import_hooks.module_initializing("no_such_module_here")
    finally:
        sys.modules.pop("initprobe_mod", None)


# ---------------------------------------------------------------- reloads and drift never break an import


def test_reloading_the_registry_reregisters_without_verl_raising():
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn, register_adv_est

    from verl_ext.algos import registry

    old = get_adv_estimator_fn("edge_grpo")
    reloaded = importlib.reload(registry)  # verl's register_adv_est raises for a second function under a name
    assert get_adv_estimator_fn("edge_grpo") is reloaded.compute_edge_grpo_outcome_advantage is not old
    assert get_adv_estimator_fn("gepo") is reloaded.compute_gepo_outcome_advantage

    def other(**kwargs):  # another module's function under the name is still refused, as verl refuses it
        return None

    with pytest.raises(ValueError, match="already been registered"):
        register_adv_est("edge_grpo")(other)


def test_a_verl_drift_breaks_only_the_gec_agent_loop_not_its_import(monkeypatch):
    from verl_ext import verl_compat
    from verl_ext.rollout import gec_agent_loop

    def drifted():
        raise verl_compat.VerlCompatError("AgentLoopOutput lost a field")

    monkeypatch.setattr(verl_compat, "check_agent_loop", drifted)
    module = importlib.reload(gec_agent_loop)  # the import (the plugin's hook on verl's agent loop) goes through
    monkeypatch.setattr(module, "_VERL_CHECKED", [])
    with pytest.raises(verl_compat.VerlCompatError, match="lost a field"):
        module.GecAgentLoop()  # the check runs when the loop is first built
    monkeypatch.undo()
    importlib.reload(gec_agent_loop)
