"""pyllm verify: the ladder passes on a correct model and, on models broken the way engines break
(a layer's wk bound to another layer, the rope layout flipped, gate and up swapped, a soft-cap
dropped), fails and names the broken component and layer."""
from __future__ import annotations

import json

import numpy as np
import pytest

import pyllm.loader
from families import convert_to_gguf, make_family_checkpoint
from pyllm import cli, verify
from pyllm.errors import PyllmError

PROMPT = "The capital of France is Paris, and the capital of Germany is Berlin."


def _break(monkeypatch, change):
    """Makes pyllm (not transformers) load a broken model: change(spec, bound) edits what
    build_core receives."""
    original = pyllm.loader.build_core

    def broken(spec, bound, *args, **kwargs):
        bound = dict(bound)
        change(spec, bound)
        return original(spec, bound, *args, **kwargs)
    monkeypatch.setattr(pyllm.loader, "build_core", broken)


def _run(capsys, *argv) -> tuple[int, str]:
    code = cli.main(["verify", *argv])
    return code, capsys.readouterr().out


@pytest.mark.parametrize("family", ["llama", "gemma2", "gpt2"])
def test_a_correct_model_passes(family_checkpoint, capsys, family):
    code, out = _run(capsys, family_checkpoint(family), PROMPT, "--threads", "2")
    assert code == 0, out
    assert "every component agrees" in out
    assert "layer 2 hidden" in out and "logits" in out


def _swap(a: str, b: str):
    def change(spec, bound):
        bound[a], bound[b] = bound[b], bound[a]
    return change


def _flip_rope(spec, bound):
    spec.rope_interleaved = not spec.rope_interleaved


def _drop_softcap(spec, bound):
    spec.attn_softcap = 0.0


@pytest.mark.parametrize("family,change,first", [
    ("llama", _swap("layers.1.wk", "layers.2.wk"), "layer 1 k"),
    ("llama", _flip_rope, "layer 0 q"),
    ("qwen2", _swap("layers.0.w_gate", "layers.0.w_up"), "layer 0 mlp_out"),
    ("gemma2", _drop_softcap, "layer 0 attn"),
    ("llama", _swap("layers.2.attn_norm", "layers.2.ffn_norm"), "layer 2 attn_norm"),
])
def test_a_broken_model_fails_at_the_broken_component(family_checkpoint, capsys, monkeypatch, family, change, first):
    _break(monkeypatch, change)
    code, out = _run(capsys, family_checkpoint(family), PROMPT, "--threads", "2", "--json")
    result = json.loads(out)
    assert code == 1
    assert result["ok"] is False
    assert result["first_failure"] == first
    names = [r["component"] if r["layer"] is None else f"layer {r['layer']} {r['component']}"
             for r in result["rungs"]]
    # every component before the broken one agrees
    assert all(r["passed"] for r in result["rungs"][:names.index(first)])


def test_text_ladder_names_the_divergence(family_checkpoint, capsys, monkeypatch):
    _break(monkeypatch, _swap("layers.1.wk", "layers.2.wk"))
    code, out = _run(capsys, family_checkpoint("llama"), PROMPT, "--threads", "2", "--layers", "1,2")
    assert code == 1
    assert "first divergence: layer 1 k" in out
    assert "layer 0" not in out


def test_int8_activations_get_their_own_tolerance(tmp_path):
    """A quantized model multiplies 8-bit activations at every prompt length (prefill computes what
    decode does): the ladder says so and holds it to the int8 tolerance."""
    # widths of whole 32-blocks, as q8_0 needs
    folder = make_family_checkpoint(str(tmp_path), "llama", hidden_size=64, intermediate_size=160)
    path = convert_to_gguf(folder, str(tmp_path / "tiny-q8_0.gguf"), "q8_0")
    result = verify.verify(path, "Hi", threads=2)
    assert result.activations == "int8" and result.tolerance == verify.INT8_TOLERANCE
    assert result.ok, result.to_text()
    assert result.rungs[0].rel_err == 0  # the embeddings are the file's, dequantized alike
    long = verify.verify(path, PROMPT * 2, threads=2)
    assert long.activations == "int8" and long.ok, long.to_text()


def test_compare_metrics():
    ref = np.array([[1.0, 2.0, 3.0], [0.0, 1.0, 0.0]], np.float32)
    same = verify.compare("logits", None, ref, ref, 1e-3)
    assert same.passed and same.max_abs == 0 and same.rel_err == 0 and same.cosine == pytest.approx(1)
    assert same.argmax_agreement == 1.0
    off = verify.compare("logits", None, ref[:, ::-1].copy(), ref, 1e-3)
    assert not off.passed and off.argmax_agreement == 0.5
    nan = verify.compare("hidden", 0, np.full_like(ref, np.nan), ref, 1e-3)
    assert not nan.passed


def test_without_transformers_the_error_names_the_extra(family_checkpoint, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers -> ImportError
    with pytest.raises(PyllmError, match=r"pyllm\[verify\]"):
        verify.verify(family_checkpoint("llama"), PROMPT, threads=2)


@pytest.mark.slow
def test_real_smollm2_layer_by_layer(smollm2_gguf, smollm2_hf_from_gguf):
    """The default model's every component against transformers' load of the same Q4_1 file: its
    weights widened to float32 (the float path, every layer), and as they are (the 8-bit path)."""
    wide = pyllm.load(smollm2_gguf, threads=2, dtype="f32")
    ids = wide.tokenize(verify.DEFAULT_PROMPT)
    result = verify.ladder(wide, smollm2_hf_from_gguf, ids, list(range(wide.spec.n_layers)))
    assert result.activations == "float32" and result.ok, result.to_text()
    assert max(r.rel_err for r in result.rungs) < 1e-5
    llm = pyllm.load(smollm2_gguf, threads=2)
    quantized = verify.ladder(llm, smollm2_hf_from_gguf, ids, [0, 15, 29])
    assert quantized.activations == "int8" and quantized.ok, quantized.to_text()


@pytest.mark.slow
def test_real_gemma3_layer_by_layer(gemma3_gguf):
    """Gemma 3 270M Q4_K_M: q/k norms, sandwich norms, two rope tables, sliding layers; every layer
    with the weights widened to float32, and the 8-bit path of the file as it is."""
    from pyllm.oracle import load_reference

    reference = load_reference(gemma3_gguf)
    wide = pyllm.load(gemma3_gguf, threads=2, dtype="f32")
    ids = wide.tokenize(verify.DEFAULT_PROMPT)
    result = verify.ladder(wide, reference, ids, list(range(wide.spec.n_layers)))
    assert result.activations == "float32" and result.ok, result.to_text()
    assert max(r.rel_err for r in result.rungs) < 1e-5
    llm = pyllm.load(gemma3_gguf, threads=2)
    quantized = verify.ladder(llm, reference, ids, [0, 8, 17])
    assert quantized.activations == "int8" and quantized.ok, quantized.to_text()
