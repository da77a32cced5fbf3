"""Times greedy generation with each speculative proposer against plain decoding on three tasks.

    python benchmarks/bench_speculative.py [--threads 2] [--max-tokens 160] [--rounds 2]

Tasks: editing (a ~400-token function with one change asked for, the whole function back), a summary
of a given text, free chat, and extraction (an order's details from an email, as JSON under a schema:
the constraint judges every token, plain and speculative alike). Targets: SmolLM2-135M-Instruct Q4_1
(proposers lookup and self:N), and the same model as a bf16 folder (f32 compute; proposers lookup,
self:N and a draft: the Q4_1 file, same tokenizer, a third of the bytes). Every speculative output
is checked to be the plain output token for token. Decode tok/s = (tokens - 1) / (generation time -
the time to the first token, measured alone), each from a fresh cache; best of --rounds, the settings
taking turns; the last column has each round's decode against plain's in the same round, and their
median (on a shared machine the per-round ratios say more than the best of each). Forward calls:
the model's calls after the prompt (plain: one per token, but the tokens a constraint forces run in
the call before them), which no load on the machine changes.
--tasks and --targets take subsets (--targets gemma3: Gemma 3 270M Q4_K_M, lookup and self:14).
--control adds plain decoding a second time to each round's turns ("plain again"): its ratio to plain
is what a ratio spreads by on this machine with nothing changed.
--together runs the tasks at once instead (but extraction: a list shares one constraint), one
request each, as a list (Model.generate's engine: one call a step for all of them, each job's
proposals in it); decode tok/s is then every job's tokens after its first over the time past the
list's prefill.
Prints a Markdown table and the machine.
"""
from __future__ import annotations

import argparse
import inspect
import os
import platform
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's pyllm

import pyllm  # noqa: E402
from pyllm import hub, sampling  # noqa: E402

CACHE = os.path.expanduser(os.environ.get("PYLLM_CACHE") or "~/.cache/pyllm")
BF16_FOLDER = os.path.join(CACHE, "smollm2-135m-instruct-bf16")  # tests/conftest.py's smollm2_folder
GEMMA3_FILE = os.path.join(CACHE, "gemma-3-270m-q4_k_m.gguf")  # tests/conftest.py's gemma3_gguf

SUMMARY_TEXT = """The Industrial Revolution began in Great Britain in the second half of the eighteenth century
and spread to continental Europe and North America during the nineteenth. It replaced hand production with
machines, new chemical manufacturing and iron production processes, and the growing use of steam power and
water power. Textiles were the first industry to use modern production methods: the spinning jenny, the
water frame and the power loom multiplied what a single worker could make, and cotton cloth became cheap
enough for most people to buy. Coal mining grew to feed the steam engines, and canals and later railways
carried coal, iron and goods across the country. Cities such as Manchester and Birmingham grew quickly as
people moved from farms to factories, where they often worked long hours in dangerous conditions for low
wages. Children worked in mills and mines until laws in the 1830s and 1840s began to limit their hours.
Over time, the revolution raised average incomes and living standards, but its benefits were unevenly
shared, and it brought pollution, crowded housing and new social conflicts that shaped the politics of the
following century."""


EXTRACTION_TEXT = """From: Priya Raman <priya.raman@harbourlogistics.co.uk>
To: accounts@northwindtraders.com
Subject: Order 58213, delivery and invoice

Hello, this confirms order 58213 placed on 14 October 2026 by Harbour Logistics Ltd, 7 Quay Street,
Bristol BS1 4DJ. The order is for 40 boxes of A4 printer paper at 4.50 pounds a box, 3 black toner
cartridges at 61.00 pounds each and 12 packs of blue ballpoint pens at 2.25 pounds a pack. Please
deliver to our warehouse at Unit 12, Avonmouth Trading Estate, Bristol BS11 9FG, between 8 am and
4 pm on a weekday, and ask for Tom Becker at the loading bay. Send the invoice to Priya Raman at the
address above; payment is due within 30 days of the invoice date by bank transfer. Thank you."""

# The extraction task's output: a JSON object under this schema (the constraint judges every token)
EXTRACTION_SCHEMA = {
    "type": "object", "additionalProperties": False,
    "required": ["order_number", "order_date", "customer", "delivery_address", "contact", "items", "payment_terms"],
    "properties": {
        "order_number": {"type": "string", "maxLength": 12},
        "order_date": {"type": "string", "maxLength": 24},
        "customer": {"type": "object", "additionalProperties": False, "required": ["name", "address"],
                     "properties": {"name": {"type": "string", "maxLength": 40},
                                    "address": {"type": "string", "maxLength": 60}}},
        "delivery_address": {"type": "string", "maxLength": 80},
        "contact": {"type": "string", "maxLength": 40},
        "items": {"type": "array", "maxItems": 5, "items": {
            "type": "object", "additionalProperties": False, "required": ["description", "quantity", "unit_price"],
            "properties": {"description": {"type": "string", "maxLength": 40},
                           "quantity": {"type": "integer"}, "unit_price": {"type": "number"}}}},
        "payment_terms": {"type": "string", "maxLength": 60}}}
