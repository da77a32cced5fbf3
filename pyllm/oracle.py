"""transformers as the oracle: the same intermediates Model.trace captures, taken from a transformers
model by hooks, in pyllm.trace's shapes. Needs torch and transformers (and gguf for a .gguf file):
the `verify` extra.

Where each point is read in transformers' modules (the norms by the names each family's file gives):
attention's q/k/v and probabilities from the family's eager attention function as it is called;
the norms' and MLP's outputs from forward hooks; the residual after attention from the input of
the MLP's norm; embed from output_hidden_states[0].
"""
from __future__ import annotations

import os
import sys
from contextlib import ExitStack, contextmanager

import numpy as np

from .arch import hf_norm_layouts
from .errors import PyllmError
from .trace import LAYER_CAPTURES

EXTRA_HINT = ('verify needs transformers and torch: pip install "pyllm[verify]" (install torch first, '
              'pinned to a CPU build, if pip would otherwise fetch a CUDA one)')


def _import():
    try:
        import torch
        import transformers
    except ImportError as e:
        raise PyllmError(f"{EXTRA_HINT} ({e})") from None
    return torch, transformers


def load_reference(path: str):
    """transformers' float32 model of a folder or a .gguf file (dequantized), eager attention so
    that probabilities exist."""
    torch, transformers = _import()
    kwargs = dict(dtype=torch.float32, attn_implementation="eager")
    try:
        if os.path.isdir(path):
            model = transformers.AutoModelForCausalLM.from_pretrained(path, **kwargs)
        else:
            folder, name = os.path.split(os.path.abspath(path))
            model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, **kwargs)
    except ImportError as e:
        raise PyllmError(f"{EXTRA_HINT} ({e})") from None
    except (OSError, ValueError, KeyError) as e:
        raise PyllmError(f"transformers cannot load {path}: {e}") from None
    return model.eval()


def _first(module, *names):
    for name in names:
        if hasattr(module, name):
            return getattr(module, name)
    return None


def _parts(model):
    """(decoder layers, final norm) of a causal LM."""
    base = model.base_model
    layers, norm = _first(base, "layers", "h"), _first(base, "norm", "ln_f")
    if layers is None or norm is None:
        raise PyllmError(f"cannot find the decoder layers of transformers' {type(model).__name__}")
    return layers, norm


def _layer_modules(layer) -> dict:
    """The submodules of a decoder layer whose outputs (or input) are trace points; the norms by the
    names a family of pyllm/arch/ gives them (HF_NORMS)."""
    names = next((n for n in hf_norm_layouts() if all(hasattr(layer, a) for a in n.values())), None)
    if names is None:
        raise PyllmError(f"cannot find the norms of transformers' {type(layer).__name__}")
    mods = {"attn": _first(layer, "self_attn", "attn"), "mlp": layer.mlp, "attn_post": None, "mlp_post": None}
    return {**mods, **{point: getattr(layer, name) for point, name in names.items()}}


def _array(t) -> np.ndarray:
    if isinstance(t, (tuple, list)):
        t = t[0]
    return t.detach().to("cpu").float().numpy()[0]


@contextmanager
def _attention_recorded(attn_modules, record):
    """Wraps the eager attention function of each attention module's modeling file, recording
    (layer, query, key, value, probabilities) of every call."""
    originals = {}
    for attn in attn_modules:
        mod = sys.modules[type(attn).__module__]
        if mod.__name__ in originals:
            continue
        if not hasattr(mod, "eager_attention_forward"):
            raise PyllmError(f"{mod.__name__} has no eager_attention_forward to trace")
        original = mod.eager_attention_forward
        originals[mod.__name__] = (mod, original)

        def wrapped(module, query, key, value, *args, _original=original, **kwargs):
            out, weights = _original(module, query, key, value, *args, **kwargs)
            record(module.layer_idx, query, key, value, weights)
            return out, weights
        mod.eager_attention_forward = wrapped
    try:
        yield
    finally:
        for mod, original in originals.values():
            mod.eager_attention_forward = original


def reference_trace(model, ids: list[int], layers: list[int], capture) -> dict[str, np.ndarray]:
    """The captures of pyllm.trace, from transformers' model run on ids."""
    torch, _ = _import()
    decoder_layers, final_norm = _parts(model)
    got: dict[str, dict[int, np.ndarray]] = {name: {} for name in LAYER_CAPTURES}
    traced = set(layers)

    def record_attention(layer, query, key, value, weights):
        if layer in traced:
            got["q"][layer] = _array(query).transpose(1, 0, 2)
            got["k"][layer] = _array(key).transpose(1, 0, 2)
            got["v"][layer] = _array(value).transpose(1, 0, 2)
            got["attn"][layer] = _array(weights)

    def output_hook(name, layer):
        def hook(module, args, output):
            got[name][layer] = _array(output)
        return hook

    def input_hook(name, layer):
        def hook(module, args):
            got[name][layer] = _array(args[0])
        return hook

    final = {}
    with ExitStack() as stack:
        # only eager attention computes probabilities (and calls the function recorded below)
        previous = model.config._attn_implementation
        if previous != "eager":
            model.set_attn_implementation("eager")
            stack.callback(model.set_attn_implementation, previous)
        handles = []
        for l in layers:
            layer = decoder_layers[l]
            mods = _layer_modules(layer)
            handles.append(mods["attn_norm"].register_forward_hook(output_hook("attn_norm", l)))
            handles.append((mods["attn_post"] or mods["attn"]).register_forward_hook(output_hook("attn_out", l)))
            handles.append(mods["ffn_norm"].register_forward_pre_hook(input_hook("resid_attn", l)))
            handles.append(mods["ffn_norm"].register_forward_hook(output_hook("ffn_norm", l)))
            handles.append((mods["mlp_post"] or mods["mlp"]).register_forward_hook(output_hook("mlp_out", l)))
            handles.append(layer.register_forward_hook(output_hook("hidden", l)))
        handles.append(final_norm.register_forward_hook(lambda m, a, out: final.__setitem__("norm", _array(out))))
        stack.callback(lambda: [h.remove() for h in handles])
        stack.enter_context(_attention_recorded([_layer_modules(decoder_layers[l])["attn"] for l in layers],
                                                record_attention))
        with torch.no_grad():
            out = model(torch.tensor([ids]), output_hidden_states=True, use_cache=False)
    arrays = {}
    for name in capture:
        if name == "embed":
            arrays[name] = _array(out.hidden_states[0])
        elif name == "final_norm":
            arrays[name] = final["norm"]
        elif name == "logits":
            arrays[name] = _array(out.logits)
        else:
            arrays[name] = np.stack([got[name][l] for l in layers])
    return arrays
