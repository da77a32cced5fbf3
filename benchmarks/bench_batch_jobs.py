"""Times a file of OpenAI Batch requests through `pyllm batch` on this machine and on a local Ray cluster.

    python benchmarks/bench_batch_jobs.py [--model smollm2] [--requests 200] [--max-tokens 32] [--cpus 2]

The file: chat and completion requests (greedy, max_tokens each), embeddings, and 5 malformed lines,
as in tests/test_batch_jobs.py. Runs, each timed from the first request to the last result written
(batch_jobs.run_file), --rounds times in turn (the best kept, as other load only slows a run):
  local         one model, --cpus threads, --parallel slots, in this process
  ray 1x        Ray Data, one actor of --cpus CPUs (the local run's shape: Ray's own overhead)
  ray Nx1       Ray Data, --cpus actors of one CPU each
Ray's runs include Ray Data's start and the actors' model loads (ray.init is timed apart). Results are
checked equal to the local run's (texts, token counts and finish reasons; embeddings to 1e-5, as a
thread count changes their last bits). Prints requests/s, generated tok/s and the machine.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's pyllm

import numpy as np  # noqa: E402

import pyllm  # noqa: E402
from pyllm import batch_jobs  # noqa: E402

TOPICS = ["the capital of France", "why the sky is blue", "how bread rises", "the laws of motion",
          "photosynthesis", "the first moon landing", "a binary search", "the water cycle"]


def write_requests(path: str, n: int, max_tokens: int, model: str) -> None:
    lines = []
    for i in range(n - 5):
        topic = TOPICS[i % len(TOPICS)]
        kind = i % 5
        if kind in (0, 1):
            url, body = "/v1/chat/completions", {"model": model, "temperature": 0, "max_tokens": max_tokens,
                                                 "messages": [{"role": "user", "content": f"Explain {topic}."}]}
        elif kind in (2, 3):
            url, body = "/v1/completions", {"model": model, "temperature": 0, "max_tokens": max_tokens,
                                            "prompt": f"A short note on {topic}:"}
        else:
            url, body = "/v1/embeddings", {"model": model, "input": [f"A text about {topic}.", topic]}
        lines.append(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": url, "body": body}))
    lines += ['{"custom_id": "cut"', json.dumps({"method": "POST"}), json.dumps({"custom_id": "x", "method": "GET"}),
              json.dumps({"custom_id": "y", "method": "POST", "url": "/v1/files"}),
              json.dumps({"custom_id": "r0", "method": "POST", "url": "/v1/embeddings", "body": {}})]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def timed_run(in_path: str, results) -> tuple[float, list[dict]]:
    out = tempfile.mktemp(suffix=".jsonl")
    start = time.perf_counter()
    batch_jobs.run_file(in_path, out, results, progress=False)
    seconds = time.perf_counter() - start
    with open(out) as f:
        rows = [json.loads(line) for line in f]
    os.unlink(out)
    return seconds, rows


def generated(rows: list[dict]) -> int:
    return sum(((r["response"] or {}).get("body") or {}).get("usage", {}).get("completion_tokens", 0) for r in rows)


def same(a: list[dict], b: list[dict]) -> bool:
    """The same answers, by request: texts, usage, finish reasons; embeddings to 1e-5."""
    def key(rows):
        out = {}
        for r in rows:
            body = (r["response"] or {}).get("body") or {}
            vectors = [d["embedding"] for d in body.get("data", [])]
            rest = {k: v for k, v in body.items() if k not in ("id", "created", "data")}
            out[r["id"]] = (r["custom_id"], r["error"], rest, vectors)
        return out
    ka, kb = key(a), key(b)
    if ka.keys() != kb.keys():
        return False
    for k in ka:
        (ca, ea, ra, va), (cb, eb, rb, vb) = ka[k], kb[k]
        if (ca, ea, ra) != (cb, eb, rb) or len(va) != len(vb):
            return False
        if any(np.abs(np.array(x) - np.array(y)).max() > 1e-5 for x, y in zip(va, vb)):
            return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--parallel", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2, help="each run this many times, in turn; the best kept")
    args = parser.parse_args()

    import ray

    from pyllm.batch_ray import ray_results

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor())
    print(f"machine: {cpu}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start; "
          f"pyllm {commit}, ray {ray.__version__}, Python {platform.python_version()}")

    in_path = tempfile.mktemp(suffix=".jsonl")
    write_requests(in_path, args.requests, args.max_tokens, args.model)
    start = time.perf_counter()
    llm = pyllm.load(args.model, threads=args.cpus, parallel=args.parallel)
    load_s = time.perf_counter() - start
    print(f"model {llm.source}: loaded in {load_s:.2f} s; {args.requests} requests, max_tokens {args.max_tokens}, "
          f"{args.parallel} slots per model")

    runner = batch_jobs.Runner(llm, args.model)
    start = time.perf_counter()
    ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False)
    init_s = time.perf_counter() - start
    shapes = {"local": runner.run,
              f"ray 1x{args.cpus}": ray_results(args.model, actors=1, cpus_per_actor=args.cpus, parallel=args.parallel),
              f"ray {args.cpus}x1": ray_results(args.model, actors=args.cpus, cpus_per_actor=1, parallel=args.parallel)}
    times: dict[str, list[float]] = {name: [] for name in shapes}
    runs = {}
    for _ in range(args.rounds):
        for name, results in shapes.items():
            seconds, rows = timed_run(in_path, results)
            times[name].append(seconds)
            runs[name] = (min(times[name]), rows)
    runner.close()
    ray.shutdown()

    base_s, base = runs["local"]
    print(f"ray.init (a local cluster of {args.cpus} CPUs): {init_s:.1f} s\n")
    print("| run | best s | all rounds s | requests/s | generated tok/s | time vs local | results equal local |")
    print("|---|---|---|---|---|---|---|")
    for name, (seconds, rows) in runs.items():
        print(f"| {name} | {seconds:.1f} | {', '.join(f'{t:.1f}' for t in times[name])} | {len(rows) / seconds:.1f} | "
              f"{generated(rows) / seconds:.0f} | {seconds / base_s:.2f}x | {same(rows, base)} |")
    print(f"\nload average {os.getloadavg()[0]:.1f} at the end")
    os.unlink(in_path)


if __name__ == "__main__":
    main()
