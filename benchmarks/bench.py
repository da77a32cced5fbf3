"""Times pyllm beside transformers and llama-cpp-python on one model, one thread count, in one run.

    python benchmarks/bench.py                                  # pyllm + transformers f32/bf16
    python benchmarks/bench.py --gguf ~/.cache/pyllm/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \\
        --threads 2 --out benchmarks/RESULTS.md                 # + llama.cpp and pyllm on the GGUF
    python benchmarks/bench.py --model FILE.gguf --engines pyllm,llama.cpp \\
        --prefill-lengths 2048 --decode-at 2000,4000 --decode-tokens 64   # long contexts
    python benchmarks/bench.py --model FILE.gguf --engines pyllm,llama.cpp --pyllm-kv-dtype f32,f16
                                                # pyllm's f32 and f16 caches, same rounds

Every engine runs in its own subprocess (started again for every repeat), so its peak RSS is its own
and no engine inherits another's threads, allocator state or warm caches. The parent only tokenizes the
prompt, starts the children, gathers their JSON and prints a markdown table. See benchmarks/README.md
for what each number means.
"""
from __future__ import annotations

import argparse
import collections
import datetime
import importlib.metadata
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)  # time the pyllm of this checkout, not an installed one
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench_bandwidth beside this file

from bench_bandwidth import decode_bytes, read_bandwidth, read_buffer  # noqa: E402

DEFAULT_MODEL = os.path.expanduser("~/.cache/pyllm/smollm2-135m-instruct-bf16")
ENGINES = ("pyllm", "transformers-f32", "transformers-bf16", "llama.cpp")
PROMPT_FILE = "/usr/share/common-licenses/GPL-3"  # real English, long enough, on every Debian/Ubuntu
PREFILL_LENGTHS = (128, 512)  # --prefill-lengths
DECODE_PROMPT = 128  # decode starts after a prompt of this many tokens (--decode-at)
N_CTX = 2048  # every engine gets the same context size, so cache allocation is comparable (more
             # when a prompt or decode position needs it)
KV_DTYPES = ("f32", "f16", "q8_0")  # --pyllm-kv-dtype
CHECK_TOKENS = 16  # greedy tokens compared across engines to show each one ran the same model
READ_BUFFER_BYTES = 1 << 28  # the plain read before each round: 8x a 32 MiB last-level cache
RESULT_MARK = "BENCH_RESULT "  # the child's one stdout line the parent reads


# ----------------------------------------------------------------------------------------------
# Engines, as seen from inside a child: load, prefill (returns the greedy next token), step.
# Each computes logits for the last position only, so prefill compares the same work.
# ----------------------------------------------------------------------------------------------

class PyllmEngine:
    def __init__(self, source: str, threads: int, dtype: str | None, n_ctx: int, kv_dtype: str | None):
        import numpy as np

        import pyllm

        self.np = np
        kwargs = {"threads": threads, "n_ctx": n_ctx}
        if dtype:  # only when asked: older pyllm builds have no dtype argument
            kwargs["dtype"] = dtype
        if kv_dtype:
            kwargs["kv_dtype"] = kv_dtype
        self.llm = pyllm.load(source, **kwargs)
        self.kv_dtype = getattr(self.llm, "kv_dtype", "f32")  # what the default chose, where none is named

    def prefill(self, ids: list[int]) -> int:
        self.llm.reset()  # _prefill reuses a cached prefix; a timing must start from an empty cache
        return int(self.np.argmax(self.llm._prefill(ids)))

    def step(self, token: int) -> int:
        return int(self.np.argmax(self.llm._step(token)))

    def settle(self, ids: list[int]) -> str | None:
        """Decodes after ids until the model has chosen its decode threads (its first 8-32 steps take
        other thread counts in turn: README), untimed like the other warm-ups; what it chose."""
        tuner = getattr(self.llm.core, "decode_threads", None)  # None: a build that does not measure
        if tuner is None:
            return None
        start, steps, token = time.perf_counter(), 0, self.prefill(ids)
        while tuner.chosen is None:
            token, steps = self.step(token), steps + 1
        return (f"{tuner.chosen} of {self.llm.core.n_threads} "
                f"({steps} steps, {time.perf_counter() - start:.2f} s, before the timings)")


