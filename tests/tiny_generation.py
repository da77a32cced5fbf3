"""An installed pyllm against a numpy Llama, with nothing but pyllm's own dependencies: the check a
freshly built wheel runs on its platform (cibuildwheel's test command, .ci/wheel).

It writes a seeded random Llama (f16 matrices, f32 norms) with safetensors' numpy API and a
byte-level BPE trained by `tokenizers`, loads it with pyllm, and compares with a float64 numpy
forward of the same weights: the logits of a prompt long enough for the BLAS prefill path, then
each token of a greedy generation (single-token decode steps over the KV cache), which must be the
reference's argmax. No torch, no transformers, no download.

    python tests/tiny_generation.py
"""
from __future__ import annotations

import gc
import json
import os
import shutil
import sys
import tempfile

import numpy as np
from safetensors.numpy import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

import pyllm
from pyllm import _core

CONFIG = dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=320, hidden_size=64,
              intermediate_size=160, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=10000.0, hidden_act="silu",
              bos_token_id=0, eos_token_id=1, tie_word_embeddings=False)
TEXT = ("The wheel is built once for each platform and installed where no compiler is found. "
        "Its core picks the widest vector instructions that the processor offers when it is imported, "
        "so the same file serves an old laptop and a new server. A small model made of random numbers "
        "cannot say anything true, but it can prove that every matrix product, every norm and every "
        "rotation gives the numbers that a slow and obvious program gives for the same weights. ")
PROMPT = "The wheel is built once"
# f32 accumulation in another order than float64's (the gap is ~1e-5 on logits of order 5)
TOLERANCE = 1e-3


def write_checkpoint(folder: str, seed: int = 0) -> dict[str, np.ndarray]:
    """config.json, model.safetensors and a tokenizer; returns the weights as float64."""
    c = CONFIG
    dim, ffn, hd = c["hidden_size"], c["intermediate_size"], c["hidden_size"] // c["num_attention_heads"]
    q_dim, kv_dim = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    rng = np.random.default_rng(seed)

    def matrix(rows: int, cols: int) -> np.ndarray:  # spread wide enough that a wrong kernel shows
        return (0.15 * rng.standard_normal((rows, cols))).astype(np.float16)

    def norm() -> np.ndarray:
        return (1 + 0.3 * rng.standard_normal(dim)).astype(np.float32)

    tensors = {"model.embed_tokens.weight": matrix(c["vocab_size"], dim),  # (vocab, dim)
               "model.norm.weight": norm(),                                # (dim,)
               "lm_head.weight": matrix(c["vocab_size"], dim)}             # (vocab, dim)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        tensors.update({p + "input_layernorm.weight": norm(),
                        p + "self_attn.q_proj.weight": matrix(q_dim, dim),   # (n_heads * head_dim, dim)
                        p + "self_attn.k_proj.weight": matrix(kv_dim, dim),  # (n_kv_heads * head_dim, dim)
                        p + "self_attn.v_proj.weight": matrix(kv_dim, dim),
                        p + "self_attn.o_proj.weight": matrix(dim, q_dim),
                        p + "post_attention_layernorm.weight": norm(),
                        p + "mlp.gate_proj.weight": matrix(ffn, dim),
                        p + "mlp.up_proj.weight": matrix(ffn, dim),
                        p + "mlp.down_proj.weight": matrix(dim, ffn)})
    save_file(tensors, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(c, f)

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=c["vocab_size"], special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([TEXT], trainer)
    tok.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True}, f)
    return {name: t.astype(np.float64) for name, t in tensors.items()}


