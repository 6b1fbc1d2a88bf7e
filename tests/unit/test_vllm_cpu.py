"""Units of verl_ext.cpu.vllm_cpu: the two patches for vLLM's CPU build and the CPU defaults of rollout.name=vllm.
No vLLM needed (fakes stand in for it); tests/e2e/test_vllm_rollout.py runs the real thing."""

import importlib.metadata
import sys
import textwrap

import pytest
from omegaconf import OmegaConf

from verl_ext import import_hooks
from verl_ext.config import ConfigError
from verl_ext.cpu import vllm_cpu


def fake_metadata(versions: dict):
    def version(name):
        if name in versions:
            return versions[name]
        raise importlib.metadata.PackageNotFoundError(name)

    return version


# ---------------------------------------------------------------- 1. verl's version lookup


def test_version_lookup_falls_back_to_the_cpu_build_like_vllm():
    version = vllm_cpu._version_with_cpu_build(fake_metadata({"vllm-cpu": "0.31.0", "torch": "2.13.0+cpu"}))
    assert version("vllm") == "0.31.0+cpu"  # vllm/platforms/__init__.py: version("vllm-cpu") + "+cpu"
    assert version("torch") == "2.13.0+cpu"
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        version("sglang")  # other names are untouched
    assert vllm_cpu._version_with_cpu_build(version) is version  # no double wrapping


def test_version_lookup_prefers_a_real_vllm_distribution():
    version = vllm_cpu._version_with_cpu_build(fake_metadata({"vllm": "0.24.0", "vllm-cpu": "0.31.0"}))
    assert version("vllm") == "0.24.0"


@pytest.fixture
def fake_package(tmp_path, monkeypatch):
    """A package shaped like verl/third_party/vllm: binds importlib.metadata.version and calls it at import."""
    pkg = tmp_path / "fake_verl_ext_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "third_party_vllm.py").write_text(textwrap.dedent("""
        from importlib.metadata import PackageNotFoundError, version

        def get_version(pkg):
            try:
                return version(pkg)
            except PackageNotFoundError:
                return None

        package_version = get_version("vllm")
        if package_version is None:
            raise ValueError("vllm version None not supported")
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(import_hooks, "_HOOKS", {k: list(v) for k, v in import_hooks._HOOKS.items()})
    yield "fake_verl_ext_pkg.third_party_vllm"
    for name in [n for n in sys.modules if n.startswith("fake_verl_ext_pkg")]:
        del sys.modules[name]


def test_version_patch_runs_when_the_module_is_imported_and_only_there(fake_package, monkeypatch):
    lookup = fake_metadata({"vllm-cpu": "0.31.0"})
    monkeypatch.setattr(importlib.metadata, "version", lookup)
    monkeypatch.setattr(vllm_cpu, "_import_vllm", lambda: None)
    importlib.invalidate_caches()
    with pytest.raises(ValueError, match="None not supported"):  # the upstream failure, unpatched
        __import__(fake_package)
    sys.modules.pop(fake_package, None)

    vllm_cpu._when_imported(fake_package, vllm_cpu._patch_verl_vllm_version_lookup)
    module = __import__(fake_package, fromlist=["x"])
    assert module.package_version == "0.31.0+cpu"
    assert module.get_version("vllm") == "0.31.0+cpu"  # later lookups through the module keep working
    assert importlib.metadata.version is lookup  # the global function is back as it was


def test_patch_applies_at_once_to_a_module_already_imported(fake_package, monkeypatch):
    monkeypatch.setattr(importlib.metadata, "version", fake_metadata({"vllm": "0.24.0"}))
    module = __import__(fake_package, fromlist=["x"])
    calls = []
    vllm_cpu._when_imported(fake_package, lambda exec_module, m: calls.append(m))
    assert calls == [module]


# ---------------------------------------------------------------- 2. CPU weight prepacking keeps the weight


def test_gemm_dispatch_always_keeps_the_unpacked_weight():
    seen = []

    def dispatch_cpu_unquantized_gemm(layer, remove_weight):
        seen.append((layer, remove_weight))

    patched = vllm_cpu._keep_unpacked_weight(dispatch_cpu_unquantized_gemm)
    patched("linear", remove_weight=True)  # what UnquantizedLinearMethod.process_weights_after_loading passes
    patched("embedding", False)
    assert seen == [("linear", False), ("embedding", False)]
    assert vllm_cpu._keep_unpacked_weight(patched) is patched


def test_gemm_patch_replaces_the_module_attribute():
    module = type(sys)("fake_vllm_layers_utils")
    module.dispatch_cpu_unquantized_gemm = lambda layer, remove_weight: remove_weight
    vllm_cpu._patch_vllm_cpu_gemm_keeps_weight(lambda m: None, module)
    assert module.dispatch_cpu_unquantized_gemm(None, remove_weight=True) is False


