"""Time GEC's columns of verl's rollout dump against verl's own decoding of the same step, one run.

    python benchmarks/bench_gec_dump.py [--batch 4096] [--width 2048] [--repeats 5]

verl's ``_log_rollout_data`` decodes every prompt and response of the step (``tokenizer.batch_decode``) when
``trainer.rollout_data_dir`` is set; ``gec_dump_columns`` decodes each response again, piece by piece (one
``batch_decode`` call for all pieces), and the first response of the solution rows. Both run on the driver, only while the dump is on (the agent loop decodes nothing). Prints the median wall
time per step and the ratio of GEC's columns to verl's decoding of the responses (goal: <= 2.5x: one more decode
of every response, in a few pieces).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from verl_ext.rollout import gec
from verl_ext.toy.tokenizer import build_tokenizer
from verl_ext.trainer.gec_dump import gec_dump_columns


def make_step(batch: int, width: int, vocab: int, seed: int = 0):
    """Right-padded responses and v1-style extra_fields: a quarter each none / reflect / answer / solution."""
    rng = np.random.default_rng(seed)
    responses = torch.zeros(batch, width, dtype=torch.int64)
    extra = []
    for i in range(batch):
        n = int(rng.integers(width // 4, width + 1))
        responses[i, :n] = torch.from_numpy(rng.integers(0, vocab, n))
        kind = ("none", "reflect", "answer", "solution")[i % 4]
        core = max(1, n - 64)
        spans = {"none": [["policy", 0, n]],
                 "reflect": [["policy", 0, core], ["cue", core, core + 8], ["continuation", core + 8, n]],
                 "answer": [["policy", 0, n - 12], ["answer", n - 12, n - 1], ["eos", n - 1, n]],
                 "solution": [["solution", 0, n - 1], ["eos", n - 1, n]]}[kind]
        row = {gec.KEY_BRANCH: kind, gec.KEY_SCORE_BEFORE: 0.0, gec.KEY_CORRECT_BEFORE: False, gec.KEY_SPANS: spans}
        if kind == "solution":
            row[gec.KEY_FIRST_RESPONSE_IDS] = rng.integers(0, vocab, n).tolist()
        extra.append(row)
    uid = [f"uid-{i // 8}" for i in range(batch)]
    return responses, {"extra_fields": np.array(extra, dtype=object)}, uid


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    tok = build_tokenizer()
    responses, non_tensor, uid = make_step(args.batch, args.width, tok.vocab_size)

    def batch_decode(pieces):  # as verl_ext's trainers pass it
        return tok.batch_decode(pieces, skip_special_tokens=True)

    calls = {
        "verl: batch_decode(responses)": lambda: tok.batch_decode(responses, skip_special_tokens=True),
        "verl_ext: gec_dump_columns": lambda: gec_dump_columns(non_tensor, responses, uid, ["math"] * len(uid),
                                                               batch_decode),
    }
    times = {name: [] for name in calls}
    for _ in range(args.repeats):  # interleaved round by round
        for name, fn in calls.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    base = statistics.median(times["verl: batch_decode(responses)"])
    print(f"batch {args.batch} x width {args.width} (toy tokenizer), median of {args.repeats}:")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"  {name:32s} {med * 1e3:9.1f} ms   {med / base:5.2f}x verl's response decode")


if __name__ == "__main__":
    main()
