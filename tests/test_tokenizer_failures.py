"""A tokenizer.json is data from the internet: a pattern in it that makes the tokenizers library
fail (a Split regex past its backtracking limit panics in Rust, which reaches Python as a
BaseException) is a TokenizerError from Model.tokenize, and a 400 from the server."""
from __future__ import annotations

import json
import os

import openai
import pytest

import pyllm

from server_helpers import ServerProcess, make_tiny_chat_checkpoint

TEXT = "a" * 28 + "!"  # (a+)+$ backtracks through 2**28 ways of cutting the a's before giving up


@pytest.fixture(scope="module")
def backtracking(tmp_path_factory) -> str:
    folder = make_tiny_chat_checkpoint(str(tmp_path_factory.mktemp("regex")))
    path = os.path.join(folder, "tokenizer.json")
    with open(path) as f:
        tokenizer = json.load(f)
    split = {"type": "Split", "pattern": {"Regex": "(a+)+$"}, "behavior": "Isolated", "invert": False}
    tokenizer["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [split, tokenizer["pre_tokenizer"]]}
    with open(path, "w") as f:
        json.dump(tokenizer, f)
    return folder


def test_a_regex_that_gives_up_is_a_tokenizer_error(backtracking):
    llm = pyllm.load(backtracking, threads=1)
    assert llm.tokenize("a plain text", add_special=False)  # the pattern itself works
    with pytest.raises(pyllm.TokenizerError, match="retry-limit"):
        llm.tokenize(TEXT)
    with pytest.raises(pyllm.PyllmError):
        llm.generate(TEXT, max_tokens=1)
    assert llm.generate("the sky", max_tokens=2).finish_reason == "length"


def test_the_server_answers_a_regex_that_gives_up_with_400(backtracking):
    server = ServerProcess(backtracking, "--threads", "1")
    try:
        client = server.client()
        model = client.models.list().data[0].id
        with pytest.raises(openai.BadRequestError, match="retry-limit"):
            client.completions.create(model=model, prompt=TEXT, max_tokens=1)
        with pytest.raises(openai.BadRequestError, match="retry-limit"):
            client.chat.completions.create(model=model, max_tokens=1, messages=[{"role": "user", "content": TEXT}])
        assert client.completions.create(model=model, prompt="the sky", max_tokens=2).usage.completion_tokens == 2
    finally:
        server.stop()