def test_patches_stay_off_without_the_cpu_build(monkeypatch):
    monkeypatch.setattr(vllm_cpu, "_distribution_version", lambda n: {"vllm": "0.24.0"}.get(n))
    assert not vllm_cpu.vllm_cpu_build_installed()
    hooks = import_hooks.watched()
    assert vllm_cpu.install_vllm_cpu_patches() is False
    assert import_hooks.watched() == hooks


# ---------------------------------------------------------------- the install check


@pytest.mark.parametrize("versions, spec, problem", [
    ({"vllm-cpu": "0.31.0"}, True, None),
    ({"vllm-cpu": "0.31.0", "torchvision": "0.28.0+cpu"}, True, None),
    ({}, False, "vLLM is not installed"),
    ({"vllm": "0.24.0"}, True, "not its CPU build"),
    ({"vllm-cpu": "0.31.0", "torchaudio": "2.11.1"}, True, "torchaudio 2.11.1 (a CUDA build)"),
])
def test_install_problem(monkeypatch, versions, spec, problem):
    monkeypatch.setattr(vllm_cpu, "_distribution_version", versions.get)
    monkeypatch.setattr(vllm_cpu.importlib.util, "find_spec", lambda name: object() if spec else None)
    found = vllm_cpu.vllm_cpu_install_problem()
    assert found == problem if problem is None else problem in found


# ---------------------------------------------------------------- CPU defaults of rollout.name=vllm


def make_config(name="vllm", param_dtype="fp32", **rollout):
    values = dict(name=name, enable_sleep_mode=True, enforce_eager=False, dtype="bfloat16")
    values.update(rollout)
    actor = {"fsdp_config": {"mixed_precision": {"param_dtype": param_dtype}}} if param_dtype else {}
    return OmegaConf.create({"actor_rollout_ref": {"actor": actor, "rollout": values}})


@pytest.fixture
def installed(monkeypatch):
    monkeypatch.setattr(vllm_cpu, "vllm_cpu_install_problem", lambda: None)


R = "actor_rollout_ref.rollout"


def test_cpu_defaults_for_keys_the_user_did_not_set(installed):
    cfg = make_config()
    changed = vllm_cpu.apply_cpu_vllm_rollout_defaults(cfg, ["trainer.total_training_steps"])
    assert changed == {f"{R}.enable_sleep_mode": False, f"{R}.enforce_eager": True, f"{R}.dtype": "float32"}
    assert (cfg.actor_rollout_ref.rollout.enable_sleep_mode, cfg.actor_rollout_ref.rollout.enforce_eager,
            cfg.actor_rollout_ref.rollout.dtype) == (False, True, "float32")


def test_rollout_dtype_follows_the_actor_and_verls_bf16_default(installed):
    cfg = make_config(param_dtype=None)  # no mixed_precision node: verl's FSDP computes in bf16
    vllm_cpu.apply_cpu_vllm_rollout_defaults(cfg)
    assert cfg.actor_rollout_ref.rollout.dtype == "bfloat16"
    with pytest.raises(ConfigError, match=r"param_dtype='int8'.*actor_rollout_ref\.rollout\.dtype"):
        vllm_cpu.apply_cpu_vllm_rollout_defaults(make_config(param_dtype="int8"))


def test_explicit_values_are_kept_when_they_can_work(installed):
    cfg = make_config(enable_sleep_mode=False)
    changed = vllm_cpu.apply_cpu_vllm_rollout_defaults(
        cfg, [f"{R}.dtype", f"{R}.enforce_eager", f"{R}.enable_sleep_mode", f"+{R}.engine_kwargs.vllm.x"])
    assert changed == {}
    assert (cfg.actor_rollout_ref.rollout.enforce_eager, cfg.actor_rollout_ref.rollout.dtype) == (False, "bfloat16")


def test_explicit_sleep_mode_is_a_start_up_error_naming_the_key(installed):
    with pytest.raises(ConfigError, match=r"actor_rollout_ref\.rollout\.enable_sleep_mode=true cannot work on CPU"):
        vllm_cpu.apply_cpu_vllm_rollout_defaults(make_config(), [f"{R}.enable_sleep_mode"])


def test_other_backends_are_untouched(monkeypatch):
    monkeypatch.setattr(vllm_cpu, "vllm_cpu_install_problem", lambda: "must not be asked")
    cfg = make_config(name="hf")
    assert vllm_cpu.apply_cpu_vllm_rollout_defaults(cfg) == {}
    assert cfg.actor_rollout_ref.rollout.enable_sleep_mode is True


def test_missing_install_is_a_start_up_error_with_the_fix(monkeypatch):
    monkeypatch.setattr(vllm_cpu, "vllm_cpu_install_problem", lambda: "vLLM is not installed")
    with pytest.raises(ConfigError, match=r"actor_rollout_ref\.rollout\.name=vllm on CPU.*vllm-cpu.*uninstall"):
        vllm_cpu.apply_cpu_vllm_rollout_defaults(make_config())
