"""The memory-bandwidth ceiling of decode on this machine: a STREAM-like read of a buffer much larger
than the last-level cache, by 1 and by N threads, and what it implies for a model's decode.

Decode reads every weight once per token, so a model of W bytes cannot decode faster than
bandwidth / W tokens per second. The read is numpy's max-reduction over uint64 (a vectorised
loop that releases the GIL), one contiguous slice per thread; the figure is the best of the
repeats, as STREAM reports it.

    python benchmarks/bench_bandwidth.py [--threads 2] [--gib 1] [--model PATH --decode TOK_S]

With --model, the bytes of the matrices decode reads per token (every layer matrix and the head)
are summed from the file and the decode figure given is put against the ceiling.
"""
from __future__ import annotations

import argparse
import os
import threading
import time

import numpy as np


HUGE_PAGE = 2 << 20


def read_buffer(nbytes: int) -> np.ndarray:
    """A uint64 buffer of nbytes, written so every page is resident, on 2 MB pages where Linux
    gives them: the pages pyllm's weights get (csrc/memory.c), so the ceiling is the machine's best
    plain read, not one slowed by 4 KB pages' TLB misses."""
    import mmap

    # private: Python's anonymous mmap is shared memory by default, which Linux gives 4 KB pages
    # whatever the advice (shmem_enabled), and the read then ran at ~2/3 of the machine's speed
    flags = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
    area = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=flags) if flags else mmap.mmap(-1, nbytes + HUGE_PAGE)
    whole = np.frombuffer(area, dtype=np.uint8)
    start = -whole.ctypes.data % HUGE_PAGE
    if hasattr(mmap, "MADV_HUGEPAGE"):
        area.madvise(mmap.MADV_HUGEPAGE, start, nbytes // HUGE_PAGE * HUGE_PAGE)
    buf = whole[start:start + nbytes // 8 * 8].view(np.uint64)
    buf.fill(1)
    return buf


def read_bandwidth(buf: np.ndarray, threads: int, repeats: int) -> float:
    """Best GB/s of reading buf once, split over threads."""
    parts = np.array_split(buf, threads)
    best = 0.0
    for _ in range(repeats):
        workers = [threading.Thread(target=np.maximum.reduce, args=(p,)) for p in parts]
        start = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        best = max(best, buf.nbytes / (time.perf_counter() - start) / 1e9)
    return best


def decode_bytes(path: str) -> int:
    """Bytes of the matrices one decode step reads: every layer matrix and the output head (the
    tied embeddings when there is no head), not the norms, not the embedding rows."""
    import pyllm

    llm = pyllm.load(path, threads=1)
    total, head = 0, None
    for name, w in llm.weights.items():
        if len(w.shape) != 2:
            continue
        if name.startswith(("token_embd", "model.embed_tokens")):
            head = head if head is not None else w.nbytes
            continue
        if name.startswith(("output.", "lm_head")):
            head = w.nbytes
            continue
        total += w.nbytes
    return total + (head or 0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gib", type=float, default=1.0, help="buffer size (keep it far above the LLC)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--model", help="a model file or folder: its decode bytes per token")
    ap.add_argument("--decode", type=float, help="its measured decode tok/s, to put against the ceiling")
    args = ap.parse_args()
    buf = read_buffer(int(args.gib * (1 << 30)))
    print(f"buffer {buf.nbytes / 2**30:.2f} GiB, best of {args.repeats}, load average {os.getloadavg()[0]:.2f}")
    for n in sorted({1, args.threads}):
        print(f"read, {n} thread{'s' if n > 1 else ''}: {read_bandwidth(buf, n, args.repeats):.1f} GB/s")
    if args.model:
        ceiling_bw = read_bandwidth(buf, args.threads, args.repeats)
        per_token = decode_bytes(args.model)
        ceiling = ceiling_bw * 1e9 / per_token
        print(f"{os.path.basename(args.model.rstrip('/'))}: {per_token / 1e6:.1f} MB read per decoded token, "
              f"ceiling {ceiling:.1f} tok/s at {ceiling_bw:.1f} GB/s ({args.threads} threads)")
        if args.decode:
            print(f"decode {args.decode:.1f} tok/s = {args.decode / ceiling:.0%} of the ceiling")


if __name__ == "__main__":
    main()
