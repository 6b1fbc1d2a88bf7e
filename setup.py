"""verl_ext: EDGE-GRPO and GEPO as first-class verl (0.9.x) estimators, plus a CPU path for laptops.

CPU installs put ``pip install torch==2.13.0`` first (a CPU wheel) so no CUDA torch is pulled in; torch is
deliberately not pinned here.  GPU users add the ``vllm`` or ``sglang`` extra.
"""

from setuptools import find_packages, setup

setup(
    name="verl_ext",
    version="0.1.0",
    description="EDGE-GRPO and GEPO for verl, with a CPU platform and hf rollout for laptop-class debugging",
    packages=find_packages(include=["verl_ext", "verl_ext.*"]),
    python_requires=">=3.10",
    install_requires=[
        "verl>=0.9.1,<0.10",
        "torch",
        "transformers",
        "hydra-core",
        "omegaconf",
        "numpy",
        "pandas",
        "pyarrow",
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
        "vllm": ["vllm"],
        "sglang": ["sglang"],
        "test": ["pytest", "hypothesis"],
    },
    entry_points={"verl.plugins": ["verl_ext = verl_ext.plugin"]},
)