class TransformersEngine:
    def __init__(self, folder: str, threads: int, dtype: str):
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(threads)
        self.torch = torch
        torch_dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[dtype]
        if folder.endswith(".gguf"):  # transformers dequantizes a GGUF to torch_dtype as it loads
            src, name = os.path.split(folder)
            self.model = AutoModelForCausalLM.from_pretrained(src, gguf_file=name, dtype=torch_dtype).eval()
        else:
            self.model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch_dtype).eval()
        self.past = None

    def _forward(self, ids: list[int], past) -> int:
        with self.torch.inference_mode():
            # logits_to_keep=1: the lm_head runs on the last position only, as in the other engines
            out = self.model(input_ids=self.torch.tensor([ids]), past_key_values=past, use_cache=True,
                             logits_to_keep=1)
        self.past = out.past_key_values
        return int(out.logits[0, -1].argmax())

    def prefill(self, ids: list[int]) -> int:
        return self._forward(ids, None)  # no past: a fresh cache every time

    def step(self, token: int) -> int:
        # One forward per token with the cache, not model.generate: the timing is the model only,
        # without generate's logits processors, stopping criteria and bookkeeping.
        return self._forward([token], self.past)


class LlamaCppEngine:
    def __init__(self, path: str, threads: int, n_ctx: int):
        import llama_cpp
        import numpy as np

        self.np = np
        self.llama_cpp = llama_cpp
        self.llm = llama_cpp.Llama(model_path=path, n_threads=threads, n_threads_batch=threads,
                                   n_ctx=n_ctx, n_batch=512, verbose=False)  # its cache: f16
        self.n_vocab = self.llm.n_vocab()
        # Which SIMD paths and thread runtime (OpenMP or not) this llama.cpp build has: a wheel
        # built without the CPU's features would make the comparison unfair, so the table says.
        self.build = llama_cpp.llama_print_system_info().decode().strip(" |")

    def _last_logits(self) -> int:
        # Llama.eval no longer copies logits into llm.scores unless logits_all=True (which would make
        # every prefill position compute logits), so read the last row straight from the context.
        ptr = self.llama_cpp.llama_get_logits_ith(self.llm._ctx.ctx, -1)
        return int(self.np.argmax(self.np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))))

    def prefill(self, ids: list[int]) -> int:
        self.llm.reset()  # n_tokens = 0, so eval drops the whole KV cache and decodes every id
        self.llm.eval(ids)  # llama_decode in n_batch chunks: a real forward, every call
        return self._last_logits()

    def step(self, token: int) -> int:
        self.llm.eval([token])
        return self._last_logits()


def open_engine(spec: dict):
    kind, source, threads = spec["engine"], spec["source"], spec["threads"]
    n_ctx = spec.get("n_ctx", N_CTX)
    if kind == "pyllm":
        return PyllmEngine(source, threads, spec.get("dtype"), n_ctx, spec.get("kv_dtype"))
    if kind.startswith("transformers-"):
        return TransformersEngine(source, threads, kind.split("-", 1)[1])
    if kind == "llama.cpp":
        return LlamaCppEngine(source, threads, n_ctx)
    raise ValueError(f"unknown engine {kind!r}")


# ----------------------------------------------------------------------------------------------
# What a child times. One child = one engine, one repeat.
# ----------------------------------------------------------------------------------------------

def time_load(spec: dict):
    """Seconds from the constructor call to the end of a first one-token forward.

    The first forward is included because mmap-based engines (pyllm, llama.cpp) defer reading the
    weights to it, while transformers reads them in from_pretrained; a one-token step touches every
    weight matrix, so this is "time until the model can answer" for all of them alike.
    """
    start = time.perf_counter()
    engine = open_engine(spec)
    engine.prefill(spec["ids"][:1])
    return engine, time.perf_counter() - start


def time_prefill(engine, ids: list[int]) -> float:
    """Prompt tokens per second for one prefill of ids from an empty cache."""
    start = time.perf_counter()
    engine.prefill(ids)
    return len(ids) / (time.perf_counter() - start)


