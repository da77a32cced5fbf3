"""A config.json with wrong, missing or absurd hyper-parameters is refused with a pyllm error that
names the setting, before anything is sized from it; mutated configs never crash or hang."""
from __future__ import annotations

import json
import os
import random

import pytest

import pyllm

from conftest import make_tiny_checkpoint
from fuzzing import run_cases


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
    ("rope_parameters", {"rope_type": "default", "rope_theta": 1e39}, "rope_theta"),  # past float32's range
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


class Nested:
    """A JSON value nested depth arrays deep, written as text (json.dumps would recurse that deep)."""

    def __init__(self, depth: int):
        self.depth = depth

    def __repr__(self) -> str:
        return f"Nested({self.depth})"


def write_json(path: str, data: dict) -> None:
    nested = {}

    def placeholder(value):
        nested[f"@@{id(value)}@@"] = "[" * value.depth + "]" * value.depth
        return f"@@{id(value)}@@"

    text = json.dumps(data, default=placeholder)
    for mark, value in nested.items():
        text = text.replace(f'"{mark}"', value)
    if os.path.islink(path):
        os.remove(path)
    with open(path, "w") as f:
        f.write(text)


FUZZ_KEYS = {
    "config.json": ["hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "num_hidden_layers",
                    "intermediate_size", "vocab_size", "max_position_embeddings", "rms_norm_eps", "sliding_window",
                    "rope_parameters", "rope_theta", "rope_scaling", "eos_token_id", "bos_token_id",
                    "tie_word_embeddings", "hidden_act", "attention_bias", "architectures", "mlp_bias"],
    "generation_config.json": ["eos_token_id", "bos_token_id", "pad_token_id"],
    "tokenizer_config.json": ["bos_token", "eos_token", "add_bos_token", "add_eos_token", "chat_template"],
}
FUZZ_VALUES = [0, -1, 1, 2, 3, 7, 2**31, 2**63, 10**400, -(10**400), 1.5, -0.5, float("nan"), float("inf"),
               float("-inf"), 1e308, "x", "", "</s>", None, [], {}, True, [1, -5], [[1]], ["LlamaForCausalLM"],
               {"content": 5}, {"rope_type": "llama3", "factor": 0}, {"rope_type": "linear", "factor": -1},
               {"rope_type": [], "rope_theta": 10**400}, "{{ messages[0]['content'] }}", "{% for %}",
               Nested(3), Nested(100_000)]


def mutated_folder(checkpoint: str, folder, seed: int) -> tuple[str, list[str]]:
    """A copy of the checkpoint whose JSON files have 1 to 3 changes drawn from seed: a key of
    config.json, generation_config.json or tokenizer_config.json set to an odd value (a number of
    400 digits, NaN, JSON nested 100,000 deep, an array where a number belongs), or tokens added
    to tokenizer.json past the embedding rows."""
    rnd = random.Random(seed)
    os.makedirs(folder)
    for name in os.listdir(checkpoint):
        os.symlink(os.path.join(checkpoint, name), os.path.join(folder, name))
    files = {}
    for name in (*FUZZ_KEYS, "tokenizer.json"):
        with open(os.path.join(checkpoint, name)) as f:
            files[name] = json.load(f)
    done = []
    for _ in range(rnd.randint(1, 3)):
        name = rnd.choice([*FUZZ_KEYS, "config.json", "config.json", "tokenizer.json"])
        if name == "tokenizer.json":  # special tokens that the prompt holds, with ids past vocab_size
            added = files[name]["added_tokens"]
            first = max(t["id"] for t in added) + 1 if rnd.random() < 0.5 else 320
            for i in range(rnd.randint(1, 3)):
                added.append({"id": first + i, "content": f"<x{i}>", "single_word": False, "lstrip": False,
                              "rstrip": False, "normalized": False, "special": True})
            done.append(f"tokenizer.json: {len(added)} added tokens from id {first}")
        else:
            key, value = rnd.choice(FUZZ_KEYS[name]), rnd.choice(FUZZ_VALUES)
            files[name][key] = value
            done.append(f"{name}: {key} = {value!r}"[:100])
    for name, data in files.items():
        write_json(os.path.join(folder, name), data)
    return str(folder), done


def test_mutated_json_files_load_and_run_or_raise_pyllm_errors(checkpoint, tmp_path):
    """Every mutated folder loads and runs (tokenize, logits, generate, chat), or is refused with a
    PyllmError: never a plain ValueError, TypeError, OverflowError or RecursionError."""

    def case(seed: int) -> str:
        folder, _ = mutated_folder(checkpoint, tmp_path / str(seed), seed)
        try:
            llm = pyllm.load(folder, threads=1)
            ids = llm.tokenize("Hello <x0> world") or [2]
            llm.logits(ids)
            llm.generate(ids, max_tokens=2)
            if llm.tokenizer.chat_template:
                llm.chat([{"role": "user", "content": "Hi"}], max_tokens=2)
        except pyllm.PyllmError:
            return "refused"
        return "ran"

    outcomes = run_cases(2_024_000, 500, case,
                         describe=lambda seed: "; ".join(mutated_folder(checkpoint, tmp_path / f"d{seed}", seed)[1]))
    assert outcomes["ran"] > 0 and outcomes["refused"] > 0, outcomes


@pytest.mark.parametrize("setting,value,named", [
    ("architectures", 5, "architectures"),
    ("architectures", [["LlamaForCausalLM"]], "architectures"),
    ("sliding_window", 2**31, "sliding_window"),
    ("eos_token_id", float("-inf"), "eos_token_id"),
    ("eos_token_id", [1, -5], "eos_token_id"),
    ("bos_token_id", 1.5, "bos_token_id"),
    # JSON ints have no size limit, and one of 400 digits overflows a float
    pytest.param("hidden_size", 10**400, "hidden_size", id="hidden_size-400-digits"),
    pytest.param("rms_norm_eps", 10**400, "rms_norm_eps", id="rms_norm_eps-400-digits"),
    pytest.param("eos_token_id", 10**400, "eos_token_id", id="eos_token_id-400-digits"),
    ("hidden_act", ["silu"], "hidden_act"),
    ("rope_scaling", "linear", "rope_scaling"),
    ("rope_parameters", 5, "rope_parameters"),
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


def test_huge_eos_id_in_generation_config_raises_format_error_naming_it(checkpoint, tmp_path):
    folder = with_config(checkpoint, tmp_path / "m")
    write_json(os.path.join(folder, "generation_config.json"), {"eos_token_id": 10**400})
    with pytest.raises(pyllm.FormatError, match="generation_config.json.*eos_token_id"):
        pyllm.load(folder, threads=1)


def test_tokenizer_with_ids_past_vocab_size_raises_format_error(checkpoint, tmp_path):
    """A token id the tokenizer can produce must have an embedding row: an added token with id 320
    beside 320 rows would load, then fail on the first text holding it."""
    folder = with_config(checkpoint, tmp_path / "m")
    with open(os.path.join(checkpoint, "tokenizer.json")) as f:
        tokenizer = json.load(f)
    tokenizer["added_tokens"].append({"id": 320, "content": "<extra>", "single_word": False, "lstrip": False,
                                      "rstrip": False, "normalized": False, "special": True})
    write_json(os.path.join(folder, "tokenizer.json"), tokenizer)
    with pytest.raises(pyllm.FormatError, match="tokenizer.json: the tokenizer gives 321 token ids, more than "
                                                "config.json's vocab_size of 320 embedding rows"):
        pyllm.load(folder, threads=1)