def reference_logits(w: dict[str, np.ndarray], ids: list[int]) -> np.ndarray:
    """(len(ids), vocab) float64 logits of HF's Llama: RMSNorm, rotate-half RoPE, causal GQA, SwiGLU."""
    c = CONFIG
    n_heads, n_kv, eps = c["num_attention_heads"], c["num_key_value_heads"], c["rms_norm_eps"]
    hd = c["hidden_size"] // n_heads
    n = len(ids)

    def rmsnorm(x, weight):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * weight

    inv_freq = c["rope_theta"] ** (-np.arange(0, hd, 2) / hd)       # (head_dim / 2,)
    angles = np.arange(n)[:, None] * inv_freq[None, :]              # (n, head_dim / 2)
    cos, sin = np.cos(angles)[:, None, :], np.sin(angles)[:, None, :]

    def rope(x):  # (n, heads, head_dim): the first half of each head pairs with the second
        x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
        return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)

    causal = np.triu(np.full((n, n), -np.inf), 1)
    x = w["model.embed_tokens.weight"][ids]                          # (n, dim)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rmsnorm(x, w[p + "input_layernorm.weight"])
        q = rope((h @ w[p + "self_attn.q_proj.weight"].T).reshape(n, n_heads, hd))
        k = rope((h @ w[p + "self_attn.k_proj.weight"].T).reshape(n, n_kv, hd))
        v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(n, n_kv, hd)
        k, v = np.repeat(k, n_heads // n_kv, 1), np.repeat(v, n_heads // n_kv, 1)
        scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd) + causal
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        attn = np.einsum("hqk,khd->qhd", probs, v).reshape(n, n_heads * hd)
        x = x + attn @ w[p + "self_attn.o_proj.weight"].T
        h = rmsnorm(x, w[p + "post_attention_layernorm.weight"])
        gate, up = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ w[p + "mlp.down_proj.weight"].T
    return rmsnorm(x, w["model.norm.weight"]) @ w["lm_head.weight"].T


def check(folder: str, weights: dict[str, np.ndarray]) -> bool:
    """Logits of a prompt long enough for the BLAS prefill path, then a greedy generation from a
    short one (vector prefill, then single-token steps over the KV cache) token by token."""
    llm = pyllm.load(folder, threads=2)
    ids = llm.tokenize(TEXT)[:48]
    assert len(ids) > _core.BLAS_MIN_TOKENS, "the prompt must take the BLAS prefill path"
    want = reference_logits(weights, ids)
    diff = float(np.abs(llm.logits(ids) - want).max())
    print(f"  {'OK' if diff <= TOLERANCE else 'FAILED'}, maxdiff {diff:.2e}: logits of {len(ids)} tokens")

    out = llm.generate(PROMPT, max_tokens=8)
    prompt_ids = llm.tokenize(PROMPT)
    assert len(prompt_ids) < _core.BLAS_MIN_TOKENS and out.token_ids, (prompt_ids, out.token_ids)
    want = reference_logits(weights, prompt_ids + out.token_ids)[len(prompt_ids) - 1 : -1]
    chosen = want[np.arange(len(out.token_ids)), out.token_ids]
    gap = float((want.max(-1) - chosen).max())  # within the tolerance of the best: a tie, not an error
    # ascii(): random tokens decode to U+FFFD, which a Windows console's code page cannot print
    print(f"  {'OK' if gap <= TOLERANCE else 'FAILED'}, maxgap {gap:.2e}: greedy generation of "
          f"{len(out.token_ids)} tokens, {PROMPT!r} -> {ascii(out.text)}")
    return diff <= TOLERANCE and gap <= TOLERANCE


def main() -> int:
    print(f"pyllm {pyllm.__version__} from {os.path.dirname(pyllm.__file__)}")
    best = _core.best_isa()
    # every ISA this CPU runs (set_isa falls back to scalar for the others)
    isas = [isa for isa in _core.ISA_NAMES.values() if _core.set_isa(isa) == isa]
    ok = True
    folder = tempfile.mkdtemp(prefix="pyllm-tiny-")
    try:
        weights = write_checkpoint(folder)
        for isa in isas:
            _core.set_isa(isa)
            print(f"kernels: {isa}" + (" (the best this CPU runs)" if isa == best else ""))
            ok = check(folder, weights) and ok
    finally:
        _core.set_isa("best")
        gc.collect()  # the models' maps of the file: Windows deletes no file that is mapped
        shutil.rmtree(folder, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
