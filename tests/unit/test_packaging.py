"""Install: the GPU extras are verl's own, and a non-editable install ships the Hydra configs."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import runpy
import shutil
import subprocess
import sys

import pytest
import setuptools
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


@pytest.fixture(scope="module")
def setup_kwargs():
    """What setup.py passes to setuptools.setup (run with setup() captured, nothing built)."""
    captured = {}
    original = setuptools.setup
    setuptools.setup = lambda **kw: captured.update(kw)
    try:
        runpy.run_path(os.path.join(REPO, "setup.py"), run_name="__main__")
    finally:
        setuptools.setup = original
    return captured


def _key(req: Requirement):
    return canonicalize_name(req.name), frozenset(req.extras)


def verl_extra(extra: str) -> list[Requirement]:
    reqs = [Requirement(r) for r in importlib.metadata.requires("verl") or []]
    return [r for r in reqs if r.marker is not None and r.marker.evaluate({"extra": extra})
            and not r.marker.evaluate({"extra": "__none__"})]


def _verl_requirements(setup_kwargs, extra: str | None = None) -> list[Requirement]:
    reqs = setup_kwargs["install_requires"] if extra is None else setup_kwargs["extras_require"][extra]
    return [r for r in map(Requirement, reqs) if canonicalize_name(r.name) == "verl"]


@pytest.mark.parametrize("extra", ["vllm", "sglang"])
def test_gpu_extras_are_verls_own_over_the_base_verl_range(setup_kwargs, extra):
    """[vllm] / [sglang] are verl's extra of that name over the same verl range as the base install: the backend pins
    come from the verl release pip installs, never from a copy that a newer verl in the range contradicts."""
    (base,) = _verl_requirements(setup_kwargs)
    ours = [Requirement(r) for r in setup_kwargs["extras_require"][extra]]
    assert [canonicalize_name(r.name) for r in ours] == ["verl"], ours  # anything else would be a copied pin
    assert ours[0].extras == {extra} and ours[0].marker is None
    assert ours[0].specifier == base.specifier, f"[{extra}] allows verl{ours[0].specifier}, the base verl{base.specifier}"


@pytest.mark.parametrize("extra, backend", [("vllm", "vllm"), ("sglang", "sglang")])
def test_installed_verl_declares_the_extras_with_their_backend(setup_kwargs, extra, backend):
    """What ``pip install verl_ext[vllm]`` resolves to on the installed verl: a release our range accepts, whose extra
    of that name exists and brings the backend (a verl that renamed or emptied it would install no backend)."""
    verl_version = importlib.metadata.version("verl")
    (ours,) = _verl_requirements(setup_kwargs, extra)
    assert ours.specifier.contains(verl_version), f"[{extra}] allows verl{ours.specifier}, installed {verl_version}"
    theirs = {canonicalize_name(r.name): r for r in verl_extra(extra)}
    assert backend in theirs, f"verl {verl_version}'s [{extra}] is {sorted(map(str, theirs.values()))}"


def test_math_verify_is_installed_by_the_readme_install(setup_kwargs):
    names = {canonicalize_name(Requirement(r).name) for r in setup_kwargs["install_requires"]}
    assert "math-verify" in names


def _can_build_wheels_here() -> bool:
    """setuptools with bdist_wheel (>= 70.1, or the wheel package): old venvs from ensurepip lack it."""
    if importlib.util.find_spec("setuptools") is None:
        return False
    return (importlib.util.find_spec("setuptools.command.bdist_wheel") is not None
            or importlib.util.find_spec("wheel") is not None)


def test_non_editable_install_composes_the_main_config(tmp_path):
    """``pip install .`` (here: --target, no deps) ships the configs; ``python -m verl_ext.main`` composes them."""
    src, target = tmp_path / "src", tmp_path / "site"
    src.mkdir()
    shutil.copy(os.path.join(REPO, "setup.py"), src)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for folder in ("verl_ext", "hydra_configs"):
        shutil.copytree(os.path.join(REPO, folder), src / folder, ignore=ignore)
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(src)]
    if _can_build_wheels_here():
        cmd.insert(-1, "--no-build-isolation")  # offline; otherwise pip fetches setuptools from the registry
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    repo_configs = {p.relative_to(src / "hydra_configs") for p in (src / "hydra_configs").rglob("*.yaml")}
    installed = {p.relative_to(target / "verl_ext" / "hydra_configs")
                 for p in (target / "verl_ext" / "hydra_configs").rglob("*.yaml")}
    assert repo_configs and repo_configs <= installed, repo_configs - installed  # config groups in subfolders too
    assert not (target / "hydra_configs").exists()  # not a stray top-level folder in site-packages
    assert (target / "verl_ext" / "rewards" / "math_verify_worker.py").is_file()

    run_dir = tmp_path / "elsewhere"  # not the repository: only the installed copy can be found
    run_dir.mkdir()
    env = dict(os.environ, PYTHONPATH=str(target))
    probe = subprocess.run([sys.executable, "-c", "import importlib.util as u; print(u.find_spec('verl_ext').origin)"],
                           capture_output=True, text=True, timeout=600, cwd=run_dir, env=env)
    assert probe.stdout.strip() == str(target / "verl_ext" / "__init__.py"), probe.stdout + probe.stderr
    # the installed main.py finds no repository beside it: composing proves the packaged configs are used
    job = subprocess.run([sys.executable, "-m", "verl_ext.main", "--config-name", "verl_ext", "--cfg", "job"],
                         capture_output=True, text=True, timeout=600, cwd=run_dir, env=env)
    assert job.returncode == 0, job.stderr[-3000:]
    assert "default_agent_loop: gec_agent" in job.stdout and "adv_estimator: edge_grpo" in job.stdout
    assert "  gec:" in job.stdout and "  gepo:" in job.stdout and "  edge_grpo:" in job.stdout


def test_checkout_uses_the_repository_configs():
    from verl_ext.main import config_dir

    assert config_dir() == os.path.join(REPO, "hydra_configs")
