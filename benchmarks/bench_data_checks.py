"""Time and memory of the start-up data checks (``verl_ext.data_checks.check_gec_data``) on a large local parquet.

    python benchmarks/bench_data_checks.py [--rows 100000] [--row-group 10000] [--file /tmp/bench_data_checks.parquet]

Writes (once) a training file in the layout ``verl_ext.data`` writes: chat prompt, ``reward_model`` struct,
``extra_info`` struct with problem, answer and a reference solution, in row groups of ``--row-group`` rows. Then runs
the check in a fresh process per case (GEC off, GEC on with the answer drawable, GEC on with only the solution
fallback) and prints its wall time, the process's peak RSS above what it held before the check, the peak of
pyarrow's memory pool and, in a second process, the peak of Python allocations (tracemalloc).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

CASES = {
    "gec_off": {},
    "gec_on": {"enable": True},
    "gec_on_solution_only": {"enable": True, "p_reflect": 0.5, "p_answer": 0.0, "p_solution": 0.5},
}


def write_file(path: str, rows: int, row_group: int) -> None:
    """``rows`` rows of a DeepScaleR-like training set (a few hundred characters of problem, ~1 KB solution)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from verl_ext.data.common import verl_row

    writer = None
    for start in range(0, rows, row_group):
        chunk = []
        for i in range(start, min(start + row_group, rows)):
            problem = f"Problem {i}: find the number of integers n such that " + "n^2 + 3n + 7 is prime, " * 8
            solution = f"Step {i}. " + "We reduce modulo small primes and count the residues that remain. " * 16
            chunk.append(verl_row("deepscaler", problem, str(i % 97), "train", i, extra={"solution": solution}))
        table = pa.Table.from_pylist(chunk)
        if writer is None:
            writer = pq.ParquetWriter(path, table.schema)
        writer.write_table(table, row_group_size=row_group)
    writer.close()


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def child(case: str, path: str, trace: bool) -> dict:
    """One check in this process: seconds, peak RSS above the start, pyarrow pool peak (or tracemalloc's peak)."""
    import pyarrow as pa

    from verl_ext.config import GecConfig
    from verl_ext.data_checks import check_gec_data

    gec = GecConfig(**CASES[case]).validate()
    config = {"data": {"train_files": [path], "val_files": None}}
    before = rss_bytes()
    if trace:
        import tracemalloc

        tracemalloc.start()
        check_gec_data(config, gec)
        return {"python_peak_mb": tracemalloc.get_traced_memory()[1] / 2**20}
    start = time.perf_counter()
    check_gec_data(config, gec)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"seconds": seconds, "rss_peak_above_start_mb": max(peak - before, 0) / 2**20,
            "arrow_pool_peak_mb": pa.default_memory_pool().max_memory() / 2**20}


def run_child(case: str, path: str, trace: bool) -> dict:
    cmd = [sys.executable, __file__, "--child", case, "--file", path] + (["--trace"] if trace else [])
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--row-group", type=int, default=10_000)
    parser.add_argument("--file", default="/tmp/bench_data_checks.parquet")
    parser.add_argument("--child", choices=sorted(CASES))
    parser.add_argument("--trace", action="store_true")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.file, args.trace)))
        return
    if not os.path.exists(args.file):
        write_file(args.file, args.rows, args.row_group)
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(args.file).metadata
    print(f"{args.file}: {meta.num_rows} rows, {meta.num_row_groups} row groups, "
          f"{os.path.getsize(args.file) / 2**20:.1f} MB")
    for case in CASES:
        result = {**run_child(case, args.file, False), **run_child(case, args.file, True)}
        print(f"{case:22s} " + "  ".join(f"{k} {v:.2f}" for k, v in result.items()))


if __name__ == "__main__":
    main()
