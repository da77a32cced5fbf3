"""Writes a GGUF of the SmolLM2-135M-Instruct bf16 Hugging Face folder, for benchmarking llama.cpp on
the same weights that pyllm re-encodes at load (`pyllm.load(folder, dtype="q8_0")`).

    python benchmarks/make_gguf.py                           # Q8_0 by gguf-py -> ~/.cache/pyllm/SmolLM2-135M-Instruct.Q8_0.gguf
    python benchmarks/make_gguf.py --llama-quantize q8_0     # f16 GGUF, then llama.cpp's own quantizer (preferred)
    python benchmarks/make_gguf.py --type f16 --out /tmp/smollm2.f16.gguf

Every metadata key/value (architecture, hyper-parameters, tokenizer.ggml.*, chat template, special ids)
is copied from a reference GGUF of the same model (the Q4_1 one the `smollm2` alias fetches), except
general.file_type, which is set to match the output. Every tensor of the reference is written under
the same name, shape and order, with data from the bf16 safetensors. As in llama.cpp's
convert_hf_to_gguf.py (`LlamaModel.permute`), the rows of q_proj and k_proj are permuted from the
Hugging Face rotate-half RoPE layout to GGML's interleaved one. Norms stay F32; matrices take --type.

Needs gguf, numpy, safetensors and torch (to read bf16); --llama-quantize needs llama-cpp-python.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import re
import sys
import tempfile

import numpy as np
import gguf
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter, LlamaFileType

CACHE = os.path.expanduser("~/.cache/pyllm")
DEFAULT_MODEL = os.path.join(CACHE, "smollm2-135m-instruct-bf16")
DEFAULT_REFERENCE = next(
    (p for p in (os.path.join(CACHE, "SmolLM2-135M-Instruct.Q4_1.gguf"),
                 os.path.join(CACHE, "smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")) if os.path.exists(p)),
    os.path.join(CACHE, "SmolLM2-135M-Instruct.Q4_1.gguf"))
DEFAULT_OUT = os.path.join(CACHE, "SmolLM2-135M-Instruct.Q8_0.gguf")

# --type: (tensor type of the matrices, general.file_type)
TYPES = {
    "q8_0": (GGMLQuantizationType.Q8_0, LlamaFileType.MOSTLY_Q8_0),
    "f16": (GGMLQuantizationType.F16, LlamaFileType.MOSTLY_F16),
    "bf16": (GGMLQuantizationType.BF16, LlamaFileType.MOSTLY_BF16),
    "f32": (GGMLQuantizationType.F32, LlamaFileType.ALL_F32),
}

_GLOBAL = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def hf_name(name: str) -> str:
    """The Hugging Face tensor name of a GGUF llama tensor name."""
    if name in _GLOBAL:
        return _GLOBAL[name]
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)\.weight", name)
    if not m or m.group(2) not in _BLOCK:
        raise KeyError(f"no Hugging Face name for GGUF tensor {name!r}")
    return f"model.layers.{m.group(1)}.{_BLOCK[m.group(2)]}.weight"


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's LlamaModel.permute: rotate-half (HF) rows -> interleaved pairs (GGML) per head."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2)
            .reshape(w.shape))


def _field_value(field):
    """(value, type, sub_type) of a reader field, strings kept as raw bytes so nothing is re-encoded."""
    vtype = field.types[0]
    if vtype == GGUFValueType.ARRAY:
        sub = field.types[1]
        if sub == GGUFValueType.STRING:
            val = [bytes(field.parts[i]) for i in field.data]
        else:
            val = [field.parts[i].tolist()[0] for i in field.data]
        return val, vtype, sub
    if vtype == GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]), vtype, None
    return field.parts[field.data[0]].tolist()[0], vtype, None


def load_hf(folder: str) -> dict[str, np.ndarray]:
    """float32 numpy arrays of every tensor in the folder's *.safetensors (bf16 -> f32 is exact)."""
    from safetensors import safe_open
    out = {}
    files = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {folder}")
    for f in files:
        with safe_open(os.path.join(folder, f), framework="pt") as st:
            for k in st.keys():
                out[k] = st.get_tensor(k).float().numpy()
    return out