def cpu_jiffies() -> tuple[int, int] | None:
    """(stolen, all) CPU time of the machine so far, in jiffies, from /proc/stat's "cpu" line: steal
    is the time the hypervisor ran something else while this VM's CPUs wanted to run (None where
    there is no /proc/stat)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    return fields[7], sum(fields)


def stolen_share(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """The share of the machine's CPU time between two cpu_jiffies() that the hypervisor took."""
    if not before or not after or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


def time_decode(engine, prompt: list[int], n_tokens: int) -> tuple[float, list[int], float | None]:
    """Greedy tokens per second over n_tokens steps after prompt; the first step is not timed.

    The first step after a prefill can pay one-off costs (buffers sized for one row, first use of
    the single-row kernels), so it runs untimed as a warm-up; then n_tokens steps are timed. EOS is
    ignored: every engine decodes the same number of tokens. Also returns the share of CPU time the
    hypervisor stole meanwhile (stolen_share): a thread it stops holds up the others at their next
    barrier, in every engine.
    """
    token = engine.prefill(prompt)
    produced = [token]
    token = engine.step(token)  # warm-up step
    produced.append(token)
    jiffies = cpu_jiffies()
    start = time.perf_counter()
    for _ in range(n_tokens):
        token = engine.step(token)
        produced.append(token)
    elapsed = time.perf_counter() - start
    return n_tokens / elapsed, produced, stolen_share(jiffies, cpu_jiffies())


def peak_rss_mb() -> float:
    """Peak resident set of this process: VmHWM, which exec resets (ru_maxrss may carry the
    parent's peak across fork+exec). Mapped weight files count once their pages are touched."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (1024 * 1024 if sys.platform == "darwin" else 1024)  # bytes on macOS, KiB elsewhere


def run_child(spec: dict) -> dict:
    ids = spec["ids"]
    try:
        engine, load_s = time_load(spec)
    except ImportError as e:
        return {"error": f"not installed ({e})"}
    except Exception as e:  # an engine that cannot read this file: reported, not fatal
        return {"error": f"unsupported: {type(e).__name__}: {e}".splitlines()[0][:200]}
    # Untimed warm-up prefill at the longest length: the first long prefill allocates scratch
    # buffers and the KV cache, and torch picks its kernels; the timed runs then see steady state.
    prefill_lengths = spec.get("prefill_lengths", PREFILL_LENGTHS)
    engine.prefill(ids[:max(prefill_lengths)])
    result = {"load_s": load_s}
    if hasattr(engine, "settle"):
        result["decode_threads"] = engine.settle(ids[:DECODE_PROMPT])
    if hasattr(engine, "build"):
        result["build"] = engine.build
    if hasattr(engine, "kv_dtype"):
        result["kv_dtype"] = engine.kv_dtype
    for n in prefill_lengths:
        result[f"prefill{n}"] = time_prefill(engine, ids[:n])
    for i, p in enumerate(spec.get("decode_at", [DECODE_PROMPT])):
        result[f"decode{p}"], tokens, stolen = time_decode(engine, ids[:p], spec["decode_tokens"])
        if i == 0:
            result["tokens"] = tokens
            result["stolen"] = stolen
    result["rss_mb"] = peak_rss_mb()
    return result


# ----------------------------------------------------------------------------------------------
# The parent: prompt, runs, table.
# ----------------------------------------------------------------------------------------------

def prompt_ids(folder: str, n: int) -> list[int]:
    """The first n token ids of real English text, from the model folder's tokenizer.json (or the
    GGUF's own vocabulary when the model is a .gguf).

    Every engine gets these ids, never text, so no engine's tokenizer is part of the timing and all
    run exactly the same sequence.
    """
    from pyllm.tokenizer import Tokenizer

    if folder.endswith(".gguf"):
        from pyllm.formats.gguf import GGUFFile
        from pyllm.tokenizer_gguf import tokenizer_from_gguf

        info = tokenizer_from_gguf(GGUFFile(folder).metadata, source=folder)
        tokenizer = Tokenizer(hf=info.tokenizer, bos_id=info.bos_id, eos_id=info.eos_id)
    else:
        tokenizer = Tokenizer.from_folder(folder)
    paths = [PROMPT_FILE, os.path.join(REPO, "README.md")]
    texts = []
    for path in paths:
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                texts.append(f.read())
    text = "\n\n".join(texts)
    ids = tokenizer.encode(text)
    while len(ids) < n:  # only if neither file is long enough
        ids = ids + tokenizer.encode(text, add_special=False)
    return ids[:n]


def check_gguf_vocab(gguf: str, folder: str, ids: list[int]) -> str | None:
    """A warning when the GGUF's vocabulary does not name the prompt ids as tokenizer.json does:
    then the two files are not the same model and their rows must not be compared."""
    try:
        from pyllm.formats.gguf import GGUFFile
        from pyllm.tokenizer import Tokenizer

        tokens = GGUFFile(gguf).get("tokenizer.ggml.tokens") or []
        hf = Tokenizer.from_folder(folder).hf
    except Exception as e:
        return f"could not compare the GGUF vocabulary with {folder}: {e}"
    bad = [i for i in set(ids) if i >= len(tokens) or tokens[i] != hf.id_to_token(i)]
    if bad:
        return f"the GGUF vocabulary differs from {folder}/tokenizer.json on {len(bad)} prompt ids"
    return None


def weights_label(source: str) -> str:
    """The stored weight type(s) of a folder's safetensors or of a GGUF, most common first."""
    counts: collections.Counter = collections.Counter()
    try:
        if os.path.isdir(source):
            for name in sorted(os.listdir(source)):
                if name.endswith(".safetensors"):
                    with open(os.path.join(source, name), "rb") as f:
                        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
                    counts.update(v["dtype"] for k, v in header.items() if k != "__metadata__")
        else:
            from pyllm.formats.gguf import GGUFFile

            counts.update(t.wtype.name for t in GGUFFile(source).tensors.values()
                          if len(t.shape) >= 2)  # matrices: the 1-D norms are f32 everywhere
    except Exception:
        return "?"
    return " + ".join(name.lower() for name, _ in counts.most_common()) or "?"


