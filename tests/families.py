"""Tiny seeded random checkpoints of every model family pyllm reads, and llama.cpp's own GGUF converter.

Each family is a row in FAMILIES: its transformers classes, small shapes (odd FFN and vocabulary sizes, head
sizes that are not powers of two), the quirks worth exercising (GQA, explicit head_dim, sliding windows,
soft-caps, rope variants, biases) and a tokenizer that llama.cpp's `convert_hf_to_gguf.py` accepts for that
family:

- SentencePiece families (Llama, Mistral, Phi-3, Gemma 1-3) get a real `tokenizer.model`, a small BPE trained
  on the GPL-3 text (the converter reads nothing else for them), beside the equivalent `tokenizer.json`.
- Byte-level BPE families (GPT-2, Qwen 2/3) must carry a tokenizer whose encoding of a fixed probe text
  hashes to a value the converter knows: a hash of token ids, so no small trained vocabulary can pass. They
  get the real GPT-2 and Qwen2 vocabularies, rebuilt from the vocab-only GGUF files llama.cpp ships in the
  same sdist (`models/ggml-vocab-*.gguf`).

The converter ships inside the llama-cpp-python sdist; it is fetched once through pip into the tests'
cache (`$PYLLM_CACHE`, which conftest.py sets to `$PYLLM_TEST_CACHE` or ~/.cache/pyllm-tests) and never
vendored here.
"""
from __future__ import annotations

import glob
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass, field

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
TEXT_PATH = "/usr/share/common-licenses/GPL-3"

# llama.cpp's name for each family (`general.architecture`); Mistral converts to plain llama.
GGUF_ARCH = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma": "gemma",
             "gemma2": "gemma2", "gemma3": "gemma3", "phi3": "phi3", "gpt2": "gpt2"}


def cache_dir() -> str:
    return os.path.expanduser(os.environ.get("PYLLM_CACHE") or "~/.cache/pyllm")


# ---------------------------------------------------------------------------------------------------------
# llama.cpp's converter