def write_gguf(model: str, reference: str, out: str, type_name: str) -> None:
    qtype, file_type = TYPES[type_name]
    ref = GGUFReader(reference)
    arch = ref.fields["general.architecture"].contents()
    n_head = int(ref.fields[f"{arch}.attention.head_count"].contents())
    n_head_kv = int(ref.fields[f"{arch}.attention.head_count_kv"].contents())
    hf = load_hf(model)

    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    w = GGUFWriter(out, arch)  # writes general.architecture itself
    for key, field in ref.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        if key == "general.file_type":
            w.add_uint32(key, int(file_type))
            continue
        val, vtype, sub = _field_value(field)
        w.add_key_value(key, val, vtype, sub_type=sub)
    if "general.file_type" not in ref.fields:
        w.add_uint32("general.file_type", int(file_type))

    for t in ref.tensors:
        src = hf_name(t.name)
        if src not in hf:
            raise KeyError(f"{t.name}: {src} is not in {model}")
        data = hf[src]
        shape = tuple(int(d) for d in reversed(t.shape))  # GGUF lists ne (innermost first)
        if data.shape != shape:
            raise ValueError(f"{t.name}: reference shape {shape} but {src} is {data.shape}")
        if t.name.endswith("attn_q.weight"):
            data = permute(data, n_head)
        elif t.name.endswith("attn_k.weight"):
            data = permute(data, n_head_kv)
        data = np.ascontiguousarray(data, dtype=np.float32)
        if data.ndim == 1:  # norms stay F32, as llama.cpp's converter keeps them
            w.add_tensor(t.name, data)
        elif qtype in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
            w.add_tensor(t.name, gguf.quants.quantize(data, qtype))
        else:
            w.add_tensor(t.name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def llama_quantize(src: str, dst: str, type_name: str, threads: int, verbose: bool = False) -> None:
    import llama_cpp
    try:  # llama.cpp logs every tensor it converts; keep only errors unless --verbose
        from llama_cpp._logger import set_verbose
        set_verbose(verbose)
    except ImportError:
        pass
    ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{type_name.upper()}", None)
    if ftype is None:
        raise SystemExit(f"llama_cpp has no LLAMA_FTYPE_MOSTLY_{type_name.upper()}")
    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = threads
    rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params))
    if rc != 0:
        raise SystemExit(f"llama_model_quantize({src} -> {dst}, {type_name}) failed: {rc}")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=DEFAULT_MODEL, help="Hugging Face folder with bf16 *.safetensors")
    p.add_argument("--reference", default=DEFAULT_REFERENCE,
                   help="GGUF of the same model whose metadata and tensor list are copied")
    p.add_argument("--out", default=DEFAULT_OUT)
    p.add_argument("--type", default="q8_0", choices=sorted(TYPES),
                   help="type of the matrices when gguf-py writes them (norms stay f32)")
    p.add_argument("--llama-quantize", metavar="TYPE",
                   help="write an --intermediate GGUF, then quantize it with llama.cpp's own "
                        "llama_model_quantize to TYPE (q8_0, q4_0, ...); overrides --type")
    p.add_argument("--intermediate", default="f16", choices=sorted(TYPES),
                   help="type of the GGUF given to llama.cpp's quantizer (default f16)")
    p.add_argument("--threads", type=int, default=2, help="threads for llama.cpp's quantizer")
    p.add_argument("--verbose", action="store_true", help="show llama.cpp's quantizer log")
    a = p.parse_args(argv)
    out = os.path.abspath(os.path.expanduser(a.out))

    if a.llama_quantize:
        fd, tmp = tempfile.mkstemp(suffix=f".{a.intermediate}.gguf", dir=os.path.dirname(out) or ".")
        os.close(fd)
        try:
            write_gguf(a.model, a.reference, tmp, a.intermediate)
            llama_quantize(tmp, out, a.llama_quantize, a.threads, a.verbose)
        finally:
            os.unlink(tmp)
        how = f"llama.cpp quantize {a.intermediate} -> {a.llama_quantize}"
    else:
        write_gguf(a.model, a.reference, out, a.type)
        how = f"gguf-py {a.type}"
    print(f"wrote {out} ({os.path.getsize(out) / 2**20:.1f} MiB, {how})")


if __name__ == "__main__":
    main(sys.argv[1:])
