"""The embedded default toy, fully built: a from-scratch build (the 1000-step warm-up) has the task's
promised step-0 properties, read from the build's own figures (verl_ext/toy/build.py ``reason_step0_figures``), and
reproduces the packaged weights bit for bit on a machine with the CPU they were built on."""

from __future__ import annotations

import pytest

from verl_ext.toy import build as toy_build
from verl_ext.toy import build_toy_assets

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return build_toy_assets(cache_dir=tmp_path_factory.mktemp("toy"), from_scratch=True, verbose=False)


def test_default_toy_has_the_papers_setting_in_miniature(assets):
    assert assets.stats["weights_source"] == "warm-up"
    f = assets.stats["step0"]
    assert set(f) == {"toy_chain", "toy_bag", "toy_chain6"} and all(v["n"] >= 100 for v in f.values())
    assert all(v["median_len"] >= 8 for v in f.values())  # several steps before the marked answer
    # the hard split starts all-wrong: (almost) no sampled or greedy solve of a six-digit chain
    assert f["toy_chain6"]["acc_t1"] <= 0.02 and f["toy_chain6"]["acc_greedy"] <= 0.02
    # the two warmed-up families are learned (GRPO has signal there) but not solved
    for source in ("toy_chain", "toy_bag"):
        assert 0.05 <= f[source]["acc_t1"] <= 0.9, (source, f[source])
    # GEPO's multi-task case: step-0 mean token entropy differs at least 2x between the two families
    h = sorted((f["toy_chain"]["entropy"], f["toy_bag"]["entropy"]))
    assert h[1] >= 2 * h[0], f
    # the reflection cue repairs: after a wrong attempt + "!", a sampled continuation is often right
    assert max(f["toy_chain"]["repair_t1"], f["toy_bag"]["repair_t1"]) >= 0.1, f


def test_the_warm_up_reproduces_the_packaged_weights(assets):
    _, record = toy_build.shipped_weights()
    if record.get("cpu") != toy_build.cpu_signature():
        pytest.skip(f"packaged weights built on {record.get('cpu')}, this machine is {toy_build.cpu_signature()}: "
                    "other SIMD kernels may round differently (the packaged weights are what every machine uses)")
    assert assets.stats["weights_sha256"] == record["weights_sha256"]
    assert assets.stats["step0"] == record["step0"]  # the figures come from seeded generation too