def warm_page_cache(paths) -> None:
    """Reads the model files once so every engine's load time is parsing, not the disk."""
    for path in paths:
        files = [os.path.join(path, n) for n in os.listdir(path)] if os.path.isdir(path) else [path]
        for name in files:
            with open(name, "rb") as f:
                while f.read(1 << 24):
                    pass


def spawn(spec: dict, threads: int) -> dict:
    """Runs one child; its JSON result, or an error string from its exit."""
    env = dict(os.environ)
    # Thread pools that read the environment (OpenMP in torch, BLAS) get the same count.
    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
               OPENBLAS_NUM_THREADS=str(threads),
               PYTHONPATH=os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p))
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child"],
                          input=json.dumps(spec), capture_output=True, text=True, env=env, check=False)
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_MARK):
            return json.loads(line[len(RESULT_MARK):])
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return {"error": f"crashed (exit {proc.returncode}): {tail[:200]}"}


def pyllm_row(base: str, kv_dtype: str | None, kv_dtypes: list[str | None]) -> str:
    """A pyllm row's name: base ("pyllm", "pyllm (gguf)"), and its KV cache type when the run times
    more than one; the first type keeps the plain name, which the ratios and checks pair by."""
    if kv_dtype == kv_dtypes[0]:
        return base
    return f"{base[:-1]}, {kv_dtype} KV)" if base.endswith(")") else f"{base} ({kv_dtype} KV)"


def plan_runs(args) -> list[dict]:
    """One row per (engine, model file), pyllm's once per KV cache type. pyllm runs on the folder
    and, with --gguf, on the GGUF."""
    runs = []
    for engine in args.engines:
        if engine == "pyllm":
            for kv in args.pyllm_kv_dtype:
                if args.model != args.gguf:
                    runs.append({"row": pyllm_row("pyllm", kv, args.pyllm_kv_dtype), "engine": engine,
                                 "source": args.model, "dtype": args.pyllm_dtype, "kv_dtype": kv})
                if args.gguf:
                    runs.append({"row": pyllm_row("pyllm (gguf)", kv, args.pyllm_kv_dtype), "engine": engine,
                                 "source": args.gguf, "dtype": args.pyllm_dtype, "kv_dtype": kv})
        elif engine.startswith("transformers-"):
            runs.append({"row": engine, "engine": engine, "source": args.model})
        elif engine == "llama.cpp":
            run = {"row": "llama.cpp", "engine": engine, "source": args.gguf or "-"}
            if not args.gguf:
                run["skip"] = "needs --gguf"
            elif importlib.util.find_spec("llama_cpp") is None:
                run["skip"] = "not installed"
            runs.append(run)
    return runs