CONSTRAINED = {"extraction": {"json_schema": EXTRACTION_SCHEMA}}  # tasks whose output a constraint shapes


# Gemma 3's turns, for its GGUF files that carry no chat template
# (jinja drops a template's last newline: the one after "model" is written as a string)
GEMMA_TURNS = ("{{ bos_token }}{% for m in messages %}"
               "<start_of_turn>{{ 'model' if m['role'] == 'assistant' else 'user' }}\n"
               "{{ m['content'] }}<end_of_turn>\n{% endfor %}<start_of_turn>model{{ '\\n' }}")


def tasks() -> dict[str, list[dict]]:
    function = inspect.getsource(sampling.Sampler._survivors)
    return {
        "editing": [{"role": "user", "content": "Rename the variable `ids` to `kept_ids` in this Python method. "
                     "Reply with the whole method and nothing else.\n\n```python\n" + function + "```"}],
        "summary": [{"role": "user", "content": "Summarize this text in a few sentences, using its own words "
                     "where you can.\n\n" + SUMMARY_TEXT}],
        "free chat": [{"role": "user", "content": "Write a short story about a lighthouse keeper who finds a "
                       "message in a bottle."}],
        "extraction": [{"role": "user", "content": "Extract the order's details from this email as JSON.\n\n"
                        + EXTRACTION_TEXT}],
    }


def timed(llm, ids, max_tokens, settings, rounds, constraint=None):
    """[(completion, best decode tok/s, best end-to-end tok/s, decode tok/s of each round)] for each
    speculative setting, the settings taking turns in each round (in reverse order every other round)
    so that a change in the machine's load hits them alike. ids: one prompt, or a list of them run at
    once (completion is then their list, and decode counts every one's tokens after its first).
    constraint: generate's keywords that constrain the output (json_schema=...), or None."""
    constraint = constraint or {}
    if constraint:  # the parser's tables for this vocabulary are built once a model, before any timing
        llm.generate(ids, max_tokens=1, speculative="off", **constraint)
    best = [[None, 0.0, 0.0, []] for _ in settings]
    for r in range(rounds):
        for result, speculative in (zip(best, settings) if r % 2 == 0 else reversed(list(zip(best, settings)))):
            llm.reset()
            start = time.perf_counter()
            llm.generate(ids, max_tokens=1, speculative="off", **constraint)
            first = time.perf_counter() - start
            llm.reset()
            start = time.perf_counter()
            out = llm.generate(ids, max_tokens=max_tokens, speculative=speculative, **constraint)
            total = time.perf_counter() - start
            outs = out if isinstance(out, list) else [out]
            n = sum(len(o.token_ids) for o in outs)
            decode = (n - len(outs)) / max(total - first, 1e-9)
            result[:3] = [out, max(result[1], decode), max(result[2], n / total)]
            result[3].append(decode)
    return best


def plain_calls(llm, ids, max_tokens, constraint=None) -> int:
    """The forward calls of one plain generation after its prompt: one a token, but where a
    constraint forces tokens, which run in the call of the token before them."""
    calls, step = [0], llm.pool.step

    def counted(*args, **kwargs):
        calls[0] += 1
        return step(*args, **kwargs)

    llm.pool.step = counted
    try:
        llm.generate(ids, max_tokens=max_tokens, speculative="off", **(constraint or {}))
    finally:
        del llm.pool.step
    return calls[0]


