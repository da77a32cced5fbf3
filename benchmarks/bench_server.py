"""Times OpenAI-compatible servers under concurrent streaming load: pyllm's own server beside
llama-cpp-python's, on the same GGUF file, the same thread count, in one run.

    python benchmarks/bench_server.py                              # both servers, SmolLM2 Q4_1, 2 threads
    python benchmarks/bench_server.py --servers llama.cpp --concurrency 1,4 --requests-per-worker 2
    python benchmarks/bench_server.py --repeats 3                  # best of 3 rounds per level, on a busy machine

Every server starts as a subprocess on a free port; once it answers, a check pass sends each prompt
once, not streamed, to read the server's own completion_tokens. Then, for every concurrency level C
and every server in turn (levels outer, so background load drifts over all servers alike): an
untimed warm-up round (C short requests at once), then the timed round: C client workers, each
sending --requests-per-worker streaming /v1/completions requests back to back. The servers are
stopped (each its whole process group) at the end, on Ctrl-C, SIGTERM and on errors.

Every request: greedy (temperature 0), max_tokens fixed, logit_bias -100 on the end-of-text ids so
that every request generates exactly max_tokens tokens on every server; a request that stops early
is counted as "short" and reported. See benchmarks/README.md for what each figure means.

Environment. The client is the official `openai` package (AsyncOpenAI). pyllm's server needs
fastapi, uvicorn and sse-starlette. llama-cpp-python's server (`python -m llama_cpp.server`) needs its
"server" extras: fastapi, uvicorn, sse-starlette, starlette-context (<0.4), pydantic-settings (which
imports python-dotenv) and PyYAML. Where llama-cpp-python was built from source, install those
alone so pip does not rebuild it:

    pip install openai fastapi uvicorn sse-starlette psutil
    pip install --no-deps "starlette-context>=0.3.6,<0.4" pydantic-settings python-dotenv PyYAML

pyllm's server: `python -m pyllm serve FILE --parallel <highest concurrency> --threads T --n-ctx 2048`
(the context llama-cpp-python's server gets; its own default would be the model's, at most 4096).

llama-cpp-python's server settings used here (and why):
  --n_threads T --n_threads_batch T   the same thread count as pyllm for decode and for prompts
  --n_ctx 2048 --n_batch 512          its defaults, and bench.py's; prompts here are < 100 tokens
  --logits_all False                  the server defaults to True, which computes logits for every
                                      prompt position; pyllm (and llama.cpp's own CLI) do not
  --interrupt_requests False          the default (True) ends a streaming response as soon as another
                                      request waits, which would cut every request short under load
  --use_mlock False                   pyllm does not lock pages either; no effect once warm
  --verbose False                     no per-request timing prints on its stderr
  repeat_penalty 1.0 (request body)   its default is 1.1; pyllm's greedy applies no penalty
This server has no setting for parallel slots: it keeps one llama_context (one sequence) per model
and a lock lets one request generate at a time, so concurrent requests queue. It is measured as it is.
"""
from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from bench import git_commit, machine, version  # noqa: E402  (same header fields as bench.py)

DEFAULT_GGUF = os.path.expanduser("~/.cache/pyllm/SmolLM2-135M-Instruct.Q4_1.gguf")
SERVERS = ("pyllm", "llama.cpp")
READY_PATH = {"pyllm": "/health", "llama.cpp": "/v1/models"}
# SmolLM2's end-of-text ids: 2 <|im_end|> (its eos) and 0 <|endoftext|>. -100 makes them never win.
EOS_BIAS = {"2": -100, "0": -100}
WARMUP_TOKENS = 8
READY_TIMEOUT_S = 180