def combine(results: list[dict], how: str, columns: list[str]) -> dict:
    """Repeats -> one figure per metric: best (or median) time/throughput, highest peak RSS."""
    ok = [r for r in results if "error" not in r]
    if not ok:
        return {"error": results[-1]["error"] if results else "no run"}
    pick_max = max if how == "best" else statistics.median
    pick_min = min if how == "best" else statistics.median
    out = {"load_s": pick_min(r["load_s"] for r in ok), "rss_mb": max(r["rss_mb"] for r in ok),
           "tokens": ok[0]["tokens"]}
    for key in ("build", "decode_threads"):
        if ok[0].get(key):
            out[key] = ok[0][key]
    for key in columns:
        out[key] = pick_max(r[key] for r in ok)
    if len(ok) < len(results):
        out["note"] = f"{len(results) - len(ok)} of {len(results)} repeats failed"
    return out


def version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def git_commit() -> str:
    def git(*a):
        return subprocess.run(["git", "-C", REPO, *a], capture_output=True, text=True, check=False).stdout.strip()

    commit = git("rev-parse", "--short", "HEAD")
    if not commit:
        return "unknown (not a git checkout)"
    # Only tracked files: an untracked test or note does not change what was timed.
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return f"{commit}{' (dirty tree: uncommitted changes)' if dirty else ' (clean tree)'}"


def machine() -> dict:
    cpu, flags = platform.processor() or "?", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and cpu in ("?", "", "x86_64"):
                    cpu = value.strip()
                elif key.strip() in ("flags", "Features") and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    wanted = ("avx2", "fma", "f16c", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_bf16",
              "asimd", "asimddp", "sve")
    try:
        import psutil
        physical = psutil.cpu_count(logical=False)
    except ImportError:
        physical = None
    available = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": cpu, "flags": " ".join(f for f in wanted if f in flags) or "-",
            "cores": f"{physical or '?'} physical, {os.cpu_count()} logical, {available} available to "
                     f"this process",
            "load": " ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"}


def fmt(value, digits=1) -> str:
    return f"{value:,.{digits}f}"


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}×" if b else "-"


def columns(args) -> list[tuple[str, str]]:
    """(result key, column title) of every throughput the children time."""
    cols = [(f"prefill{n}", f"prefill {n}") for n in args.prefill_lengths]
    default = args.decode_at == [DECODE_PROMPT]
    return cols + [(f"decode{p}", "decode" if default else f"decode at {p}") for p in args.decode_at]


def per_round_lines(args, runs, results, pairs, ceiling) -> list[str]:
    """Each pair's ratios round by round (a round runs the engines one after another, so its ratio
    compares the same minutes of a machine whose speed drifts) and their median, which one lucky or
    unlucky minute of either engine does not move as it moves a best-of; and every engine's decode
    against the plain read measured before that round: decode reads each weight once a token, so no
    engine can decode faster than read bandwidth / bytes of weights."""
    keys = [key for key, _ in columns(args)]
    out = []
    for mine, theirs, _, _ in pairs:
        per_key = []
        for key, title in columns(args):
            values = [a[key] / b[key] for a, b in zip(results[mine], results[theirs])
                      if "error" not in a and "error" not in b and b[key]]
            median = f" (median {statistics.median(values):.2f}×)" if len(values) >= 3 else ""
            per_key.append(f"{title} {' / '.join(f'{v:.2f}×' for v in values)}{median}")
        out.append(f"- {mine} ÷ {theirs} per round: " + "; ".join(per_key))
    if ceiling:
        gbs, weights = ceiling["gbs"], ceiling["bytes"]
        out.append(f"- plain read before each round ({args.threads} threads, "
                   f"{READ_BUFFER_BYTES >> 20} MiB on 2 MB pages, best of 3): " + " / ".join(f"{g:.1f}" for g in gbs) + " GB/s")
        for run in runs:
            source_bytes = weights.get(run["row"])
            decodes = [k for k in keys if k.startswith("decode")]
            if not source_bytes or not decodes:
                continue
            shares = [f"{r[decodes[0]] * source_bytes / (g * 1e9):.0%}"
                      for r, g in zip(results[run["row"]], gbs) if "error" not in r]
            out.append(f"- {run['row']}: {source_bytes / 1e6:.1f} MB of weights a token (the layer matrices "
                       f"and the head); {columns(args)[keys.index(decodes[0])][1]} per round at "
                       + " / ".join(shares) + " of that round's read ceiling (the KV cache not counted)")
    stolen = [(run["row"], [r.get("stolen") for r in results[run["row"]] if "error" not in r]) for run in runs]
    if any(share is not None for _, shares in stolen for share in shares):
        out.append("- CPU time the hypervisor stole during each round's decode (/proc/stat steal, whole machine): "
                   + "; ".join(f"{row} " + " / ".join("?" if v is None else f"{v:.1%}" for v in shares)
                               for row, shares in stolen if shares))
    return [""] + out if out else []


