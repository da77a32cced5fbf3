"""What constrained decoding costs a decode step: llguidance's mask (computed, then applied to the
logits) and its parser taking the token, per token, beside the step itself, on real vocabularies
(SmolLM2 49k, Gemma 3 262k).

    python benchmarks/bench_constraints.py [MODEL ...] [--tokens 64] [--threads 2]

For each model it runs the same prompt twice: under a JSON schema, timing every Constraint.mask,
.consume and .forced call (pyllm.constraints; the last two compute the next mask), then without a
constraint, timing whole steps. The constraint's share is its median time over the median
unconstrained step (a forward pass plus sampling).
"""
from __future__ import annotations

import argparse
import statistics
import time
from importlib.metadata import version

import pyllm
from pyllm import constraints, generation

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 40},
    "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "city": {"type": "string", "maxLength": 40},
    "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 30}, "maxItems": 6},
    "employed": {"type": "boolean"}},
    "required": ["name", "age", "city", "hobbies", "employed"], "additionalProperties": False}
PROMPT = "A person described as JSON (name, age, city, hobbies, employed):\n"


def step_times(llm, tokens: int) -> list[float]:
    """Seconds between consecutive decode steps (Generation.step calls: a forward pass and the
    sampling) of one unconstrained generation."""
    calls = []
    step = generation.Generation.step

    def timed(self, logits):
        calls.append(time.perf_counter())
        return step(self, logits)

    generation.Generation.step = timed
    try:
        llm.generate(PROMPT, max_tokens=tokens, temperature=0.7, seed=0)
    finally:
        generation.Generation.step = step
    return [b - a for a, b in zip(calls, calls[1:])]


def constraint_times(llm, tokens: int) -> tuple[list[float], str]:
    """Seconds each token spent in the constraint (Constraint.mask, then Constraint.consume and
    Constraint.forced, which compute the next mask) in a constrained generation, and the text it made."""
    spent = []
    mask, consume, forced = constraints.Constraint.mask, constraints.Constraint.consume, constraints.Constraint.forced

    def timed_mask(self, logits):
        t = time.perf_counter()
        out = mask(self, logits)
        spent.append(time.perf_counter() - t)
        return out

    def timed_consume(self, token):
        t = time.perf_counter()
        consume(self, token)
        spent[-1] += time.perf_counter() - t

    def timed_forced(self, limit):
        t = time.perf_counter()
        out = forced(self, limit)
        spent[-1] += time.perf_counter() - t
        return out

    constraints.Constraint.mask, constraints.Constraint.consume = timed_mask, timed_consume
    constraints.Constraint.forced = timed_forced
    try:
        text = llm.generate(PROMPT, max_tokens=tokens, temperature=0.7, seed=0, json_schema=SCHEMA).text
    finally:
        constraints.Constraint.mask, constraints.Constraint.consume = mask, consume
        constraints.Constraint.forced = forced
    return spent, text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", default=["smollm2", "gemma3"])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    print("| library | model | vocabulary | constraint ms/token (median) | mean | p90 | step ms (median) | % of step |")
    print("|---|---|--:|--:|--:|--:|--:|--:|")
    for name in args.models:
        llm = pyllm.load(name, threads=args.threads)
        llm.generate(PROMPT, max_tokens=4, json_schema=SCHEMA)  # builds llguidance's tokenizer once
        masks, _ = constraint_times(llm, args.tokens)
        steps = step_times(llm, args.tokens)
        mask_ms = statistics.median(masks) * 1e3
        p90 = sorted(masks)[int(0.9 * (len(masks) - 1))] * 1e3
        step_ms = statistics.median(steps) * 1e3
        print(f"| llguidance {version('llguidance')} | {name} | {llm.vocab_size:,} | "
              f"{mask_ms:.3f} | {1e3 * statistics.mean(masks):.3f} | {p90:.3f} | {step_ms:.1f} | "
              f"{100 * mask_ms / step_ms:.1f}% |", flush=True)


if __name__ == "__main__":
    main()
