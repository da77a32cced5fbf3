"""Files as people download them load as transformers loads them: a tied head saved only under the
head's name, a config with no architectures but a model_type, a tokenizer_config flag written as a
string; and an absurd n_ctx is a pyllm error."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

import pyllm

from conftest import make_tiny_checkpoint
from test_config_errors import with_config, write_json

IDS = [5, 17, 42, 99, 3, 250, 7]


@pytest.fixture(scope="module")
def tied(tmp_path_factory) -> str:
    return make_tiny_checkpoint(str(tmp_path_factory.mktemp("tied")), tie_word_embeddings=True)


def test_tied_embeddings_stored_only_as_the_head_load(tied, tmp_path):
    """safetensors.torch.save_model keeps one name of tensors that share memory; for a tied head
    that can be lm_head.weight alone, and transformers fills the embeddings from it."""
    from safetensors.torch import load_file, save_file

    folder = with_config(tied, tmp_path / "m")
    os.remove(os.path.join(folder, "model.safetensors"))
    tensors = load_file(os.path.join(tied, "model.safetensors"))
    tensors["lm_head.weight"] = tensors.pop("model.embed_tokens.weight")
    save_file(tensors, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    expected = pyllm.load(tied, threads=1).logits(IDS)
    np.testing.assert_array_equal(pyllm.load(folder, threads=1).logits(IDS), expected)


@pytest.mark.parametrize("architectures", [None, []])
def test_a_config_without_architectures_falls_back_to_its_model_type(tied, tmp_path, architectures):
    folder = with_config(tied, tmp_path / "m", architectures=architectures, model_type="llama")
    expected = pyllm.load(tied, threads=1).logits(IDS)
    np.testing.assert_array_equal(pyllm.load(folder, threads=1).logits(IDS), expected)


def test_a_config_without_architectures_or_a_known_model_type_is_unsupported(tied, tmp_path):
    folder = with_config(tied, tmp_path / "m", architectures=None, model_type="mamba")
    with pytest.raises(pyllm.UnsupportedModelError, match="mamba"):
        pyllm.load(folder, threads=1)


@pytest.mark.parametrize("n_ctx", [2**33, 2**64, 10**30])
@pytest.mark.parametrize("context", [256, 2**40])
def test_an_n_ctx_past_what_a_cache_holds_is_a_pyllm_error(tied, tmp_path, n_ctx, context):
    folder = with_config(tied, tmp_path / "m", max_position_embeddings=context)
    with pytest.raises(pyllm.PyllmError, match=f"n_ctx {n_ctx} is more than"):
        pyllm.load(folder, threads=1, n_ctx=n_ctx)


@pytest.mark.parametrize("written, adds_bos", [("false", False), ("False", False), (False, False),
                                                ("true", True), (True, True)])
def test_add_bos_token_written_as_a_string_is_read_as_a_flag(tied, tmp_path, written, adds_bos):
    folder = with_config(tied, tmp_path / "m")
    with open(os.path.join(tied, "tokenizer_config.json")) as f:
        config = json.load(f)
    os.remove(os.path.join(folder, "tokenizer_config.json"))
    write_json(os.path.join(folder, "tokenizer_config.json"), {**config, "add_bos_token": written})
    llm = pyllm.load(folder, threads=1)
    assert (llm.tokenize("the sky")[0] == llm.tokenizer.bos_id) is adds_bos
    assert llm.tokenize("the sky", add_special=False) == llm.tokenize("the sky")[int(adds_bos):]


def test_add_bos_token_that_is_not_a_flag_is_a_format_error(tied, tmp_path):
    folder = with_config(tied, tmp_path / "m")
    os.remove(os.path.join(folder, "tokenizer_config.json"))
    write_json(os.path.join(folder, "tokenizer_config.json"), {"bos_token": "<s>", "add_bos_token": "maybe"})
    with pytest.raises(pyllm.FormatError, match="tokenizer_config.json.*add_bos_token"):
        pyllm.load(folder, threads=1)
