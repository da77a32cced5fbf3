"""Decode speed deep in a context with an f32 and an f16 KV cache.

    python benchmarks/bench_kv.py [--model smollm2] [--pos 2000] [--steps 64] [--runs 5] [--threads 2]

Both caches are filled with the same --pos random tokens, then each times --steps one-token decode
steps from there (truncated back to --pos before every run), the two alternating run by run so
that a noisy machine slows both alike. Prints the median tok/s of each and their ratio.
"""
from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's pyllm

import numpy as np  # noqa: E402

import pyllm  # noqa: E402
from pyllm import _core  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--pos", type=int, default=2000)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    n_ctx = args.pos + args.steps
    llm = pyllm.load(args.model, threads=args.threads, n_ctx=n_ctx)
    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.integers(3, llm.vocab_size, args.pos)]
    feed = [int(t) for t in rng.integers(3, llm.vocab_size, args.steps)]
    seqs = {kv: _core.CoreSequence(llm._core, n_ctx, kv_dtype=kv) for kv in ("f32", "f16")}
    for seq in seqs.values():
        seq.forward(prompt)
    rates: dict[str, list[float]] = {kv: [] for kv in seqs}
    for run in range(args.runs):
        for kv in ("f32", "f16") if run % 2 == 0 else ("f16", "f32"):
            seq = seqs[kv]
            seq.truncate(args.pos)
            t0 = time.perf_counter()
            for t in feed:
                seq.forward([t])
            rates[kv].append(args.steps / (time.perf_counter() - t0))
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor())
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    print(f"{cpu}, {os.cpu_count()} cores, {args.threads} threads, isa {_core.current_isa()}; "
          f"pyllm {commit}, Python {platform.python_version()}, numpy {np.__version__}; {llm.source}")
    for kv, r in rates.items():
        print(f"{kv} cache ({seqs[kv].cache_bytes / 2**20:.0f} MiB): {args.steps} decode steps from position "
              f"{args.pos}: median {np.median(r):.1f} tok/s (runs {' '.join(f'{x:.1f}' for x in r)})")
    print(f"f16 / f32: {np.median(rates['f16']) / np.median(rates['f32']):.2f}x")


if __name__ == "__main__":
    main()