# Plain text, mixed lengths (roughly 10-60 tokens), none of them a question that invites a short answer.
PROMPTS = [
    "The history of the printing press begins in",
    "Write a long story about a lighthouse keeper who finds a message in a bottle. Once upon a time,",
    "Here is a detailed explanation of how a refrigerator works, step by step. First,",
    "The following is a travel guide to the mountains of northern Italy, covering the best hiking "
    "trails, the small villages along the way, local food, and the seasons in which to visit.",
    "In computer science, a hash table is",
    "Dear diary, today was a strange day. When I woke up this morning I noticed that",
    "List of ideas for a science fair project, with a short description of each:\n1.",
    "The old library at the end of the street had been closed for years, but one rainy evening in "
    "November a light appeared in its tallest window, and the children of the town decided to find "
    "out who had lit it. They met at the gate after dinner and",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_command(name: str, gguf: str, port: int, threads: int, parallel: int) -> list[str]:
    if name == "pyllm":
        return [sys.executable, "-m", "pyllm", "serve", gguf, "--port", str(port),
                "--parallel", str(parallel), "--threads", str(threads), "--n-ctx", "2048"]
    return [sys.executable, "-m", "llama_cpp.server", "--model", gguf, "--host", "127.0.0.1",
            "--port", str(port), "--n_threads", str(threads), "--n_threads_batch", str(threads),
            "--n_ctx", "2048", "--n_batch", "512", "--logits_all", "False",
            "--interrupt_requests", "False", "--use_mlock", "False", "--verbose", "False"]


def extra_body(name: str) -> dict:
    # llama-cpp-python's sampler applies repeat_penalty 1.1 unless told otherwise; pyllm none.
    return {"repeat_penalty": 1.0} if name == "llama.cpp" else {}


class Server:
    """One server subprocess in its own process group, stopped with it on exit."""

    def __init__(self, name: str, cmd: list[str], port: int, threads: int):
        self.name, self.cmd, self.port = name, cmd, port
        self.base = f"http://127.0.0.1:{port}"
        self.log = tempfile.NamedTemporaryFile(prefix=f"bench_server_{name}_", suffix=".log", delete=False)
        env = dict(os.environ)
        env.update(OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads),
                   MKL_NUM_THREADS=str(threads),
                   PYTHONPATH=os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p))
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, cwd=REPO, env=env,
                                     start_new_session=True)

    def log_tail(self, n: int = 15) -> str:
        self.log.flush()
        with open(self.log.name, errors="replace") as f:
            return "".join(f.readlines()[-n:])

    def wait_ready(self) -> str:
        """Polls the ready path until it answers 200; returns the model id to send in requests."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} server exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.base + READY_PATH[self.name], timeout=5) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.5)
        else:
            raise RuntimeError(f"{self.name} server not ready after {READY_TIMEOUT_S} s:\n{self.log_tail()}")
        try:
            with urllib.request.urlopen(self.base + "/v1/models", timeout=10) as r:
                return json.load(r)["data"][0]["id"]
        except Exception:
            return os.path.basename(self.cmd[self.cmd.index("serve") + 1]) if "serve" in self.cmd else "model"

    def cpu_seconds(self) -> float | None:
        """User + system CPU of the server and its children so far (psutil), None without psutil."""
        try:
            import psutil

            p = psutil.Process(self.proc.pid)
            procs = [p] + p.children(recursive=True)
            return sum(sum(q.cpu_times()[:2]) for q in procs)
        except Exception:
            return None

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)  # the group this script created for it
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            except ProcessLookupError:
                pass
        self.log.close()
        os.unlink(self.log.name)


# ----------------------------------------------------------------------------------------------
# The client
# ----------------------------------------------------------------------------------------------

async def one_request(client, name: str, model: str, prompt: str, max_tokens: int) -> dict:
    """One streaming completion: times to the first non-empty text and to the end, tokens, text."""
    r = {"text": "", "tokens": None, "finish": None, "error": None, "chunks": 0}
    r["t_send"] = time.perf_counter()
    r["t_first"] = None
    try:
        stream = await client.completions.create(
            model=model, prompt=prompt, max_tokens=max_tokens, temperature=0, stream=True,
            logit_bias=EOS_BIAS, stream_options={"include_usage": True}, extra_body=extra_body(name))
        async for chunk in stream:
            if chunk.usage is not None and chunk.usage.completion_tokens is not None:
                r["tokens"] = chunk.usage.completion_tokens
            if not chunk.choices:
                continue
            choice = chunk.choices[0]
            if choice.text:
                if r["t_first"] is None:
                    r["t_first"] = time.perf_counter()
                r["text"] += choice.text
                r["chunks"] += 1
            if choice.finish_reason:
                r["finish"] = choice.finish_reason
    except Exception as e:  # counted and reported, not fatal: the server is what is measured
        r["error"] = f"{type(e).__name__}: {e}".splitlines()[0][:200]
    r["t_end"] = time.perf_counter()
    if r["tokens"] is None:
        # llama-cpp-python sends no usage when streaming; "length" means it stopped at max_tokens.
        # Otherwise the count of text chunks stands in (one per token on both servers).
        r["tokens"] = max_tokens if r["finish"] == "length" else r["chunks"]
    return r


async def check_pass(client, name: str, model: str, max_tokens: int) -> tuple[list[str], list[str]]:
    """Each prompt once, not streamed: the server's own completion_tokens must equal max_tokens.
    Returns the texts (the reference for the streamed ones) and a list of problems."""
    texts, problems = [], []
    for i, prompt in enumerate(PROMPTS):
        try:
            c = await client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens,
                                                temperature=0, logit_bias=EOS_BIAS, extra_body=extra_body(name))
            texts.append(c.choices[0].text)
            got = c.usage.completion_tokens if c.usage else None
            if got != max_tokens or c.choices[0].finish_reason != "length":
                problems.append(f"prompt {i}: completion_tokens {got}, finish_reason {c.choices[0].finish_reason}")
        except Exception as e:
            texts.append(None)
            problems.append(f"prompt {i}: {type(e).__name__}: {e}".splitlines()[0][:200])
    return texts, problems


async def run_level(client, server: Server, model: str, c: int, per_worker: int, max_tokens: int) -> dict:
    # Warm-up: C short requests at once, so the batch shapes of this level have been run once.
    await asyncio.gather(*(one_request(client, server.name, model, PROMPTS[w % len(PROMPTS)], WARMUP_TOKENS)
                           for w in range(c)))

    async def worker(w: int) -> list[dict]:
        out = []
        for k in range(per_worker):
            i = (w * per_worker + k) % len(PROMPTS)  # every worker cycles through different prompts
            r = await one_request(client, server.name, model, PROMPTS[i], max_tokens)
            r["prompt"] = i
            out.append(r)
        return out

    cpu0, client0 = server.cpu_seconds(), time.process_time()
    t0 = time.perf_counter()
    results = [r for rs in await asyncio.gather(*(worker(w) for w in range(c))) for r in rs]
    wall = time.perf_counter() - t0
    cpu1, client1 = server.cpu_seconds(), time.process_time()
    return {"results": results, "wall": wall, "client_cpu": client1 - client0,
            "server_cpu": (cpu1 - cpu0) if cpu0 is not None and cpu1 is not None else None,
            "load": os.getloadavg()[0] if hasattr(os, "getloadavg") else None}


def p90(xs: list[float]) -> float:
    """Linear interpolation between order statistics (numpy's default), defined for any n >= 1."""
    xs = sorted(xs)
    pos = 0.9 * (len(xs) - 1)
    lo = int(pos)
    return xs[lo] + (xs[min(lo + 1, len(xs) - 1)] - xs[lo]) * (pos - lo)


def summarize(level: dict, max_tokens: int, reference: list[str | None]) -> dict:
    ok = [r for r in level["results"] if r["error"] is None]
    ttft = [r["t_first"] - r["t_send"] for r in ok if r["t_first"] is not None]
    decode = [(r["tokens"] - 1) / (r["t_end"] - r["t_first"]) for r in ok
              if r["t_first"] is not None and r["tokens"] > 1 and r["t_end"] > r["t_first"]]
    same = sum(1 for r in ok if reference[r["prompt"]] is not None and r["text"] == reference[r["prompt"]])
    errors = [r["error"] for r in level["results"] if r["error"] is not None]
    return {
        "requests": len(level["results"]), "errors": len(errors), "first_error": errors[0] if errors else None,
        "short": sum(1 for r in ok if r["tokens"] != max_tokens),
        "tokens": sum(r["tokens"] for r in ok), "wall": level["wall"],
        "tok_s": sum(r["tokens"] for r in ok) / level["wall"],
        "ttft_med": statistics.median(ttft) if ttft else None, "ttft_p90": p90(ttft) if ttft else None,
        "decode_med": statistics.median(decode) if decode else None,
        "same_text": same, "ok": len(ok),
        "client_cpu": level["client_cpu"], "server_cpu": level["server_cpu"], "load": level["load"],
    }


async def open_server(name: str, args, servers: dict) -> dict:
    """Starts one server (into servers at once, so it is stopped whatever happens next), waits for
    it and runs its check pass; returns what the run and the table need."""
    from openai import AsyncOpenAI

    port = free_port()
    cmd = server_command(name, args.gguf, port, args.threads, max(args.concurrency))
    out = {"cmd": cmd, "levels": {}}
    t0 = time.perf_counter()
    server = servers[name] = Server(name, cmd, port, args.threads)
    try:
        out["model"] = await asyncio.to_thread(server.wait_ready)
        out["startup_s"] = time.perf_counter() - t0
        # max_retries=0: a failed request is an error in the table, not a silent second try.
        out["client"] = AsyncOpenAI(base_url=server.base + "/v1", api_key="unused", max_retries=0, timeout=600)
        out["reference"], out["check"] = await check_pass(out["client"], name, out["model"], args.max_tokens)
        log(f"{name}: ready in {out['startup_s']:.1f} s; check pass: "
            f"{'every prompt gave max_tokens' if not out['check'] else '; '.join(out['check'])}")
    except Exception as e:
        out["error"] = f"{type(e).__name__}: {e}"
        log(f"{name}: {out['error']}")
    return out


async def bench_servers(names: list[str], args, results: dict) -> None:
    """Every server is started first and all stay up (idle ones use no CPU); then the levels are
    the outer loop and the servers the inner one, in alternating order, so a change in background
    load over the run touches every server alike. Fills results as it goes, so an interrupted run
    still has its finished levels."""
    servers = {}
    try:
        for name in names:
            results[name] = await open_server(name, args, servers)
        for rep in range(args.repeats):
            for i, c in enumerate(args.concurrency):
                for name in (names if (rep + i) % 2 == 0 else names[::-1]):
                    out = results[name]
                    if "error" in out:
                        continue
                    try:
                        level = await run_level(out["client"], servers[name], out["model"], c,
                                                args.requests_per_worker, args.max_tokens)
                    except Exception as e:
                        out["error"] = f"{type(e).__name__}: {e}"
                        log(f"{name} c={c}: {out['error']}")
                        continue
                    s = summarize(level, args.max_tokens, out["reference"])
                    out["levels"].setdefault(c, []).append(s)
                    log(f"[{rep + 1}/{args.repeats}] {name} c={c}: {s['tok_s']:.1f} tok/s, TTFT median "
                        f"{fmt_s(s['ttft_med'])} s, {s['requests']} requests, {s['errors']} errors, {s['short']} "
                        f"short ({s['wall']:.1f} s, load {fmt_s(s['load'])})")
    finally:
        for name, server in servers.items():
            if "client" in results.get(name, {}):
                await results[name]["client"].close()
            server.stop()


async def pyllm_in_process(gguf: str, threads: int, max_tokens: int) -> float | None:
    """pyllm's Model.stream in a fresh process, no server: per-stream decode tok/s (median over the
    prompts, timed from the first piece to the last, as for the servers)."""
    code = f"""
import json, statistics, sys, time
import pyllm
llm = pyllm.load({gguf!r}, threads={threads})
prompts = json.loads(sys.stdin.read())
rates = []
for i, p in enumerate([prompts[0]] + prompts):  # the first run is a warm-up
    n, first = 0, None
    s = llm.stream(p, max_tokens={max_tokens}, logit_bias={{2: -100, 0: -100}})
    for piece in s:
        first = first or time.perf_counter()
        n += 1
    if i:
        rates.append((len(s.token_ids) - 1) / (time.perf_counter() - first))
print(json.dumps(statistics.median(rates)))
"""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads),
               PYTHONPATH=os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p))
    proc = await asyncio.to_thread(subprocess.run, [sys.executable, "-c", code], input=json.dumps(PROMPTS),
                                   capture_output=True, text=True, env=env, cwd=REPO, check=False)
    if proc.returncode:
        log(f"pyllm in-process reference failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
        return None
    return float(proc.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------------------------
# Output
# ----------------------------------------------------------------------------------------------

def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def fmt_s(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def render(args, results: dict, in_process: float | None, m: dict, commit: str) -> str:
    try:
        import pyllm
        pyllm_version = pyllm.__version__
    except Exception:
        pyllm_version = "?"
    lines = [
        (f"### Servers under concurrent load: {os.path.basename(args.gguf)}, {args.threads} threads — "
         f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC"),
        "",
        (f"- CPU: {m['cpu']} ({m['flags']}); cores: {m['cores']}; server threads: {args.threads}; "
         f"load average at start: {m['load']}"),
        (f"- OS: {platform.platform()}; Python {platform.python_version()}; llama_cpp "
         f"{version('llama_cpp_python')}; openai {version('openai')}; fastapi {version('fastapi')}; "
         f"uvicorn {version('uvicorn')}"),
        f"- pyllm {pyllm_version}, commit {commit} at the start",
        (f"- each request: /v1/completions, stream=True, max_tokens {args.max_tokens}, temperature 0, "
         f"logit_bias {EOS_BIAS} (end-of-text ids); {len(PROMPTS)} prompts of about 10-60 tokens, cycled; "
         f"{args.requests_per_worker} requests per worker, back to back; client: AsyncOpenAI in one "
         f"process on the same machine; repeats: {args.repeats}"
         f"{', the one with the highest aggregate shown' if args.repeats > 1 else ''}"),
        "",
        ("| server | concurrency | aggregate tok/s | TTFT median s | TTFT p90 s | per-stream decode tok/s "
         "| requests | errors | short | wall s | server CPU % | client CPU % | load after |"),
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    notes = []
    for name, out in results.items():
        if "error" in out and not out["levels"]:
            lines.append(f"| {name} | | {out['error'].splitlines()[0][:160]} | | | | | | | | | | |")
        for c, runs in out["levels"].items():
            # the repeat with the highest aggregate: the one least disturbed by other work
            s = max(runs, key=lambda r: r["tok_s"])
            if len(runs) > 1:
                notes.append(f"{name} c={c}: aggregate tok/s per repeat: "
                             + ", ".join(f"{r['tok_s']:.1f}" for r in runs))
            server_cpu = f"{100 * s['server_cpu'] / s['wall']:.0f}" if s["server_cpu"] is not None else "-"
            lines.append(
                f"| {name} | {c} | {s['tok_s']:.1f} | {fmt_s(s['ttft_med'])} | {fmt_s(s['ttft_p90'])} | "
                f"{fmt_s(s['decode_med'], 1)} | {s['requests']} | {s['errors']} | {s['short']} | "
                f"{s['wall']:.1f} | {server_cpu} | {100 * s['client_cpu'] / s['wall']:.0f} | "
                f"{fmt_s(s['load'])} |")
            if s["first_error"]:
                notes.append(f"{name} c={c}: first error: {s['first_error']}")
            if s["same_text"] != s["ok"]:
                notes.append(f"{name} c={c}: {s['ok'] - s['same_text']} of {s['ok']} streamed texts differ "
                             f"from the same prompt's text in the check pass")
        if "error" in out and out["levels"]:
            notes.append(f"{name}: stopped early: {out['error'].splitlines()[0][:200]}")
        if out.get("check"):
            notes.append(f"{name} check pass (not streamed) fell short: " + "; ".join(out["check"]))
        if "startup_s" in out:
            notes.append(f"{name}: ready {out['startup_s']:.1f} s after start; command: "
                         + " ".join(os.path.basename(a) if a == sys.executable or a == args.gguf else a
                                    for a in out["cmd"])
                         + (f" (request body adds {extra_body(name)})" if extra_body(name) else ""))
    if in_process is not None:
        notes.append(f"pyllm in-process reference, no server (Model.stream, same file, {args.threads} threads, "
                     f"one stream): {in_process:.1f} tok/s per-stream decode")
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def interrupt(signum, frame):
    """SIGTERM ends the run as Ctrl-C does, so the finally blocks stop the servers."""
    raise KeyboardInterrupt


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", default=DEFAULT_GGUF, help="GGUF file both servers load")
    parser.add_argument("--servers", default=",".join(SERVERS), help=f"comma list of {', '.join(SERVERS)}")
    parser.add_argument("--threads", type=int, default=2, help="threads for every server")
    parser.add_argument("--concurrency", default="1,2,4,8,16", help="comma list of client worker counts")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens generated per request")
    parser.add_argument("--requests-per-worker", type=int, default=4, help="requests each worker sends in turn")
    parser.add_argument("--repeats", type=int, default=1,
                        help="timed rounds per level and server; the table shows the best (highest aggregate)")
    parser.add_argument("--no-reference", action="store_true",
                        help="skip the pyllm in-process (no server) decode reference")
    parser.add_argument("--out", help="also append the table to this markdown file (e.g. benchmarks/RESULTS.md)")
    args = parser.parse_args(argv)

    servers = [s.strip() for s in args.servers.split(",") if s.strip()]
    unknown = set(servers) - set(SERVERS)
    if unknown:
        parser.error(f"unknown servers {sorted(unknown)}; choose from {', '.join(SERVERS)}")
    try:
        args.concurrency = [int(c) for c in args.concurrency.split(",") if c.strip()]
    except ValueError:
        parser.error("--concurrency takes a comma list of integers, e.g. 1,2,4")
    if not args.concurrency or min(args.concurrency) < 1 or args.max_tokens < 2 or args.requests_per_worker < 1 \
            or args.repeats < 1:
        parser.error("concurrency levels, --requests-per-worker and --repeats must be >= 1, --max-tokens >= 2")
    args.gguf = os.path.abspath(os.path.expanduser(args.gguf))
    if not os.path.exists(args.gguf):
        parser.error(f"no such file: {args.gguf}")

    signal.signal(signal.SIGTERM, interrupt)

    results, in_process, status = {}, None, 0
    start_machine, start_commit = machine(), git_commit()  # the load before any server runs

    async def run_all():
        nonlocal in_process
        if "pyllm" in servers and not args.no_reference:  # first: the build the pyllm server loads
            in_process = await pyllm_in_process(args.gguf, args.threads, args.max_tokens)
        await bench_servers(servers, args, results)

    try:
        asyncio.run(run_all())
    except KeyboardInterrupt:
        log("interrupted; servers stopped; the levels that finished follow")
        for out in results.values():
            out.setdefault("error", "interrupted")
        status = 130
    table = render(args, results, in_process, start_machine, start_commit)
    print(table)
    if args.out:
        with open(args.out, "a", encoding="utf-8") as f:
            f.write("\n" + table)
    return status


if __name__ == "__main__":
    sys.exit(main())
