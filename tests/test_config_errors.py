"""A config.json with wrong, missing or absurd hyper-parameters is refused with a pyllm error that
names the setting, before anything is sized from it; mutated configs never crash or hang."""
from __future__ import annotations

import json
import os
import random

import pytest

import pyllm

from conftest import make_tiny_checkpoint


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    return make_tiny_checkpoint(str(tmp_path_factory.mktemp("tiny")))


def with_config(checkpoint: str, folder, **changes) -> str:
    """A copy of the checkpoint (weights linked, not copied) whose config.json has changes."""
    os.makedirs(folder, exist_ok=True)
    for name in os.listdir(checkpoint):
        if name != "config.json":
            os.symlink(os.path.join(checkpoint, name), os.path.join(folder, name))
    with open(os.path.join(checkpoint, "config.json")) as f:
        config = json.load(f)
    config.update(changes)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    return str(folder)


@pytest.mark.parametrize("setting,value,named", [
    ("hidden_size", 0, "hidden_size"),
    ("hidden_size", "64", "hidden_size"),
    ("num_attention_heads", 1.5, "num_attention_heads"),
    ("num_attention_heads", None, "num_attention_heads"),
    ("num_key_value_heads", 3, "num_key_value_heads 3"),
    ("num_key_value_heads", 0, "num_key_value_heads"),
    ("head_dim", -1, "head_dim"),
    ("head_dim", 10**12, "head_dim"),
    ("num_hidden_layers", 2**40, "num_hidden_layers"),
    ("intermediate_size", True, "intermediate_size"),
    ("vocab_size", 2**63, "vocab_size"),
    ("rms_norm_eps", float("nan"), "rms_norm_eps"),
    ("rms_norm_eps", -1e-5, "rms_norm_eps"),
    ("max_position_embeddings", 0, "max_position_embeddings"),
    ("sliding_window", -4, "sliding_window"),
    ("rope_parameters", {"rope_type": "linear", "rope_theta": 10000.0, "factor": 0}, "rope factor"),
    ("rope_parameters", {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                         "low_freq_factor": 4.0, "high_freq_factor": 4.0}, "high_freq_factor"),
    ("rope_parameters", {"rope_type": "default", "rope_theta": -1.0}, "rope_theta"),
])
def test_bad_hyper_parameter_raises_format_error_naming_it(checkpoint, tmp_path, setting, value, named):
    folder = with_config(checkpoint, tmp_path / "m", **{setting: value})
    with pytest.raises(pyllm.FormatError, match="config.json") as raised:
        pyllm.load(folder, threads=1)
    assert named in str(raised.value)


def test_shapes_the_weights_do_not_have_raise_format_error(checkpoint, tmp_path):
    folder = with_config(checkpoint, tmp_path / "m", intermediate_size=96)
    with pytest.raises(pyllm.FormatError, match="gate_proj.*shape"):
        pyllm.load(folder, threads=1)


def test_unknown_rope_type_is_unsupported(checkpoint, tmp_path):
    folder = with_config(checkpoint, tmp_path / "m", rope_parameters={"rope_type": "yarn", "factor": 2.0})
    with pytest.raises(pyllm.UnsupportedModelError, match="yarn"):
        pyllm.load(folder, threads=1)


def test_mutated_configs_load_and_run_or_raise_pyllm_errors(checkpoint, tmp_path):
    keys = ["hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "num_hidden_layers",
            "intermediate_size", "vocab_size", "max_position_embeddings", "rms_norm_eps", "sliding_window",
            "rope_parameters", "rope_theta", "rope_scaling", "eos_token_id", "bos_token_id",
            "tie_word_embeddings", "hidden_act", "attention_bias"]
    values = [0, -1, 1, 2, 3, 7, 2**31, 2**63, 1.5, -0.5, float("nan"), 1e308, "x", None, [], {}, True,
              [1, -5], {"rope_type": "llama3", "factor": 0}, {"rope_type": "linear", "factor": -1}]
    rnd = random.Random(2024)
    outcomes = {"ran": 0, "refused": 0}
    for trial in range(60):
        changes = {rnd.choice(keys): rnd.choice(values) for _ in range(rnd.randint(1, 2))}
        folder = with_config(checkpoint, tmp_path / str(trial), **changes)
        try:
            llm = pyllm.load(folder, threads=2, n_ctx=64)
            llm.logits([2, 3, 4])
            llm.generate([5, 6], max_tokens=3)
            outcomes["ran"] += 1
        except (pyllm.PyllmError, ValueError):
            outcomes["refused"] += 1
    assert outcomes["ran"] > 0 and outcomes["refused"] > 0, outcomes


@pytest.mark.parametrize("setting,value,named", [
    ("architectures", 5, "architectures"),
    ("architectures", [["LlamaForCausalLM"]], "architectures"),
    ("sliding_window", 2**31, "sliding_window"),
    ("eos_token_id", float("-inf"), "eos_token_id"),
    ("eos_token_id", [1, -5], "eos_token_id"),
    ("bos_token_id", 1.5, "bos_token_id"),
])
def test_malformed_values_raise_format_error_not_python_errors(checkpoint, tmp_path, setting, value, named):
    folder = with_config(checkpoint, tmp_path / "m", **{setting: value})
    with pytest.raises(pyllm.FormatError) as raised:
        pyllm.load(folder, threads=1)
    assert named in str(raised.value)


@pytest.mark.parametrize("name", ["config.json", "generation_config.json", "tokenizer_config.json"])
def test_deeply_nested_json_raises_format_error(checkpoint, tmp_path, name):
    folder = with_config(checkpoint, tmp_path / "m")
    path = os.path.join(folder, name)
    if os.path.islink(path):
        os.remove(path)
    with open(path, "w") as f:
        f.write("[" * 100000 + "]" * 100000)
    with pytest.raises(pyllm.FormatError, match=name):
        pyllm.load(folder, threads=1)


def test_fewer_layers_than_the_checkpoint_holds_raise_format_error(checkpoint, tmp_path):
    folder = with_config(checkpoint, tmp_path / "m", num_hidden_layers=2)  # the file has 3
    with pytest.raises(pyllm.FormatError, match="model.layers.2.*beyond its 2 layers"):
        pyllm.load(folder, threads=1)