def _llama_cpp_sdist() -> str:
    """The llama-cpp-python sdist in the cache, downloaded through pip when absent."""
    folder = os.path.join(cache_dir(), "sdist")
    target = os.path.join(folder, f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}.tar.gz")
    if os.path.isfile(target):
        return target
    os.makedirs(folder, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=folder, prefix=".download-")
    try:
        # Only this package from source: `--no-binary :all:` would also build its build dependencies (cmake)
        # from source just to read the sdist's metadata.
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-python",
               f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}", "-d", tmp]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        found = glob.glob(os.path.join(tmp, "llama_cpp_python-*.tar.gz"))
        if proc.returncode != 0 or not found:
            raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        os.replace(found[0], target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def llama_cpp_converter() -> str:
    """Path of llama.cpp's `convert_hf_to_gguf.py` in an unpacked llama-cpp-python sdist in the cache.

    Downloads and unpacks the sdist on first use (unpacked beside, then renamed into place, so a crash or a
    concurrent caller never leaves a half-unpacked copy behind).

    >>> script = llama_cpp_converter()   # doctest: +SKIP
    >>> os.path.basename(script)         # doctest: +SKIP
    'convert_hf_to_gguf.py'
    """
    root = os.path.join(cache_dir(), f"llama-cpp-python-{LLAMA_CPP_PYTHON_VERSION}")
    script = os.path.join(root, "vendor", "llama.cpp", "convert_hf_to_gguf.py")
    if os.path.isfile(script):
        return script
    sdist = _llama_cpp_sdist()
    tmp = tempfile.mkdtemp(dir=cache_dir(), prefix=".unpack-")
    try:
        with tarfile.open(sdist) as tar:
            if hasattr(tarfile, "data_filter"):
                tar.extractall(tmp, filter="data")
            else:
                tar.extractall(tmp)
        try:
            os.rename(os.path.join(tmp, f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}"), root)
        except OSError:
            if not os.path.isfile(script):  # not a concurrent caller that got there first
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return script


def convert_to_gguf(folder: str, outfile: str, outtype: str = "f32") -> str:
    """Converts a Hugging Face folder with llama.cpp's converter; returns `outfile`.

    Runs with the current Python; the sdist's own `gguf-py` comes first on PYTHONPATH because the converter
    is written against it (it would also put it first itself). Raises with the converter's stderr on failure.

    >>> convert_to_gguf(make_family_checkpoint(d, "llama"), d + "/m.gguf", "f16")   # doctest: +SKIP
    """
    if outtype not in ("f32", "f16", "bf16", "q8_0"):
        raise ValueError(f"outtype must be f32, f16, bf16 or q8_0, not {outtype!r}")
    script = llama_cpp_converter()
    env = dict(os.environ)
    env.pop("NO_LOCAL_GGUF", None)
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(os.path.dirname(script), "gguf-py")] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    outfile = os.path.abspath(outfile)
    tmp = f"{outfile}.{os.getpid()}.partial"
    cmd = [sys.executable, script, os.path.abspath(folder), "--outfile", tmp, "--outtype", outtype]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0 or not os.path.isfile(tmp):
        if os.path.exists(tmp):
            os.remove(tmp)
        raise RuntimeError(f"convert_hf_to_gguf.py failed ({proc.returncode}) on {folder}:\n{proc.stderr}")
    os.replace(tmp, outfile)
    return outfile


# ---------------------------------------------------------------------------------------------------------
# Tokenizers


def _english_lines() -> list[str]:
    with open(TEXT_PATH, encoding="utf-8") as f:
        return f.read().splitlines()


def _save_spm_tokenizer(folder: str, kind: str, vocab_size: int) -> dict:
    """Trains a SentencePiece BPE on the GPL-3 and saves it as `tokenizer.model` and, through transformers,
    as `tokenizer.json`; returns the config's special-token ids."""
    import sentencepiece as spm
    import transformers
    from tokenizers import decoders, normalizers
    from transformers.tokenization_utils_base import generate_merges

    if kind == "gemma":  # Gemma's layout: <pad> 0, <eos> 1, <bos> 2, <unk> 3, no dummy prefix
        ids = dict(pad_id=0, eos_id=1, bos_id=2, unk_id=3, pad_piece="<pad>", eos_piece="<eos>",
                   bos_piece="<bos>", unk_piece="<unk>", add_dummy_prefix=False, control_symbols=["<mask>"])
    else:  # Llama 2 / Mistral / Phi-3: <unk> 0, <s> 1, </s> 2, a dummy prefix space
        ids = dict(unk_id=0, bos_id=1, eos_id=2, pad_id=-1, add_dummy_prefix=True)
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(_english_lines()), model_writer=model, model_type="bpe", vocab_size=vocab_size,
        byte_fallback=True, split_digits=True, normalization_rule_name="identity", remove_extra_whitespaces=False,
        allow_whitespace_only_pieces=True, character_coverage=1.0, num_threads=1, minloglevel=2, **ids)
    with open(os.path.join(folder, "tokenizer.model"), "wb") as f:
        f.write(model.getvalue())

    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
    merges = generate_merges(vocab, {p: sp.get_score(i) for p, i in vocab.items()})
    if kind == "gemma":
        tok = transformers.GemmaTokenizer(vocab=vocab, merges=merges, add_bos_token=True)
        special = dict(pad_token_id=0, eos_token_id=1, bos_token_id=2)
    else:
        tok = transformers.LlamaTokenizer(vocab=vocab, merges=merges, add_bos_token=True)
        special = dict(bos_token_id=1, eos_token_id=2)
        # The pipeline of the tokenizer.json files Llama 2, Mistral and Phi-3 ship, which encodes exactly as
        # SentencePiece (and llama.cpp) does. transformers 5 would write Metaspace(prepend_scheme="first"),
        # which adds no "▁" before a text that already starts with a space.
        backend = tok.backend_tokenizer
        backend.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        backend.pre_tokenizer = None
        backend.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                             decoders.Strip(" ", 1, 0)])
    if kind == "phi3":  # Phi-3's <|endoftext|> (its eos and pad) and chat tokens follow the SentencePiece vocabulary
        tok.add_special_tokens({"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"})
        tok.add_tokens(["<|assistant|>", "<|system|>", "<|end|>", "<|user|>"], special_tokens=True)
        special = dict(bos_token_id=1, eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id)
    tok.save_pretrained(folder)
    special["vocab_size"] = len(tok)
    return special