def call_times(llm, sizes, repeats: int = 25) -> dict[int, float]:
    """rows -> the median seconds of a forward call of that many rows (all their logits, as a
    verifying call returns them) after a 200-token prompt; the weights' values do not change it."""
    from pyllm import _core

    seq = _core.CoreSequence(llm.core, 512)
    seq.forward(list(range(100, 300)))
    while llm.core.decode_threads.chosen is None:  # while measured, calls take other thread counts
        seq.forward([400])
        seq.truncate(200)
    times = {}
    for n in sizes:
        runs = []
        for _ in range(repeats):
            start = time.perf_counter()
            seq.forward(list(range(400, 400 + n)), all_logits=True)
            runs.append(time.perf_counter() - start)
            seq.truncate(200)
        times[n] = sorted(runs)[len(runs) // 2]
    return times


def verify_costs(llm) -> str:
    """A forward call of n rows against a one-token step: what a verified row costs."""
    times = call_times(llm, (1, 2, 5, 9, 13))
    return ", ".join(f"{n} rows {times[n] / times[1]:.2f}x" for n in times if n > 1)


CONTROL = "plain again"  # --control's row: plain against itself, the spread a ratio has with nothing changed


def per_round(each: list[float], plain_rounds: list[float]) -> str:
    """Each round's decode against plain's in the same round, and their median."""
    ratios = [a / b for a, b in zip(each, plain_rounds)]
    return f"{statistics.median(ratios):.3f}x ({' '.join(f'{x:.2f}' for x in ratios)})"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tasks", default="editing,summary,free chat,extraction", help="a comma-separated subset")
    parser.add_argument("--targets", default="q4_1,bf16", help="a comma-separated subset of q4_1,bf16,gemma3")
    parser.add_argument("--together", action="store_true", help="the tasks at once, as one list")
    parser.add_argument("--control", action="store_true",
                        help="plain decoding a second time in each round's turns, its ratio to plain the run's noise")
    args = parser.parse_args()
    q4 = hub.fetch_alias("smollm2", quiet=True)
    setups = [(q4, None, ["lookup", "self:24"])] if "q4_1" in args.targets else []
    if "bf16" in args.targets and os.path.exists(os.path.join(BF16_FOLDER, "model.safetensors")):
        setups.append((BF16_FOLDER, q4, ["lookup", "self:24", "draft"]))
    if "gemma3" in args.targets and os.path.exists(GEMMA3_FILE):
        setups.append((GEMMA3_FILE, None, ["lookup", "self:14"]))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    print(f"- machine: {platform.processor() or platform.machine()}, {os.cpu_count()} logical cores, "
          f"{args.threads} threads; load average at start {os.getloadavg()}; pyllm commit {commit}", flush=True)
    print(f"- greedy, {args.max_tokens} tokens at most, best of {args.rounds} rounds, a fresh cache each")
    print("| target | task | prompt tokens | proposer | tokens | forward calls | accepted/proposed | decode tok/s "
          "| end-to-end tok/s | decode vs plain | per round: median (each) |")
    print("|---|---|--:|---|--:|--:|--:|--:|--:|--:|--:|", flush=True)

    def row(target, task, n_prompt, proposer, n, calls, counts, decode, total, ratio, rounds=""):
        print(f"| {target} | {task} | {n_prompt} | {proposer} | {n} | {calls} | {counts} | {decode:.1f} | {total:.1f} "
              f"| {ratio:.2f}x | {rounds} |", flush=True)

    for source, draft, proposers in setups:
        llm = pyllm.load(source, threads=args.threads,
                         speculative=f"draft:{draft}" if draft else None)
        drafted = llm.speculative
        print(f"- {os.path.basename(source)}: a verifying call of n rows against a step: {verify_costs(llm)}",
              flush=True)
        template = None if llm.tokenizer.chat_template else GEMMA_TURNS
        chosen = {task: llm.tokenizer.encode(llm.render_chat(messages, chat_template=template), add_special=False)
                  for task, messages in tasks().items() if task in args.tasks.split(",")}
        if args.control:
            proposers = proposers + [CONTROL]
        settings = ["off"] + ["off" if proposer == CONTROL else drafted if proposer == "draft" else proposer
                              for proposer in proposers]
        if args.together:
            together = {task: ids for task, ids in chosen.items() if task not in CONSTRAINED}  # a list shares one
            id_lists = list(together.values())
            name, n_prompt = " + ".join(together) + " at once", "+".join(str(len(ids)) for ids in id_lists)
            (plain, decode0, total0, plain_rounds), *runs = timed(llm, id_lists, args.max_tokens, settings, args.rounds)
            n = sum(len(out.token_ids) for out in plain)
            row(os.path.basename(source), name, n_prompt, "plain", n, n - len(plain), "", decode0, total0, 1.0)
            for proposer, (outs, decode, total, each) in zip(proposers, runs):
                assert [o.token_ids for o in outs] == [o.token_ids for o in plain], f"{proposer}: not the plain tokens"
                rounds = per_round(each, plain_rounds)
                if proposer == CONTROL:
                    row(os.path.basename(source), name, n_prompt, CONTROL, n, n - len(plain), "", decode, total,
                        decode / decode0, rounds)
                    continue
                counts = [out.usage["speculative"] for out in outs]
                row(os.path.basename(source), name, n_prompt, counts[0]["proposer"], n,
                    "+".join(str(c["steps"]) for c in counts),
                    f"{sum(c['accepted'] for c in counts)}/{sum(c['proposed'] for c in counts)}", decode, total,
                    decode / decode0, rounds)
            continue
        for task, ids in chosen.items():
            constraint = CONSTRAINED.get(task)
            (plain, decode0, total0, plain_rounds), *runs = timed(llm, ids, args.max_tokens, settings, args.rounds,
                                                                  constraint)
            calls0 = plain_calls(llm, ids, args.max_tokens, constraint)
            name = os.path.basename(source)
            row(name, task, len(ids), "plain", len(plain.token_ids), calls0, "", decode0, total0, 1.0)
            for proposer, (out, decode, total, each) in zip(proposers, runs):
                assert out.token_ids == plain.token_ids, f"{proposer} on {task}: not the plain tokens"
                rounds = per_round(each, plain_rounds)
                if proposer == CONTROL:
                    row(name, task, len(ids), CONTROL, len(out.token_ids), calls0, "", decode, total, decode / decode0,
                        rounds)
                    continue
                counts = out.usage["speculative"]
                row(name, task, len(ids), counts["proposer"], len(out.token_ids), counts["steps"],
                    f"{counts['accepted']}/{counts['proposed']}", decode, total, decode / decode0, rounds)

if __name__ == "__main__":
    main()