def kv_caches(runs: list[dict], results: dict) -> str:
    """Each pyllm row's cache type as its children reported it ("pyllm (gguf) f16, pyllm f32"): where
    none is named, pyllm's default depends on the weights."""
    parts = []
    for run in runs:
        if run["engine"] == "pyllm":
            seen = sorted({r["kv_dtype"] for r in results.get(run["row"], []) if "kv_dtype" in r})
            parts.append(f"{run['row']} {'/'.join(seen) or run.get('kv_dtype') or '?'}")
    return ", ".join(parts) or "no pyllm row"


def render(args, runs, combined, warnings, results, ceiling) -> str:
    import pyllm

    m = machine()
    lines = [
        (f"### {os.path.basename(args.model.rstrip('/'))}, {args.threads} threads — "
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC"),
        "",
        (f"- CPU: {m['cpu']} ({m['flags']}); cores: {m['cores']}; threads used: {args.threads}; "
        f"load average at start: {m['load']}"),
        (f"- OS: {platform.platform()}; Python {platform.python_version()}; numpy {version('numpy')}; "
        f"torch {version('torch')}; transformers {version('transformers')}; "
        f"llama_cpp {version('llama_cpp_python')}"),
        f"- pyllm {pyllm.__version__}, commit {git_commit()}",
        (f"- prompt: the first {prompt_length(args)} tokens of {os.path.basename(PROMPT_FILE)}, the same "
        f"ids for every engine; decode: {args.decode_tokens} greedy tokens after a prompt of "
        f"{', '.join(map(str, args.decode_at))} tokens, first step untimed; context {n_ctx(args)}; "
        f"repeats: {args.repeats}, each a fresh process, "
        f"{'best' if args.stat == 'best' else 'median'} of them shown (peak RSS: the highest)"),
        (f"- KV cache: {kv_caches(runs, results)}, llama.cpp f16 (its default), transformers the model's dtype"),
        "",
        ("| engine | model file | weights | load s | " + " | ".join(f"{t} tok/s" for _, t in columns(args))
         + " | peak RSS MB |"),
        "|---|---|---|--:|" + "--:|" * len(columns(args)) + "--:|",
    ]
    for run in runs:
        r = combined[run["row"]]
        source = os.path.basename(run["source"].rstrip("/"))
        weights = weights_label(run["source"]) if run["source"] != "-" else "-"
        wanted = run.get("dtype") or (run["engine"].split("-", 1)[1]
                                      if run["engine"].startswith("transformers-") else None)
        if wanted and wanted.lower() != weights:
            weights = f"{wanted} (from {weights} at load)"
        if "error" in r:
            lines.append(f"| {run['row']} | {source} | {weights} | {r['error']} |" + " |" * (len(columns(args)) + 1))
            continue
        lines.append(f"| {run['row']} | {source} | {weights} | {fmt(r['load_s'], 2)} | "
                     + "".join(f"{fmt(r[key])} | " for key, _ in columns(args)) + f"{fmt(r['rss_mb'], 0)} |")

    # Ratios pair pyllm with each engine on the same file: the folder for transformers, the GGUF
    # (when pyllm could load it) for llama.cpp.
    pairs = []
    for run in runs:
        other = combined[run["row"]]
        if run["engine"] == "pyllm" or "error" in other:
            continue
        base = "pyllm (gguf)" if run["engine"] == "llama.cpp" else "pyllm"
        for kv in args.pyllm_kv_dtype:
            mine = pyllm_row(base, kv, args.pyllm_kv_dtype)
            if mine in combined and "error" not in combined[mine]:
                pairs.append((mine, run["row"], combined[mine], other))
    if pairs:
        lines += ["", ("pyllm ÷ other engine on the same file (throughput: above 1 = pyllm faster; "
                  "load time and RSS: below 1 = pyllm lighter):"), "",
                  "| pyllm row | vs | load | " + " | ".join(t for _, t in columns(args)) + " | peak RSS |",
                  "|---|---|--:|" + "--:|" * len(columns(args)) + "--:|"]
        for mine, theirs, a, b in pairs:
            lines.append(f"| {mine} | {theirs} | {ratio(a['load_s'], b['load_s'])} | "
                         + "".join(f"{ratio(a[key], b[key])} | " for key, _ in columns(args))
                         + f"{ratio(a['rss_mb'], b['rss_mb'])} |")

    lines += per_round_lines(args, runs, results, pairs, ceiling)

    # Same greedy continuation = same model run on the same ids (bf16 and 4-bit rows may drift).
    checks = []
    for run in runs:
        r = combined[run["row"]]
        ref = combined.get("pyllm (gguf)" if run["engine"] == "llama.cpp" else "pyllm", {})
        if run["engine"] == "pyllm" or "error" in r or "tokens" not in ref:
            continue
        a, b = ref["tokens"][:CHECK_TOKENS], r["tokens"][:CHECK_TOKENS]
        same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))
        checks.append(f"{run['row']} {same}/{len(a)}")
    notes = [f"{row}: {r['note']}" for row, r in combined.items() if "note" in r] + warnings
    notes += [f"{row} build: {r['build']}" for row, r in combined.items() if "build" in r]
    notes += [f"{row} decode threads: {r['decode_threads']}" for row, r in combined.items() if "decode_threads" in r]
    if checks:
        notes.append(f"greedy tokens after the {args.decode_at[0]}-token prompt that agree with pyllm on "
                     f"the same file before the first difference: " + ", ".join(checks))
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def prompt_length(args) -> int:
    return max(args.prefill_lengths + args.decode_at)


