"""llguidance beside outlines-core and xgrammar, the libraries issue 36 asks to compare: the time of
one token's mask (computed into a bitmask, then the token consumed) on the same JSON schema at Qwen2.5's
152k and Gemma 3's 262k vocabularies, the time to get a schema ready, which JSON-schema features each
enforces, and whether importing it loads torch. outlines-core and xgrammar are benchmark-only tools
here, never pyllm dependencies:

    pip install outlines-core xgrammar
    python benchmarks/bench_constraint_libraries.py [--libraries llguidance outlines-core xgrammar]
        [--vocabularies qwen2.5 gemma3] [--coverage]

Every library walks the same tokens: one JSON document valid under bench_constraints.SCHEMA, tokenized
by the vocabulary's own tokenizer. Qwen2.5's tokenizer.json comes from the llama.cpp sdist's test
vocabularies (tests/families.py caches it), Gemma 3's from the GGUF file pyllm's tests fetch (its
metadata, through pyllm's GGUF tokenizer). Each library runs in a fresh process, so its import is seen alone.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from importlib.metadata import version

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from bench_constraints import SCHEMA  # noqa: E402

LIBRARIES = ("llguidance", "outlines-core", "xgrammar")
DOCUMENT = ('{"name": "Ada Lovelace", "age": 36, "city": "London", '
            '"hobbies": ["mathematics", "poetry", "analytical engines"], "employed": false}')
QWEN_DIR = os.path.expanduser("~/.cache/pyllm-tests/tokenizers/qwen2-llama-cpp-python-0.3.36")
GEMMA_GGUF = os.path.expanduser("~/.cache/pyllm-tests/gemma-3-270m-q4_k_m.gguf")

OBJ = {"type": "object", "additionalProperties": False}
# feature: (schema, a document it accepts, one it must refuse)
FEATURES = {
    "$ref": ({**OBJ, "$defs": {"P": {"type": "integer"}}, "properties": {"a": {"$ref": "#/$defs/P"}},
              "required": ["a"]}, '{"a": 1}', '{"a": "x"}'),
    "recursive $ref": ({"$defs": {"N": {**OBJ, "properties": {"c": {"type": "array", "items": {"$ref": "#/$defs/N"}}},
                                        "required": ["c"]}}, "$ref": "#/$defs/N"},
                       '{"c": [{"c": []}]}', '{"c": [{"d": 1}]}'),
    "anyOf": ({**OBJ, "properties": {"a": {"anyOf": [{"type": "integer"}, {"type": "string"}]}}, "required": ["a"]},
              '{"a": "x"}', '{"a": true}'),
    "pattern": ({**OBJ, "properties": {"a": {"type": "string", "pattern": "^[A-Z][0-9]{2}$"}}, "required": ["a"]},
                '{"a": "B12"}', '{"a": "b12"}'),
    "minItems/maxItems": ({**OBJ, "properties": {"a": {"type": "array", "items": {"type": "integer"},
                                                       "minItems": 2, "maxItems": 3}}, "required": ["a"]},
                          '{"a": [1, 2]}', '{"a": [1]}'),
    "enum": ({**OBJ, "properties": {"a": {"enum": ["x", "y"]}}, "required": ["a"]}, '{"a": "y"}', '{"a": "z"}'),
    "integer range": ({**OBJ, "properties": {"a": {"type": "integer", "minimum": 10, "maximum": 20}},
                       "required": ["a"]}, '{"a": 15}', '{"a": 25}'),
    "number range": ({**OBJ, "properties": {"a": {"type": "number", "minimum": 0, "maximum": 1}},
                      "required": ["a"]}, '{"a": 0.5}', '{"a": 2.5}'),
    "additionalProperties: false": ({**OBJ, "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                                    '{"a": 1}', '{"a": 1, "b": 2}'),
    "additionalProperties: schema": ({"type": "object", "additionalProperties": {"type": "integer"}},
                                     '{"x": 1, "y": 2}', '{"x": "s"}'),
    "optional properties": ({**OBJ, "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                             "required": ["a"]}, '{"a": 1}', '{"b": 1}'),
    "minLength/maxLength": ({**OBJ, "properties": {"a": {"type": "string", "minLength": 2, "maxLength": 3}},
                             "required": ["a"]}, '{"a": "abc"}', '{"a": "abcd"}'),
}


def hf_tokenizer(vocabulary: str):
    """(a `tokenizers` Tokenizer, the model's vocabulary size, its end-of-sequence id)."""
    from tokenizers import Tokenizer
    if vocabulary == "qwen2.5":
        with open(os.path.join(QWEN_DIR, "special.json")) as f:
            special = json.load(f)
        tok = Tokenizer.from_file(os.path.join(QWEN_DIR, "tokenizer.json"))
        return tok, special["vocab_size"], special["eos_token_id"]
    from pyllm.formats.gguf import GGUFFile
    from pyllm.tokenizer_gguf import tokenizer_from_gguf
    metadata = GGUFFile(GEMMA_GGUF).metadata
    info = tokenizer_from_gguf(metadata)
    return info.tokenizer, len(metadata["tokenizer.ggml.tokens"]), int(metadata["tokenizer.ggml.eos_token_id"])


def token_bytes(tok) -> dict[int, bytes]:
    """Each ordinary token's bytes (special tokens left out): byte-level BPE's characters mapped back
    to bytes, or SentencePiece's "▁" and <0xAB> byte tokens."""
    from pyllm.tokenizer_gguf import bytes_to_unicode
    special = {i for i, t in tok.get_added_tokens_decoder().items() if t.special}
    byte_level = "ByteLevel" in json.dumps(json.loads(tok.to_str()).get("decoder"))
    back = {c: b for b, c in bytes_to_unicode().items()}
    out = {}
    for text, i in tok.get_vocab().items():
        if i in special:
            continue
        if byte_level:
            out[i] = bytes(back[c] for c in text)
        elif len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
            out[i] = bytes([int(text[3:5], 16)])
        else:
            out[i] = text.replace("\u2581", " ").encode()
    return out


class Llguidance:
    def __init__(self, tok, n_vocab, eos):
        import llguidance
        self.llg = llguidance
        self.tokenizer = llguidance.LLTokenizer(tok.to_str(), n_vocab=n_vocab, eos_token=eos)
        self.eos = eos

    def start(self, schema):
        g = self.llg.LLMatcher.grammar_from_json_schema(json.dumps(schema))
        self.m = self.llg.LLMatcher(self.tokenizer, g, log_level=0)
        if self.m.is_error():
            raise ValueError(self.m.get_error())

    def mask(self, bits):
        self.m.unsafe_compute_mask_ptr(bits.ctypes.data, bits.nbytes)

    def consume(self, token) -> bool:
        return self.m.consume_token(token)

    def accepting(self) -> bool:
        return self.m.is_accepting()


class OutlinesCore:
    def __init__(self, tok, n_vocab, eos):
        import outlines_core
        self.oc = outlines_core
        by_bytes: dict[bytes, list[int]] = {}
        for i, b in token_bytes(tok).items():
            if i != eos:
                by_bytes.setdefault(b, []).append(i)
        self.vocabulary = outlines_core.Vocabulary(eos, by_bytes)
        self.n_vocab = n_vocab

    def start(self, schema):
        regex = self.oc.json_schema.build_regex_from_schema(json.dumps(schema))
        self.guide = self.oc.Guide(self.oc.Index(regex, self.vocabulary))

    def mask(self, bits):
        self.guide.write_mask_into(bits.ctypes.data, bits.size, 4)

    def consume(self, token) -> bool:
        try:
            self.guide.advance(token, return_tokens=False)
        except ValueError:
            return False
        return True

    def accepting(self) -> bool:
        return self.guide.is_finished()


class Xgrammar:
    def __init__(self, tok, n_vocab, eos):
        import xgrammar
        from transformers import PreTrainedTokenizerFast
        self.xgr = xgrammar
        info = xgrammar.TokenizerInfo.from_huggingface(PreTrainedTokenizerFast(tokenizer_object=tok),
                                                       vocab_size=n_vocab, stop_token_ids=[eos])
        self.compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self.eos = eos

    def start(self, schema):
        self.m = self.xgr.GrammarMatcher(self.compiler.compile_json_schema(json.dumps(schema)))

    def mask(self, bits):
        self.m.fill_next_token_bitmask(bits)

    def consume(self, token) -> bool:
        return self.m.accept_token(token)

    def accepting(self) -> bool:
        return self.m.accept_token(self.eos)


ENGINES = {"llguidance": Llguidance, "outlines-core": OutlinesCore, "xgrammar": Xgrammar}


def allowed(bits, token: int) -> bool:
    return bool((int(bits.reshape(-1)[token // 32]) >> (token % 32)) & 1)


def run_one(library: str, vocabulary: str, coverage: bool) -> dict:
    """One library on one vocabulary, in this process: its times, and the features it enforces."""
    tok, n_vocab, eos = hf_tokenizer(vocabulary)
    t = time.perf_counter()
    engine = ENGINES[library](tok, n_vocab, eos)
    tokenizer_s = time.perf_counter() - t
    if library == "xgrammar":
        bits = engine.xgr.allocate_token_bitmask(1, n_vocab)
    else:
        bits = np.zeros(-(-n_vocab // 32), dtype=np.int32)
    t = time.perf_counter()
    engine.start(SCHEMA)
    compile_s = time.perf_counter() - t
    tokens = tok.encode(DOCUMENT, add_special_tokens=False).ids
    spent = []
    for token in tokens:
        t = time.perf_counter()
        engine.mask(bits)
        ok = engine.consume(token)
        spent.append(time.perf_counter() - t)
        if not (ok and allowed(bits, token)):
            raise RuntimeError(f"{library} refused token {token} of a valid document")
    if not engine.accepting():
        raise RuntimeError(f"{library} does not accept the whole valid document")
    result = {"library": library, "version": version(library), "vocabulary": vocabulary, "n_vocab": n_vocab,
              "tokens": len(tokens), "tokenizer_s": tokenizer_s, "compile_s": compile_s,
              "median_ms": 1e3 * statistics.median(spent), "mean_ms": 1e3 * statistics.mean(spent),
              "max_ms": 1e3 * max(spent), "torch_loaded": "torch" in sys.modules}
    if coverage:
        result["coverage"] = {name: enforces(engine, tok, *case) for name, case in FEATURES.items()}
    return result


def walks(engine, tok, document: str) -> bool:
    """Whether the engine's constraint takes every token of document and then accepts it whole."""
    for token in tok.encode(document, add_special_tokens=False).ids:
        if not engine.consume(token):
            return False
    return engine.accepting()


def enforces(engine, tok, schema, good: str, bad: str) -> str:
    """"yes" (the schema compiles, good is taken, bad refused), "ignored" (bad taken too) or the error."""
    try:
        engine.start(schema)
        if not walks(engine, tok, good):
            return "refuses valid"
        engine.start(schema)
        return "ignored" if walks(engine, tok, bad) else "yes"
    except Exception as e:  # a library's own error type: what it says is the result
        return f"error: {str(e).splitlines()[0][:80]}"


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--libraries", nargs="*", default=list(LIBRARIES), choices=LIBRARIES)
    ap.add_argument("--vocabularies", nargs="*", default=["qwen2.5", "gemma3"], choices=["qwen2.5", "gemma3"])
    ap.add_argument("--coverage", action="store_true", help="also check the schema features (first vocabulary)")
    ap.add_argument("--one", nargs=2, help=argparse.SUPPRESS)  # a child process: LIBRARY VOCABULARY
    args = ap.parse_args()
    if args.one:
        print(json.dumps(run_one(*args.one, args.coverage)))
        return
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=os.path.dirname(__file__)).stdout.strip()
    print(f"# {cpu_name()}, {os.cpu_count()} cores, Python {platform.python_version()}, pyllm {commit}, one "
          f"thread each (llguidance and outlines-core mask on the calling thread; xgrammar max_threads=1)")
    print("| library | vocabulary | tokenizer ready s | schema ready s | mask+consume ms/token median | mean | max "
          "| torch imported |")
    print("|---|--:|--:|--:|--:|--:|--:|---|")
    covered = {}
    for library in args.libraries:
        for n, vocabulary in enumerate(args.vocabularies):
            cmd = [sys.executable, __file__, "--one", library, vocabulary]
            cmd += ["--coverage"] if args.coverage and n == 0 else []
            out = subprocess.run(cmd, capture_output=True, text=True)
            if out.returncode != 0:
                failure = out.stderr.strip().splitlines()[-1][:120]
                print(f"| {library} | {vocabulary} | failed: {failure} |||||", flush=True)
                continue
            r = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"| {library} {r['version']} | {r['n_vocab']:,} ({vocabulary}) | {r['tokenizer_s']:.2f} | "
                  f"{r['compile_s']:.3f} | {r['median_ms']:.3f} | {r['mean_ms']:.3f} | {r['max_ms']:.2f} | "
                  f"{'yes' if r['torch_loaded'] else 'no'} |", flush=True)
            covered.setdefault(library, r.get("coverage"))
    if args.coverage:
        names = [lib for lib in args.libraries if covered.get(lib)]
        print("\n| feature | " + " | ".join(names) + " |")
        print("|---|" + "---|" * len(names))
        for feature in FEATURES:
            print(f"| {feature} | " + " | ".join(covered[lib][feature] for lib in names) + " |")


if __name__ == "__main__":
    main()