def _ggml_vocab(name: str) -> tuple[list[str], list[int], list[str]]:
    """Tokens, token types and merges of one of the vocab-only GGUF files llama.cpp ships."""
    from gguf import GGUFReader

    reader = GGUFReader(os.path.join(os.path.dirname(llama_cpp_converter()), "models", f"ggml-vocab-{name}.gguf"))

    def strings(key):
        f = reader.fields[key]
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]

    types = reader.fields["tokenizer.ggml.token_type"]
    return (strings("tokenizer.ggml.tokens"), [int(types.parts[i][0]) for i in types.data],
            strings("tokenizer.ggml.merges"))


def _bpe_tokenizer_files(kind: str) -> str:
    """A cached folder with the real GPT-2 or Qwen2 byte-level BPE saved through transformers' own tokenizer
    class, and `special.json`, the config entries that go with it. Built once: reading the vocabulary takes
    GGUFReader seconds."""
    target = os.path.join(cache_dir(), "tokenizers", f"{kind}-llama-cpp-python-{LLAMA_CPP_PYTHON_VERSION}")
    if os.path.isfile(os.path.join(target, "special.json")):
        return target
    import transformers

    tokens, types, merges = _ggml_vocab({"gpt2": "gpt-2", "qwen2": "qwen2"}[kind])
    normal = {t: i for i, (t, ty) in enumerate(zip(tokens, types)) if ty == 1}
    control = [(i, t) for i, (t, ty) in enumerate(zip(tokens, types)) if ty == 3]
    merges = [tuple(m.split(" ")) for m in merges]
    if kind == "gpt2":  # <|endoftext|> (50256) is both bos and eos, as in GPT-2's own config
        tok = transformers.GPT2Tokenizer(vocab={**normal, **{t: i for i, t in control}}, merges=merges)
    else:  # Qwen's specials follow its BPE vocabulary as added tokens; no bos is ever added
        tok = transformers.Qwen2Tokenizer(vocab=normal, merges=merges)
        tok.add_tokens([t for _, t in control], special_tokens=True)
    if [tok.convert_tokens_to_ids(t) for _, t in control] != [i for i, _ in control]:
        raise AssertionError(f"{kind}: special tokens did not keep llama.cpp's ids")
    eos = tok.convert_tokens_to_ids("<|endoftext|>")
    # the config's vocabulary covers llama.cpp's whole list, padding included (Qwen: 151936 > 151646 used)
    special = dict(bos_token_id=eos, eos_token_id=eos, vocab_size=len(tokens))
    os.makedirs(os.path.dirname(target), exist_ok=True)
    tmp = tempfile.mkdtemp(dir=os.path.dirname(target), prefix=".build-")
    try:
        tok.save_pretrained(tmp)
        with open(os.path.join(tmp, "special.json"), "w") as f:
            json.dump(special, f)
        try:
            os.rename(tmp, target)
        except OSError:
            if not os.path.isfile(os.path.join(target, "special.json")):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _save_bpe_tokenizer(folder: str, kind: str) -> dict:
    """Copies the real GPT-2 or Qwen2 tokenizer into `folder`; returns the config's special-token ids."""
    source = _bpe_tokenizer_files(kind)
    for name in os.listdir(source):
        if name != "special.json":
            shutil.copy(os.path.join(source, name), folder)
    with open(os.path.join(source, "special.json")) as f:
        return json.load(f)


# ---------------------------------------------------------------------------------------------------------
# Families


@dataclass(frozen=True)
class Family:
    config: str                     # transformers config class
    model: str                      # transformers causal-LM class
    tokenizer: str                  # llama | phi3 | gemma (SentencePiece), gpt2 | qwen2 (byte-level BPE)
    settings: dict = field(default_factory=dict)
    norm_offset: bool = False       # RMSNorm multiplies by (1 + w): draw w around 0, not 1


