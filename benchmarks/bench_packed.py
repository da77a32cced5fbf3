"""Times the packed GEMM kernel (csrc/packed*.c) against the row kernels the matmul uses today.

    python benchmarks/bench_packed.py [--types q4_1,q5_0,q8_0] [--n 1,4,8,16,128] [--isa best] [--cols 1536]
                                      # --types also takes q4_0, q4_K, q5_K and q6_K

One thread. For each weight type, a matrix that fits in L2 (~384 KiB) and a large one (~60 MB,
memory-bound), multiplied by n activation rows already quantized to the type's vec_dot_type:
  packed  pl_gemm_packed on the 8-row interleaved layout
  rows    vec_dot per weight row for n = 1, vec_dot_rows (every activation row per weight row) above,
          as matmul.c's vec_dot path does
Prints ns and cycles per (block of 32 of one weight row, activation row): cycles at --ghz, or else
at the "cpu MHz" /proc/cpuinfo reports (a nominal clock: under turbo the true count is higher).
Each figure is the best of 5 timings of enough kernel runs to fill ~0.2 s, run inside C (no Python
between runs), in this thread's CPU time: on a shared machine, time spent descheduled is not counted.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's pyllm
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

from bench import git_commit, machine, version  # noqa: E402
from pyllm import _core, _kernels  # noqa: E402
from pyllm.dtypes import WeightType as W  # noqa: E402

TYPES = {"q4_0": W.Q4_0, "q4_1": W.Q4_1, "q5_0": W.Q5_0, "q8_0": W.Q8_0, "q4_K": W.Q4_K, "q5_K": W.Q5_K, "q6_K": W.Q6_K}


def cpu_mhz() -> float:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("cpu MHz"):
                    return float(line.split(":")[1])
    except OSError:
        pass
    return float("nan")


def random_matrix(t: W, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Quantized gaussian rows, a few thousand distinct ones tiled: quantizing 60 MB row by row would
    take longer than the benchmark, and the kernels' speed does not depend on the values."""
    distinct = min(rows, 1024)
    base = np.concatenate([_kernels.from_f32(int(t), rng.standard_normal(cols).astype(np.float32))
                           for _ in range(distinct)])
    return np.resize(base, rows * base.size // distinct)


def on_huge_pages(a: np.ndarray) -> np.ndarray:
    """A copy of a on transparent 2 MB pages, as the model's weights get them (csrc/memory.c): on 4 KB
    pages a stream from memory meets a TLB miss and a prefetcher restart every 4 KB."""
    from bench_bandwidth import HUGE_PAGE, read_buffer

    buf = read_buffer(a.nbytes + HUGE_PAGE).view(np.uint8)[:a.nbytes]
    buf[:] = a
    return buf


def best_time(fn, target_s: float = 0.2) -> float:
    """Seconds per kernel run: fn(repeat) runs the kernel repeat times."""
    start = time.thread_time()
    fn(1)
    once = max(time.thread_time() - start, 1e-6)
    repeat = max(1, int(target_s / once))
    best = float("inf")
    for _ in range(5):
        start = time.thread_time()
        fn(repeat)
        best = min(best, (time.thread_time() - start) / repeat)
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--types", default="q4_1,q5_0,q8_0")
    parser.add_argument("--n", default="1,4,8,16,128")
    parser.add_argument("--isa", default="best")
    parser.add_argument("--cols", type=int, default=1536,
                        help="row length: 1536 (SmolLM2-ish), 3072 (3B's q, gate, up), 8192 (its down)")
    parser.add_argument("--memory-mib", type=int, default=60,
                        help="the memory-bound matrix's size: make it larger than the last-level cache")
    parser.add_argument("--ghz", type=float, help="the core's clock for the cycle counts")
    args = parser.parse_args()
    isa = _core.set_isa(args.isa)
    mhz = args.ghz * 1e3 if args.ghz else cpu_mhz()
    m = machine()
    print(f"CPU: {m['cpu']} ({m['flags']}); cores: {m['cores']}; 1 thread; ISA {isa}; "
          f"cycles at {mhz:.0f} MHz{'' if args.ghz else ' (cpu MHz)'}; load {m['load']}")
    print(f"numpy {version('numpy')}; commit {git_commit()}")
    print("ns and cycles per (block of 32, activation row)")
    rng = np.random.default_rng(0)
    for name in args.types.split(","):
        t = TYPES[name]
        row_bytes = _core.row_size(int(t), args.cols)
        for label, target in (("L2", 384 << 10), ("memory", args.memory_mib << 20)):
            rows = max(8, target // row_bytes // 8 * 8)
            w = on_huge_pages(random_matrix(t, rows, args.cols, rng))
            packed = on_huge_pages(_kernels.pack_weights(int(t), w, rows, args.cols))
            print(f"\n{name} ({rows}, {args.cols}), {w.size / 2**20:.1f} MiB ({label})")
            print(f"{'n':>5} {'packed ns':>10} {'cycles':>7} {'rows ns':>9} {'cycles':>7} {'speed-up':>9}")
            for n in (int(v) for v in args.n.split(",")):
                x = rng.standard_normal((n, args.cols)).astype(np.float32)
                xq = _kernels.from_f32(_core.vec_dot_type(int(t)), x.reshape(-1))
                units = rows * (args.cols // 32) * n
                tp = best_time(lambda r: _kernels.gemm_packed_quantized(int(t), packed, rows, args.cols, xq, n, repeat=r))
                tr = best_time(lambda r: _kernels.dot_rows_matrix(int(t), w, rows, args.cols, xq, n, repeat=r))
                p_ns, r_ns = tp / units * 1e9, tr / units * 1e9
                print(f"{n:>5} {p_ns:>10.3f} {p_ns * mhz / 1e3:>7.2f} {r_ns:>9.3f} {r_ns * mhz / 1e3:>7.2f} "
                      f"{tr / tp:>8.2f}x")


if __name__ == "__main__":
    main()
