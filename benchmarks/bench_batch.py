"""Times Model.generate over a list of prompts against the same prompts one call after another.

    python benchmarks/bench_batch.py [--model smollm2] [--prompts 8] [--max-tokens 64] [--threads 2]

Every generation runs its full max_tokens (end-of-sequence ids are ignored), so both sides make the
same number of tokens; the batched results are checked equal to the sequential ones. Prints the
generated tokens per second of each and their ratio.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's pyllm

import pyllm  # noqa: E402

PROMPTS = ["The capital of France is", "Water boils at", "Once upon a time, in a land far away,",
           "The three laws of motion are", "def fibonacci(n):", "In 1969, the first people to walk on",
           "The recipe for a good bread starts with", "Photosynthesis is the process by which plants"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    llm = pyllm.load(args.model, threads=args.threads, parallel=args.prompts)  # every prompt a cache at once
    llm.eos_ids = set()  # every generation runs its max_tokens
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(args.prompts)]
    llm.generate(prompts[0], max_tokens=4)  # warm-up

    start = time.perf_counter()
    alone = []
    for p in prompts:
        llm.reset()
        alone.append(llm.generate(p, max_tokens=args.max_tokens))
    sequential = time.perf_counter() - start

    start = time.perf_counter()
    together = llm.generate(prompts, max_tokens=args.max_tokens)
    batched = time.perf_counter() - start

    assert [c.token_ids for c in alone] == [c.token_ids for c in together], "batched results differ"
    tokens = sum(len(c.token_ids) for c in together)
    print(f"{os.path.basename(llm.source)}, {args.prompts} prompts x {args.max_tokens} tokens, "
          f"{args.threads} threads")
    print(f"sequential: {tokens / sequential:7.1f} tok/s ({sequential:.2f} s)")
    print(f"batched:    {tokens / batched:7.1f} tok/s ({batched:.2f} s)")
    print(f"ratio:      {sequential / batched:.2f}x")


if __name__ == "__main__":
    main()