_COMMON = dict(num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)

FAMILIES: dict[str, Family] = {
    "llama": Family("LlamaConfig", "LlamaForCausalLM", "llama", dict(
        _COMMON, hidden_size=72, intermediate_size=171, rms_norm_eps=1e-5, tie_word_embeddings=False)),
    "mistral": Family("MistralConfig", "MistralForCausalLM", "llama", dict(
        _COMMON, hidden_size=80, intermediate_size=187, sliding_window=8, rms_norm_eps=1e-5,
        tie_word_embeddings=False)),
    "qwen2": Family("Qwen2Config", "Qwen2ForCausalLM", "qwen2", dict(
        _COMMON, hidden_size=88, intermediate_size=203, rms_norm_eps=1e-6, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0})),
    "qwen3": Family("Qwen3Config", "Qwen3ForCausalLM", "qwen2", dict(
        _COMMON, hidden_size=64, head_dim=24, intermediate_size=179, rms_norm_eps=1e-6, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0})),
    "gemma": Family("GemmaConfig", "GemmaForCausalLM", "gemma", dict(
        _COMMON, hidden_size=64, head_dim=24, intermediate_size=181, rms_norm_eps=1e-6, tie_word_embeddings=True,
        hidden_act="gelu_pytorch_tanh"), norm_offset=True),
    "gemma2": Family("Gemma2Config", "Gemma2ForCausalLM", "gemma", dict(
        _COMMON, hidden_size=72, head_dim=20, intermediate_size=175, rms_norm_eps=1e-6, tie_word_embeddings=True,
        query_pre_attn_scalar=32, sliding_window=8,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        # these random weights give attention scores up to ~7 and final logits up to ~8: caps that bend them
        attn_logit_softcapping=6.0, final_logit_softcapping=8.0), norm_offset=True),
    "gemma3": Family("Gemma3TextConfig", "Gemma3ForCausalLM", "gemma", dict(
        _COMMON, hidden_size=64, head_dim=24, intermediate_size=185, rms_norm_eps=1e-6, tie_word_embeddings=True,
        query_pre_attn_scalar=20, sliding_window=8,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                         "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0}}),
        norm_offset=True),
    "phi3": Family("Phi3Config", "Phi3ForCausalLM", "phi3", dict(
        _COMMON, hidden_size=80, intermediate_size=173, rms_norm_eps=1e-5, tie_word_embeddings=False,
        original_max_position_embeddings=256)),
    "gpt2": Family("GPT2Config", "GPT2LMHeadModel", "gpt2", dict(
        # n_ctx: GPT-2's own config.json carries it beside n_positions, and llama.cpp's converter reads it
        n_embd=72, n_layer=3, n_head=4, n_positions=128, n_ctx=128, layer_norm_epsilon=1e-5,
        activation_function="gelu_new", tie_word_embeddings=True)),
}

SPM_VOCAB_SIZE = 419

# What a GGUF from llama.cpp's converter cannot say, and llama.cpp assumes instead. With these overrides the
# converted file describes the same function as the Hugging Face folder (llama.cpp's logits then match
# transformers'); without them it does not:
# - Mistral converts to plain llama, and no sliding window is written.
# - Gemma 2/3 files carry no query_pre_attn_scalar: llama.cpp scales scores by head_dim^-0.5 (hidden/heads
#   for the 27B sizes only).
# - Gemma 2/3 files carry no layer pattern: llama.cpp makes every 2nd (Gemma 2) or 6th (Gemma 3) layer full,
#   the rest sliding. Gemma 2's default layer_types already alternate; Gemma 3 needs six layers to mix both.
GGUF_EXACT_OVERRIDES: dict[str, dict] = {
    "mistral": dict(sliding_window=None),
    "gemma2": dict(query_pre_attn_scalar=FAMILIES["gemma2"].settings["head_dim"]),
    "gemma3": dict(query_pre_attn_scalar=FAMILIES["gemma3"].settings["head_dim"], num_hidden_layers=6,
                   layer_types=["sliding_attention"] * 5 + ["full_attention"]),
}


