"""Decode (and optionally prefill) by thread count, pyllm beside llama.cpp's own llama-bench, on one GGUF.

    python benchmarks/threads_table.py --model FILE.gguf --threads 1,2,4,8,16 \\
        [--llama-bench PATH] [--prefill 512] [--repeats 2] [--out benchmarks/RESULTS.md]

Issue 33 item 3 asks that decode never get slower as threads are added, up to the machine's cores,
and that pyllm pick the fastest count for decode by itself. For every count N each repeat runs, in
a fresh process: pyllm loaded with threads=N, a 128-token prompt prefilled, then its first decode
steps untimed until it has measured and chosen its decode count (README: `decode_threads`), then
--decode-tokens steps timed with that choice ("measured"), then as many with every one of the N
threads ("all N"). llama-bench (built by `benchmarks/laptop_shapes.py --tools`; its Python binding
is not needed) runs `-t N -p 0 -n TOKENS -d 128` (decode after 128 tokens, as pyllm's; and
`-p PREFILL -n 0`) in its own process, alternating with pyllm's. Rows: the best repeat of each.
The last columns say whether each count was at least as fast as the one below it.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's pyllm
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench import PyllmEngine, git_commit, machine, prompt_ids, time_decode, time_prefill  # noqa: E402

RESULT_MARK = "THREADS_RESULT "
PROMPT = 128  # decode starts after this many tokens, as bench.py's


def child(model: str, threads: int, tokens: int, prefill: int, ids_path: str) -> dict:
    """One pyllm process (bench.py's engine and timings): prefill tok/s, decode tok/s on the count it
    measured and chose (its measuring steps run first, untimed), then on all its threads."""
    with open(ids_path) as f:
        ids = json.load(f)
    engine = PyllmEngine(model, threads, None, max(PROMPT, prefill) + 2 * tokens + 64, None)
    out = {"threads": threads}
    if prefill:
        time_prefill(engine, ids[:prefill])  # untimed: first use of the prefill tiles and buffers
        out["prefill"] = time_prefill(engine, ids[:prefill])
    engine.settle(ids[:PROMPT])
    tuner = engine.llm.core.decode_threads
    out["chosen"] = tuner.chosen
    out["measured"] = time_decode(engine, ids[:PROMPT], tokens)[0]
    tuner.fix(engine.llm.core.n_threads)
    out["all"] = time_decode(engine, ids[:PROMPT], tokens)[0]
    return out


def spawn_pyllm(args, threads: int, ids_path: str) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--model", args.model, "--threads", str(threads),
           "--decode-tokens", str(args.decode_tokens), "--prefill", str(args.prefill), "--ids", ids_path]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_MARK):
            return json.loads(line[len(RESULT_MARK):])
    raise RuntimeError(f"pyllm at {threads} threads failed:\n{proc.stderr[-2000:]}")


def llama_bench(path: str, model: str, threads: int, prompt: int, tokens: int, depth: int) -> float:
    """llama-bench's mean tok/s for one test (-p prompt -n tokens over a cache already holding depth
    tokens), in its own process."""
    cmd = [path, "-m", model, "-t", str(threads), "-p", str(prompt), "-n", str(tokens), "-d", str(depth),
           "-r", "1", "-o", "json"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"llama-bench at {threads} threads failed:\n{proc.stderr[-2000:]}")
    return float(json.loads(proc.stdout)[0]["avg_ts"])


def monotone(values: list[float | None]) -> list[str]:
    """For each count, whether it is at least as fast as the count below it ('-' for the first)."""
    marks, last = [], None
    for v in values:
        marks.append("-" if last is None or v is None else ("yes" if v >= last else f"no ({v / last:.2f}x)"))
        last = v if v is not None else last
    return marks


def render(args, rows: list[dict]) -> str:
    m = machine()
    head = (f"\n### {os.path.basename(args.model)}, decode by threads — "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n\n"
            f"- CPU: {m['cpu']} ({m['flags']}); cores: {m['cores']}; load average at start: {m['load']}\n"
            f"- pyllm commit {git_commit()}; decode: {args.decode_tokens} greedy tokens after a "
            f"{PROMPT}-token prompt, best of {args.repeats} fresh processes a count"
            + (f"; prefill: {args.prefill} tokens" if args.prefill else "") + "\n"
            "- measured: pyllm's own choice of decode threads (the count it chose in parentheses); all N: "
            "every thread of the pool\n\n")
    cols = ["threads", "pyllm measured tok/s", "pyllm all N tok/s"]
    if args.llama_bench:
        cols.append("llama.cpp tok/s")
    if args.prefill:
        cols += [f"pyllm prefill {args.prefill}"] + ([f"llama.cpp prefill {args.prefill}"] if args.llama_bench else [])
    cols += ["measured >= the count below", "all N >= the count below"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("--:" for _ in cols) + "|"]
    meas = monotone([r["measured"] for r in rows])
    alln = monotone([r["all"] for r in rows])
    for r, a, b in zip(rows, meas, alln):
        cells = [str(r["threads"]), f"{r['measured']:.1f} ({r['chosen']})", f"{r['all']:.1f}"]
        if args.llama_bench:
            cells.append(f"{r['llama']:.1f}")
        if args.prefill:
            cells.append(f"{r['prefill']:.1f}")
            if args.llama_bench:
                cells.append(f"{r['llama_prefill']:.1f}")
        cells += [a, b]
        lines.append("| " + " | ".join(cells) + " |")
    return head + "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a GGUF file")
    p.add_argument("--threads", default="1,2", help="comma list of thread counts")
    p.add_argument("--decode-tokens", type=int, default=64)
    p.add_argument("--prefill", type=int, default=0, help="also time a prefill of this many tokens (0: no)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--llama-bench", default=None, help="path of llama-bench (laptop_shapes.py --tools)")
    p.add_argument("--out", default=None, help="append the table to this markdown file")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--ids", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    counts = [int(t) for t in args.threads.split(",")]
    if args.child:
        print(RESULT_MARK + json.dumps(child(args.model, counts[0], args.decode_tokens, args.prefill, args.ids)))
        return 0
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(prompt_ids(args.model, max(PROMPT, args.prefill)), f)
        ids_path = f.name
    try:
        best: dict[int, dict] = {}
        for rep in range(args.repeats):
            for n in counts:
                r = spawn_pyllm(args, n, ids_path)
                if args.llama_bench:
                    r["llama"] = llama_bench(args.llama_bench, args.model, n, 0, args.decode_tokens, PROMPT)
                    if args.prefill:
                        r["llama_prefill"] = llama_bench(args.llama_bench, args.model, n, args.prefill, 0, 0)
                print(f"[{rep + 1}/{args.repeats}] {n} threads: " + json.dumps(r), flush=True)
                b = best.setdefault(n, dict(r))
                for key in ("measured", "all", "prefill", "llama", "llama_prefill"):
                    if key in r and r[key] > b.get(key, 0):
                        b[key] = r[key]
                        if key == "measured":
                            b["chosen"] = r["chosen"]
    finally:
        os.unlink(ids_path)
    table = render(args, [best[n] for n in counts])
    print(table)
    if args.out:
        with open(args.out, "a") as f:
            f.write(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