def n_ctx(args) -> int:
    """N_CTX, or room for the longest prompt and its decode (a multiple of 256)."""
    need = max(max(args.prefill_lengths), max(args.decode_at) + args.decode_tokens + 2)
    return max(N_CTX, (need + 255) // 256 * 256)


def read_ceiling_setup(runs) -> dict | None:
    """A buffer for the plain read, and the decode bytes a token of each row that reads the file as
    stored (pyllm without a dtype conversion, llama.cpp); None where pyllm cannot load the model
    (the table then goes without the ceiling lines)."""
    import numpy as np

    weights, by_source = {}, {}
    for run in runs:
        if "skip" in run or run["engine"] not in ("pyllm", "llama.cpp") or run.get("dtype"):
            continue
        try:
            if run["source"] not in by_source:
                by_source[run["source"]] = decode_bytes(run["source"])
        except Exception as e:  # a file pyllm cannot load: the engines still run
            print(f"no read ceiling for {run['source']}: {e}", file=sys.stderr)
            return None
        weights[run["row"]] = by_source[run["source"]]
    return {"buffer": read_buffer(READ_BUFFER_BYTES), "bytes": weights, "gbs": []}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=DEFAULT_MODEL,
                        help="Hugging Face folder (pyllm, transformers; its tokenizer makes the prompt)")
    parser.add_argument("--gguf", help="GGUF file for llama.cpp, and for pyllm when it can load it")
    parser.add_argument("--engines", default=",".join(ENGINES), help=f"comma list of {', '.join(ENGINES)}")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes per engine")
    parser.add_argument("--stat", choices=("best", "median"), default="best", help="how repeats combine")
    parser.add_argument("--decode-tokens", type=int, default=128)
    parser.add_argument("--prefill-lengths", default=",".join(map(str, PREFILL_LENGTHS)),
                        help="comma list of prompt lengths to time prefill at")
    parser.add_argument("--decode-at", default=str(DECODE_PROMPT),
                        help="comma list of positions (prompt lengths) decode starts at")
    parser.add_argument("--pyllm-dtype", help='passed to pyllm.load(dtype=...), e.g. "q8_0", "q4_0", "bf16"')
    parser.add_argument("--pyllm-kv-dtype", default="",
                        help="pyllm's KV cache type (pyllm.load(kv_dtype=...): f32, f16, q8_0), or a comma "
                             "list: a pyllm row for each, in the same rounds; llama.cpp's is f16")
    parser.add_argument("--out", help="append the table to this markdown file (e.g. benchmarks/RESULTS.md)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child:  # one engine, one repeat; the spec arrives on stdin
        print(RESULT_MARK + json.dumps(run_child(json.load(sys.stdin))), flush=True)
        return 0

    args.engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    unknown = set(args.engines) - set(ENGINES)
    if unknown:
        parser.error(f"unknown engines {sorted(unknown)}; choose from {', '.join(ENGINES)}")
    args.model = os.path.expanduser(args.model)
    args.gguf = os.path.expanduser(args.gguf) if args.gguf else None
    if args.model.endswith(".gguf"):  # a GGUF alone: every engine runs it, transformers through its GGUF loader
        args.gguf = args.gguf or args.model
        if args.gguf != args.model:
            parser.error("--model and --gguf name different GGUF files")
    try:
        args.prefill_lengths = [int(x) for x in args.prefill_lengths.split(",") if x.strip()]
        args.decode_at = [int(x) for x in args.decode_at.split(",") if x.strip()]
    except ValueError:
        parser.error("--prefill-lengths and --decode-at take comma lists of integers")
    if not args.prefill_lengths or not args.decode_at or min(args.prefill_lengths + args.decode_at) < 1:
        parser.error("--prefill-lengths and --decode-at need positive lengths")
    kv_dtypes = [x.strip() for x in args.pyllm_kv_dtype.split(",") if x.strip()]
    if any(x not in KV_DTYPES for x in kv_dtypes) or len(set(kv_dtypes)) < len(kv_dtypes):
        parser.error(f"--pyllm-kv-dtype takes distinct types among {', '.join(KV_DTYPES)}")
    args.pyllm_kv_dtype = kv_dtypes or [None]  # None: pyllm's default (f16 for quantized weights, else f32)

    ids = prompt_ids(args.model, prompt_length(args))
    warnings = []
    if args.gguf and args.gguf != args.model:
        problem = check_gguf_vocab(args.gguf, args.model, ids)
        if problem:
            warnings.append(problem)
    warm_page_cache([args.model] + ([args.gguf] if args.gguf else []))

    runs = plan_runs(args)
    results = {run["row"]: [] for run in runs}
    ceiling = read_ceiling_setup(runs)
    # Repeats are the outer loop, so a change in background load over the run touches every engine.
    for rep in range(args.repeats):
        if ceiling:
            ceiling["gbs"].append(read_bandwidth(ceiling["buffer"], args.threads, 3))
        for run in runs:
            if "skip" in run:
                continue
            spec = {"engine": run["engine"], "source": run["source"], "dtype": run.get("dtype"),
                    "threads": args.threads, "ids": ids, "decode_tokens": args.decode_tokens,
                    "prefill_lengths": args.prefill_lengths, "decode_at": args.decode_at, "n_ctx": n_ctx(args),
                    "kv_dtype": run.get("kv_dtype")}
            t0 = time.perf_counter()
            result = spawn(spec, args.threads)
            results[run["row"]].append(result)
            status = result.get("error") or ", ".join(
                [f"{title} {result[key]:.1f} tok/s" for key, title in columns(args)]
                + [f"peak RSS {result['rss_mb']:.1f} MB"])
            print(f"[{rep + 1}/{args.repeats}] {run['row']}: {status} ({time.perf_counter() - t0:.0f} s)",
                  file=sys.stderr, flush=True)
    keys = [key for key, _ in columns(args)]
    combined = {run["row"]: ({"error": run["skip"]} if "skip" in run else combine(results[run["row"]], args.stat, keys))
                for run in runs}
    table = render(args, runs, combined, warnings, results, ceiling)
    print(table)
    if args.out:
        with open(args.out, "a", encoding="utf-8") as f:
            f.write("\n" + table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