def phi3_longrope(original_max_position_embeddings: int = 64, max_position_embeddings: int = 256,
                  seed: int = 0) -> dict:
    """Overrides that give the tiny Phi-3 a LongRoPE scaling (Phi-3-*-128k style): short and long factors,
    one per rotary pair, and a context four times the original one. transformers switches to the long factors
    for sequences longer than the original context; llama.cpp whenever its context is longer.

    >>> make_family_checkpoint(d, "phi3", **phi3_longrope())   # doctest: +SKIP
    """
    import numpy as np

    settings = FAMILIES["phi3"].settings
    head_dim = settings["hidden_size"] // settings["num_attention_heads"]
    rng = np.random.default_rng(seed)
    short = np.round(1.0 + 0.1 * rng.random(head_dim // 2), 4)
    long = np.round(np.linspace(1.0, 12.0, head_dim // 2) * (1.0 + 0.1 * rng.random(head_dim // 2)), 4)
    return dict(max_position_embeddings=max_position_embeddings,
                original_max_position_embeddings=original_max_position_embeddings,
                rope_parameters={"rope_type": "longrope", "rope_theta": 10_000.0,
                                 "short_factor": short.tolist(), "long_factor": long.tolist()})


def make_family_checkpoint(folder: str, family: str, seed: int = 0, **overrides) -> str:
    """Saves a tiny seeded random `family` model as bf16 safetensors (`save_pretrained`) with its tokenizer.

    Weights and biases are redrawn ~ N(0, 0.15²), norm weights ~ 1 ± 0.3 (Gemma's (1 + w) norms: w ~ 0 ± 0.3),
    LayerNorm biases ~ 0 ± 0.1: transformers' own init (std 0.02, norms 1) hides mistakes. `overrides` go to
    the transformers config.

    >>> make_family_checkpoint(tmp_path, "gemma3", seed=1, sliding_window=4)   # doctest: +SKIP
    """
    import torch
    import transformers

    spec = FAMILIES[family]
    os.makedirs(folder, exist_ok=True)
    if spec.tokenizer in ("gpt2", "qwen2"):
        special = _save_bpe_tokenizer(folder, spec.tokenizer)
    else:
        special = _save_spm_tokenizer(folder, spec.tokenizer, SPM_VOCAB_SIZE)
    if spec.tokenizer == "phi3":  # Phi-3 pads its embedding past the tokenizer (32011 tokens, 32064 rows)
        special["vocab_size"] = -(-special["vocab_size"] // 32) * 32
    settings = dict(spec.settings, **special)
    settings.update(overrides)
    torch.manual_seed(seed)
    config = getattr(transformers, spec.config)(**settings)
    model = getattr(transformers, spec.model)(config)
    with torch.no_grad():
        norms = {id(m) for m in model.modules()
                 if isinstance(m, torch.nn.LayerNorm) or type(m).__name__.endswith("RMSNorm")}
        for module in model.modules():
            for name, p in module.named_parameters(recurse=False):
                if id(module) in norms and name == "weight":
                    p.copy_((0.0 if spec.norm_offset else 1.0) + 0.3 * torch.randn_like(p))
                elif id(module) in norms:
                    p.normal_(0.0, 0.1)
                else:
                    p.normal_(0.0, 0.15)
    model.to(torch.bfloat16).save_pretrained(folder)
    return folder


# ---------------------------------------------------------------------------------------------------------
# The contract's cases


@dataclass(frozen=True)
class Case:
    family: str
    overrides: dict = field(default_factory=dict)
    gguf: bool = False      # llama.cpp's converter writes a file of the same function (GGUF_EXACT_OVERRIDES)
    tol: float = 1e-4       # the largest logit difference from transformers


def _phi3_longrope_partial_window() -> dict:
    """LongRoPE on 12 of the 20 dims of each head (6 factor pairs) and an 8-token window."""
    overrides = phi3_longrope(seed=1)
    rope = overrides["rope_parameters"]
    rope.update(partial_rotary_factor=0.6, short_factor=rope["short_factor"][:6], long_factor=rope["long_factor"][:6])
    return dict(overrides, sliding_window=8)


# Every family's variants that tests/test_family_contract.py holds to transformers: each row a checkpoint
# (family, transformers config overrides) that exercises one of the family's differences.
CASES: dict[str, Case] = {
    "llama_gqa_untied": Case("llama", {}, gguf=True, tol=1e-3),
    "llama_tied_embeddings": Case("llama", {"tie_word_embeddings": True}, tol=1e-3),
    "llama_multi_head_attention": Case("llama", {"num_key_value_heads": 4}, tol=1e-3),
    "llama3_rope_scaling": Case("llama", {"rope_parameters": {
        "rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64}}, tol=1e-3),
    "llama_linear_rope_scaling": Case("llama", {"rope_parameters": {
        "rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}}, tol=1e-3),
    "mistral_sliding_window": Case("mistral", {"sliding_window": 8}, tol=1e-3),
    "gemma_gqa_tied": Case("gemma", {}, gguf=True),
    "gemma_mqa": Case("gemma", {"num_key_value_heads": 1}),
    "gemma_untied_attention_bias": Case("gemma", {"tie_word_embeddings": False, "attention_bias": True}),
    "gemma2_gqa_soft_caps_window_8": Case("gemma2", {}),
    "gemma2_mqa": Case("gemma2", {"num_key_value_heads": 1}),
    "gemma2_head_dim_scale_as_gguf_states": Case("gemma2", GGUF_EXACT_OVERRIDES["gemma2"], gguf=True),
    "gemma3_gqa_two_ropes_window_8": Case("gemma3", {}),
    "gemma3_mqa_untied_final_soft_cap": Case("gemma3", {"num_key_value_heads": 1, "tie_word_embeddings": False,
                                                        "final_logit_softcapping": 8.0}),
    "gemma3_six_layers_as_gguf_states": Case("gemma3", GGUF_EXACT_OVERRIDES["gemma3"], gguf=True),
    "qwen2_gqa_tied_qkv_bias": Case("qwen2", {}, gguf=True),
    "qwen2_mqa_untied": Case("qwen2", {"num_key_value_heads": 1, "tie_word_embeddings": False}, gguf=True),
    # layers >= max_window_layers slide; the converter writes no window for qwen2
    "qwen2_sliding_window_above_max_window_layers": Case(
        "qwen2", {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 1}),
    "qwen3_gqa_tied_qk_norm_head_dim_24": Case("qwen3", {}, gguf=True),
    "qwen3_mqa_untied_attention_bias": Case(
        "qwen3", {"num_key_value_heads": 1, "tie_word_embeddings": False, "attention_bias": True}, gguf=True),
    "qwen3_sliding_window_above_max_window_layers": Case(
        "qwen3", {"use_sliding_window": True, "sliding_window": 6, "max_window_layers": 2}),
    "phi3_gqa_untied": Case("phi3", {}, gguf=True),
    "phi3_mqa_tied_partial_rotary": Case("phi3", {
        "num_key_value_heads": 1, "tie_word_embeddings": True,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.6}},
        gguf=True),
    "phi3_longrope_short_factors": Case("phi3", phi3_longrope(), gguf=True),
    "phi3_longrope_partial_rotary_sliding_window": Case("phi3", _phi3_longrope_partial_window(), gguf=True),
    # families.py's GPT-2: n_embd 72, 4 heads, 128 positions, tied head
    "gpt2_tied_head": Case("gpt2", {}, gguf=True),
    "gpt2_odd_width_untied_head": Case(
        "gpt2", dict(n_embd=45, n_head=5, n_positions=64, n_ctx=64, tie_word_embeddings=False), gguf=True),
    # scores unscaled (no 1/sqrt(head_dim)), the upcast/reordered attention path, an odd n_inner, the other
    # spelling of tanh GELU. llama.cpp's converter writes feed_forward_length = 4·n_embd and nothing about
    # scale_attn_weights: a GGUF of it would describe another model.
    "gpt2_unscaled_upcast_attention_odd_inner": Case("gpt2", dict(
        scale_attn_weights=False, reorder_and_upcast_attn=True, n_inner=97,
        activation_function="gelu_pytorch_tanh", n_positions=64, n_ctx=64)),
}
