"""Projects lookup speculation's decode speed-up on one model from the acceptance of another: the
forward calls' times by row count, measured on COST_FILE (random weights do not change them), and the
calls lookup makes on bench_speculative's tasks with a real TARGET (its greedy output, replayed).

    python benchmarks/project_speculative.py COST_FILE [--target SOURCE] [--max-tokens 400] [--threads 2]
                                             [--measure ROUNDS]

The replay is exact: greedy speculation makes the plain output whatever it proposes, so feeding the
plain output to pyllm.speculative's own lookup and round planner (speculative.lookup_rounds) (with COST_FILE's measured costs by
row count in place of its timings) gives the calls a speculative run would make, each with its rows.
Projected speed-up = (tokens - 1) x the time of a one-row call / the sum of the calls' measured times.
A projection, not a measurement: it leaves out the Python work of a round.

--measure N then runs those very calls on COST_FILE, N times, alternating with plain decoding of the
same tokens: the prompt's length prefilled, then plain one-token steps, or each round's call of its
rows and the truncation to the tokens it took (the target's token ids, folded into COST_FILE's
vocabulary: the values do not change the time). Measured speed-up = plain time / speculative time,
each the median of N; it leaves out the proposer's and the sampler's Python (microseconds a token).
"""
from __future__ import annotations

import argparse
import os
import platform
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's pyllm
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import pyllm  # noqa: E402
from pyllm import hub, speculative  # noqa: E402
from bench_speculative import GEMMA_TURNS, call_times, tasks  # noqa: E402
from pyllm import _core  # noqa: E402


def replay_times(llm, n_prompt: int, output: list[int], calls: list[tuple[int, int]], rounds: int):
    """(plain seconds, speculative seconds), medians of rounds alternating runs: output's tokens
    after a prompt of n_prompt tokens, one a step, or as calls of (proposed, taken) rounds."""
    import statistics
    import time

    vocab = llm.vocab_size
    tokens = [t % vocab for t in output]
    seq = _core.CoreSequence(llm.core, n_prompt + len(tokens) + speculative.MAX_DRAFT + 2)
    prompt = [(7 * i) % vocab for i in range(n_prompt)]

    def plain() -> float:
        seq.truncate(0)
        seq.forward(prompt)
        start = time.perf_counter()
        for t in tokens[:-1]:
            seq.forward([t])
        return time.perf_counter() - start

    def speculating() -> float:
        seq.truncate(0)
        seq.forward(prompt)
        start, made = time.perf_counter(), 0
        for proposed, taken in calls:
            run = tokens[made:made + 1 + proposed]
            run += [run[-1]] * (1 + proposed - len(run))  # drafts past the end of the output
            seq.forward(run, all_logits=True)
            made += taken + 1
            seq.truncate(n_prompt + made)
        return time.perf_counter() - start

    times = ([], [])
    for r in range(rounds):
        for which in ((0, 1) if r % 2 == 0 else (1, 0)):
            times[which].append(plain() if which == 0 else speculating())
    return statistics.median(times[0]), statistics.median(times[1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("cost_file")
    parser.add_argument("--target", default=None, help="default: SmolLM2-135M-Instruct Q4_1")
    parser.add_argument("--max-tokens", type=int, default=400)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--measure", type=int, default=0, help="rounds of running the calls on COST_FILE")
    args = parser.parse_args()
    timing = pyllm.load(args.cost_file, threads=args.threads)
    times = call_times(timing, range(1, speculative.MAX_DRAFT + 2), repeats=args.repeats)
    rows = np.array(sorted(times))
    ratios = np.array([times[n] / times[1] for n in rows])
    costs = speculative.Costs()
    costs.step = times[1]
    costs.row = float(np.dot(rows - 1, ratios - 1) / np.dot(rows - 1, rows - 1))
    costs.by_rows = {int(n): float(r) for n, r in zip(rows, ratios) if n > 1}
    print(f"- machine: {platform.processor() or platform.machine()}, {os.cpu_count()} logical cores, "
          f"{args.threads} threads; load average {os.getloadavg()}")
    print(f"- {os.path.basename(args.cost_file)}: one-row call {times[1] * 1e3:.1f} ms; n rows against one: "
          + " ".join(f"{n}:{r:.2f}" for n, r in zip(rows, ratios)) + f"; fitted share per further row {costs.row:.3f}")
    target = pyllm.load(args.target or hub.fetch_alias("smollm2", quiet=True), threads=args.threads)
    print(f"- acceptance from {os.path.basename(target.source.rstrip('/'))}, greedy, {args.max_tokens} tokens at most")
    measured = " measured: plain s / speculative s | measured decode vs plain |" if args.measure else ""
    print("| task | tokens | calls | rows in all | projected decode vs plain |" + measured)
    print("|---|--:|--:|--:|--:|" + ("--:|--:|" if args.measure else ""))
    for task, messages in tasks().items():
        template = None if target.tokenizer.chat_template else GEMMA_TURNS
        ids = target.tokenizer.encode(target.render_chat(messages, chat_template=template), add_special=False)
        output = target.generate(ids, max_tokens=args.max_tokens, speculative="lookup").token_ids
        rounds = speculative.lookup_rounds(ids, output, costs)
        calls = [1 + proposed for proposed, _ in rounds]
        spent = sum(times[n] for n in calls)
        line = f"| {task} | {len(output)} | {len(calls)} | {sum(calls)} | {(len(output) - 1) * times[1] / spent:.2f}x |"
        if args.measure:
            plain, fast = replay_times(timing, len(ids), output, rounds, args.measure)
            line += f" {plain:.2f} / {fast:.2f} | {plain / fast:.2f}x |"
        print(line, flush=True)


if __name__ == "__main__":
    main()
