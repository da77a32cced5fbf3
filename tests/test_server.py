"""`pyllm serve` as OpenAI's own client sees it: a real server process on 127.0.0.1 gives, for every
request shape, what Model.generate / Model.chat / Model.embed give in this process; streams join to
the same text; clients that go away free their slots; bad requests get OpenAI's error shape and
leave the server serving; its memory stays flat; the API key is enforced."""
from __future__ import annotations

import base64
import random
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import openai
import psutil
import pytest

import pyllm

from conftest import english_text
from server_helpers import (ServerProcess, drop, free_port, make_tiny_chat_checkpoint, open_stream,
                            read_events, request, send_only)

PROMPTS = ["the license", "You may convey verbatim copies of the Program", "a",
           "GNU General Public License is a free, copyleft license for software and other kinds of works"]
NO_EOS = {"1": -100}  # the tiny checkpoint's </s> never comes: it runs as long as max_tokens says


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return make_tiny_chat_checkpoint(str(tmp_path_factory.mktemp("serve")))


@pytest.fixture(scope="module")
def tiny(tiny_folder):
    return pyllm.load(tiny_folder)


@pytest.fixture(scope="module")
def server(tiny_folder):
    s = ServerProcess(tiny_folder, "--parallel", "4")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def guarded(tiny_folder):
    """One slot, room for one waiting request, and an API key."""
    s = ServerProcess(tiny_folder, "--parallel", "1", "--max-queue", "1", api_key="sekrit")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def mid(server):
    return server.client().models.list().data[0].id


def chat_messages(text: str) -> list[dict]:
    return [{"role": "system", "content": "You are terse."}, {"role": "user", "content": text}]


def streamed_text(chunks, chat: bool) -> dict[int, str]:
    """index -> the joined text of a stream's chunks."""
    out: dict[int, str] = {}
    for c in chunks:
        for choice in c.choices:
            piece = (choice.delta.content if chat else choice.text) or ""
            out[choice.index] = out.get(choice.index, "") + piece
    return out


def finish_reasons(chunks) -> dict[int, str]:
    return {ch.index: ch.finish_reason for c in chunks for ch in c.choices if ch.finish_reason}


def assert_usage(usage, prompt_tokens: int, completion_tokens: int) -> None:
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (
        prompt_tokens, completion_tokens, prompt_tokens + completion_tokens)


# ---- models, completions, chat -----------------------------------------------------------------------


def test_models_lists_the_served_model_and_health_reports_the_slots(server, tiny_folder, mid):
    assert mid == tiny_folder.rstrip("/").rsplit("/", 1)[-1]
    models = server.client().models.list()
    assert [(m.id, m.object, m.owned_by) for m in models.data] == [(mid, "model", "pyllm")]
    assert server.client().models.retrieve(mid).id == mid
    health = server.health()
    assert (health["status"], health["active"], health["queued"], health["slots"]) == ("ok", 0, 0, 4)


def test_completions_greedy_equal_model_generate_with_usage(server, tiny, mid):
    client = server.client()
    for prompt, max_tokens in zip(PROMPTS, (12, 5, 30, 1)):
        expected = tiny.generate(prompt, max_tokens=max_tokens)
        r = client.completions.create(model=mid, prompt=prompt, max_tokens=max_tokens, temperature=0)
        assert (r.object, r.model, r.id[:5]) == ("text_completion", mid, "cmpl-")
        [choice] = r.choices
        assert (choice.index, choice.text, choice.finish_reason) == (0, expected.text, expected.finish_reason)
        assert_usage(r.usage, expected.usage["prompt_tokens"], expected.usage["completion_tokens"])


def test_completions_default_to_16_tokens_as_openai(server, tiny, mid):
    r = server.client().completions.create(model=mid, prompt=PROMPTS[0], temperature=0, logit_bias=NO_EOS)
    assert r.choices[0].text == tiny.generate(PROMPTS[0], max_tokens=16, logit_bias={1: -100}).text
    assert r.usage.completion_tokens == 16


def test_streamed_completions_join_to_the_text_and_end_with_a_usage_chunk(server, tiny, mid):
    client = server.client()
    for prompt in PROMPTS:
        expected = tiny.generate(prompt, max_tokens=20)
        chunks = list(client.completions.create(model=mid, prompt=prompt, max_tokens=20, temperature=0, stream=True,
                                                stream_options={"include_usage": True}))
        assert streamed_text(chunks, chat=False) == {0: expected.text}
        assert finish_reasons(chunks) == {0: expected.finish_reason}
        assert all(c.usage is None for c in chunks[:-1]) and chunks[-1].choices == []
        assert_usage(chunks[-1].usage, expected.usage["prompt_tokens"], expected.usage["completion_tokens"])


def test_token_id_prompts_and_lists_of_prompts_give_n_choices_each(server, tiny, mid):
    client = server.client()
    ids = [tiny.tokenize(p) for p in PROMPTS[:2]]
    expected = [tiny.generate(i, max_tokens=6).text for i in ids]
    for prompt in (ids, PROMPTS[:2]):  # token-id lists, then texts
        r = client.completions.create(model=mid, prompt=prompt, max_tokens=6, temperature=0, n=2)
        assert sorted((c.index, c.text) for c in r.choices) == [(0, expected[0]), (1, expected[0]),
                                                               (2, expected[1]), (3, expected[1])]
        assert r.usage.prompt_tokens == len(ids[0]) + len(ids[1])  # each prompt once, not once per choice
    r = client.completions.create(model=mid, prompt=ids[1], max_tokens=6, temperature=0)
    assert r.choices[0].text == expected[1]


def test_chat_greedy_equals_model_chat_streamed_and_not(server, tiny, mid):
    client = server.client()
    messages = chat_messages("Which license is this?")
    expected = tiny.chat(messages, max_tokens=24)
    r = client.chat.completions.create(model=mid, messages=messages, max_tokens=24, temperature=0)
    assert (r.object, r.id[:9], r.choices[0].message.role) == ("chat.completion", "chatcmpl-", "assistant")
    assert (r.choices[0].message.content, r.choices[0].finish_reason) == (expected.text, expected.finish_reason)
    assert_usage(r.usage, expected.usage["prompt_tokens"], expected.usage["completion_tokens"])
    chunks = list(client.chat.completions.create(model=mid, messages=messages, max_completion_tokens=24,
                                                 temperature=0, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    assert streamed_text(chunks, chat=True) == {0: expected.text}
    assert finish_reasons(chunks) == {0: expected.finish_reason}
    assert_usage(chunks[-1].usage, expected.usage["prompt_tokens"], expected.usage["completion_tokens"])


def test_chat_without_max_tokens_runs_to_the_end_of_the_context(server, tiny, mid):
    per_copy = len(tiny.tokenize("the license " * 100, add_special=False)) / 100
    messages = chat_messages("the license " * int((tiny.n_ctx - 60) / per_copy))
    prompt = len(tiny.tokenizer.encode(tiny.render_chat(messages), add_special=False))
    assert 0 < tiny.n_ctx - prompt < 100
    r = server.client().chat.completions.create(model=mid, messages=messages, temperature=0, logit_bias=NO_EOS)
    assert (r.usage.completion_tokens, r.choices[0].finish_reason) == (tiny.n_ctx - prompt, "length")


def test_stop_strings_cut_as_model_generate_does_streamed_and_not(server, tiny, mid):
    client = server.client()
    full = tiny.generate(PROMPTS[3], max_tokens=40).text
    stops = [full[10:13], "\u2603never"]  # one that cuts mid-way, one that never comes
    expected = tiny.generate(PROMPTS[3], max_tokens=40, stop=stops)
    assert expected.finish_reason == "stop" and len(expected.text) < len(full)
    r = client.completions.create(model=mid, prompt=PROMPTS[3], max_tokens=40, temperature=0, stop=stops)
    assert (r.choices[0].text, r.choices[0].finish_reason) == (expected.text, "stop")
    chunks = list(client.completions.create(model=mid, prompt=PROMPTS[3], max_tokens=40, temperature=0,
                                            stop=stops[0], stream=True))
    assert streamed_text(chunks, chat=False) == {0: expected.text}
    assert finish_reasons(chunks) == {0: "stop"}


def test_n_choices_with_a_seed_sample_choice_i_with_seed_plus_i(server, tiny, mid):
    client = server.client()
    expected = [tiny.generate(PROMPTS[0], max_tokens=10, temperature=0.9, seed=7 + i, logit_bias={1: -100}).text
                for i in range(2)]
    assert expected[0] != expected[1]
    r = client.completions.create(model=mid, prompt=PROMPTS[0], max_tokens=10, temperature=0.9, seed=7, n=2,
                                  logit_bias=NO_EOS)
    assert sorted((c.index, c.text) for c in r.choices) == list(enumerate(expected))
    assert_usage(r.usage, len(tiny.tokenize(PROMPTS[0])), 20)
    messages = chat_messages("Say something.")
    expected = [tiny.chat(messages, max_tokens=10, temperature=0.9, seed=3 + i).text for i in range(2)]
    chunks = list(client.chat.completions.create(model=mid, messages=messages, max_tokens=10, temperature=0.9,
                                                 seed=3, n=2, stream=True))
    assert streamed_text(chunks, chat=True) == dict(enumerate(expected))


def test_chat_logprobs_equal_the_models_streamed_and_not(server, tiny, mid):
    client = server.client()
    messages = chat_messages("Spell it.")
    expected = tiny.chat(messages, max_tokens=12, logprobs=3).logprobs

    def check(content):
        assert [c.token for c in content] == [e["token"] for e in expected]
        assert [c.logprob for c in content] == pytest.approx([e["logprob"] for e in expected], abs=1e-4)
        assert all(c.bytes == list(c.token.encode()) for c in content)
        assert [[t.token for t in c.top_logprobs] for c in content] == [
            [t["token"] for t in e["top_logprobs"]] for e in expected]

    r = client.chat.completions.create(model=mid, messages=messages, max_tokens=12, temperature=0, logprobs=True,
                                       top_logprobs=3)
    check(r.choices[0].logprobs.content)
    chunks = client.chat.completions.create(model=mid, messages=messages, max_tokens=12, temperature=0,
                                            logprobs=True, top_logprobs=3, stream=True)
    check([lp for c in chunks for ch in c.choices if ch.logprobs for lp in ch.logprobs.content])
    r = client.chat.completions.create(model=mid, messages=messages, max_tokens=4, temperature=0)
    assert r.choices[0].logprobs is None


def test_completion_logprobs_have_openais_legacy_shape(server, tiny, mid):
    prompt = PROMPTS[1]
    expected = tiny.generate(prompt, max_tokens=8, logprobs=2).logprobs
    r = server.client().completions.create(model=mid, prompt=prompt, max_tokens=8, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    assert lp.tokens == [e["token"] for e in expected]
    assert lp.token_logprobs == pytest.approx([e["logprob"] for e in expected], abs=1e-4)
    assert lp.top_logprobs == [pytest.approx({t["token"]: t["logprob"] for t in e["top_logprobs"]}, abs=1e-4)
                               for e in expected]
    lengths = np.cumsum([0] + [len(t) for t in lp.tokens[:-1]])
    assert lp.text_offset == [len(prompt) + int(n) for n in lengths]


# ---- embeddings --------------------------------------------------------------------------------------


def test_embeddings_equal_model_embed_as_floats_base64_and_from_token_ids(server, tiny, mid):
    client = server.client()
    texts = ["a cat", "the license of the program"]
    expected = tiny.embed(texts)
    r = client.embeddings.create(model=mid, input=texts)  # the client asks for base64 and decodes it
    assert r.object == "list" and [d.index for d in r.data] == [0, 1]
    np.testing.assert_allclose(np.array([d.embedding for d in r.data]), expected, atol=1e-6)
    assert r.usage.prompt_tokens == sum(len(tiny.tokenize(t)) for t in texts)
    status, body = request(server.url, "POST", "/v1/embeddings",
                           {"model": mid, "input": texts[0], "encoding_format": "float"})
    assert status == 200
    np.testing.assert_allclose(body["data"][0]["embedding"], expected[0], atol=1e-6)
    status, body = request(server.url, "POST", "/v1/embeddings",
                           {"model": mid, "input": [tiny.tokenize(t) for t in texts], "encoding_format": "base64"})
    vectors = [np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in body["data"]]
    np.testing.assert_allclose(np.stack(vectors), expected, atol=1e-6)


# ---- errors ------------------------------------------------------------------------------------------

M = object()  # stands for the served model's id in BAD_REQUESTS
CHAT = {"model": M, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
COMPLETION = {"model": M, "prompt": "hi", "max_tokens": 2}
EMBEDDING = {"model": M, "input": "hi"}

# (path, body, param named, code)
BAD_REQUESTS = [
    ("/v1/chat/completions", b'{"model": "x", "messages": [', None, "invalid_json"),
    ("/v1/chat/completions", b"[1, 2]", None, "invalid_type"),
    ("/v1/chat/completions", {"model": M}, "messages", "invalid_value"),
    ("/v1/chat/completions", {**CHAT, "messages": []}, "messages", "invalid_value"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "robot", "content": "x"}]}, "messages", "invalid_value"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": None}]}, "messages", "invalid_value"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": 5}]}, "messages", "invalid_value"),
    ("/v1/chat/completions", {**CHAT, "temperature": "hot"}, "temperature", "invalid_value"),
    ("/v1/chat/completions", {**CHAT, "temperature": -1}, "temperature", "invalid_value"),
    ("/v1/chat/completions", {**CHAT, "top_p": 0}, "top_p", "invalid_value"),
    ("/v1/chat/completions", {**CHAT, "min_p": 2}, "min_p", "invalid_value"),
    ("/v1/chat/completions", {**CHAT, "top_k": -1}, "top_k", "invalid_value"),
    ("/v1/chat/completions", {**CHAT, "repetition_penalty": 0}, "repetition_penalty", "invalid_value"),
    ("/v1/chat/completions", {**CHAT, "presence_penalty": 3}, "presence_penalty", "invalid_value"),
    ("/v1/chat/completions", {**CHAT, "frequency_penalty": -2.5}, "frequency_penalty", "invalid_value"),
    ("/v1/chat/completions", {**CHAT, "max_tokens": -1}, "max_tokens", "invalid_value"),
    ("/v1/chat/completions", {**CHAT, "max_tokens": "2"}, "max_tokens", "invalid_value"),
    ("/v1/chat/completions", {**CHAT, "n": 0}, "n", "invalid_value"),
    ("/v1/chat/completions", {**CHAT, "n": 1.5}, "n", "invalid_value"),
    ("/v1/chat/completions", {**CHAT, "seed": -3}, "seed", "invalid_value"),
    ("/v1/chat/completions", {**CHAT, "stop": [""]}, "stop", "invalid_value"),
    ("/v1/chat/completions", {**CHAT, "stop": 7}, "stop", "invalid_value"),
    ("/v1/chat/completions", {**CHAT, "logprobs": "yes"}, "logprobs", "invalid_value"),
    ("/v1/chat/completions", {**CHAT, "logprobs": True, "top_logprobs": 21}, "top_logprobs", "invalid_value"),
    ("/v1/chat/completions", {**CHAT, "top_logprobs": 2}, "top_logprobs", "invalid_value"),
    ("/v1/chat/completions", {**CHAT, "logit_bias": {"abc": 1}}, "logit_bias", "invalid_value"),
    ("/v1/chat/completions", {**CHAT, "logit_bias": {"99999": 1}}, "logit_bias", "invalid_value"),
    ("/v1/chat/completions", {**CHAT, "stream_options": {"include_usage": "yes"}}, "stream_options", "invalid_value"),
    # the tiny model's template has no tool support
    ("/v1/chat/completions", {**CHAT, "tools": [{"type": "function", "function": {"name": "f"}}]}, "tools",
     "invalid_value"),
    ("/v1/chat/completions", {**CHAT, "tool_choice": "auto"}, "tool_choice", "invalid_value"),
    ("/v1/chat/completions", {**CHAT, "functions": [{"name": "f"}]}, "functions", "unsupported_parameter"),
    ("/v1/chat/completions", {**CHAT, "response_format": {"type": "json_schema"}}, "response_format",
     "invalid_value"),
    ("/v1/chat/completions", {**CHAT, "response_format": {"type": "yaml"}}, "response_format", "invalid_value"),
    ("/v1/chat/completions", {**CHAT, "frobnicate": 1}, "frobnicate", "unknown_parameter"),
    ("/v1/completions", {**COMPLETION, "logprobs": 6}, "logprobs", "invalid_value"),
    ("/v1/completions", {**COMPLETION, "echo": True}, "echo", "unsupported_parameter"),
    ("/v1/completions", {**COMPLETION, "suffix": "end"}, "suffix", "unsupported_parameter"),
    ("/v1/completions", {**COMPLETION, "best_of": 3}, "best_of", "unsupported_parameter"),
    ("/v1/completions", {**COMPLETION, "prompt": []}, "prompt", "invalid_value"),
    ("/v1/completions", {**COMPLETION, "prompt": 5}, "prompt", "invalid_value"),
    ("/v1/completions", {**COMPLETION, "prompt": [5, 99999]}, "prompt", "invalid_value"),
    ("/v1/completions", {"prompt": "hi"}, "model", "invalid_value"),
    ("/v1/completions", b'{"model": "@MODEL@", "prompt": "a lone \\ud800 surrogate"}', "prompt", "invalid_value"),
    ("/v1/chat/completions", b'{"model": "@MODEL@", "messages": [{"role": "user", "content": "\\udfff"}]}',
     "messages", "invalid_value"),
    ("/v1/embeddings", {**EMBEDDING, "logprobs": 1}, "logprobs", "unknown_parameter"),
    ("/v1/embeddings", {**EMBEDDING, "encoding_format": "int8"}, "encoding_format", "invalid_value"),
    ("/v1/embeddings", {**EMBEDDING, "input": []}, "input", "invalid_value"),
    ("/v1/embeddings", {**EMBEDDING, "dimensions": 7}, "dimensions", "invalid_value"),
]


def _fill(body, model_id: str):
    if isinstance(body, bytes):
        return body.replace(b"@MODEL@", model_id.encode())
    return {k: model_id if v is M else v for k, v in body.items()}


def _assert_error(status: int, body: dict, expected_status: int, param, code) -> None:
    assert status == expected_status, body
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    assert body["error"]["message"] and (body["error"]["param"], body["error"]["code"]) == (param, code), body


@pytest.mark.parametrize("path,body,param,code", BAD_REQUESTS,
                         ids=[f"{p.rsplit('/', 1)[-1]}-{param or code}-{i}" for i, (p, _, param, code)
                              in enumerate(BAD_REQUESTS)])
def test_bad_requests_are_400_naming_the_parameter(server, mid, path, body, param, code):
    status, answer = request(server.url, "POST", path, _fill(body, mid))
    _assert_error(status, answer, 400, param, code)
    assert answer["error"]["type"] == "invalid_request_error"


def test_after_every_bad_request_the_server_still_answers(server, mid, tiny):
    for path, body, _, _ in BAD_REQUESTS:
        request(server.url, "POST", path, _fill(body, mid))
    assert server.alive() and server.wait_idle()["active"] == 0
    r = server.client().completions.create(model=mid, prompt=PROMPTS[0], max_tokens=5, temperature=0)
    assert r.choices[0].text == tiny.generate(PROMPTS[0], max_tokens=5).text


def test_harmless_fields_are_accepted(server, mid):
    status, body = request(server.url, "POST", "/v1/chat/completions",
                           {**_fill(CHAT, mid), "user": "u1", "metadata": {"k": "v"}, "store": False,
                            "response_format": {"type": "text"}})
    assert status == 200, body


def test_prompts_longer_than_the_context_are_400_context_length_exceeded(server, mid, tiny):
    too_long = [5] * (tiny.n_ctx + 1)
    for path, body, param in [("/v1/completions", {**COMPLETION, "prompt": too_long}, "prompt"),
                              ("/v1/chat/completions", {**CHAT, "messages": [
                                  {"role": "user", "content": "the license " * tiny.n_ctx}]}, "messages"),
                              ("/v1/embeddings", {**EMBEDDING, "input": [too_long]}, "input")]:
        status, answer = request(server.url, "POST", path, _fill(body, mid))
        _assert_error(status, answer, 400, param, "context_length_exceeded")


def test_an_unknown_model_is_404_and_the_served_names_are_accepted(server, mid, tiny_folder):
    for path, body in [("/v1/chat/completions", CHAT), ("/v1/completions", COMPLETION), ("/v1/embeddings", EMBEDDING)]:
        status, answer = request(server.url, "POST", path, _fill(body, "gpt-4o"))
        _assert_error(status, answer, 404, "model", "model_not_found")
    for name in (mid, tiny_folder):
        assert request(server.url, "POST", "/v1/completions", _fill(COMPLETION, name))[0] == 200
    status, answer = request(server.url, "GET", "/v1/models/gpt-4o")
    _assert_error(status, answer, 404, "model", "model_not_found")
    status, answer = request(server.url, "GET", "/v1/nothing-here")
    assert status == 404 and set(answer["error"]) == {"message", "type", "param", "code"}


def test_an_exception_in_a_handler_is_a_500_in_openais_shape_without_its_text_and_the_server_goes_on(tiny_folder):
    import uvicorn

    from pyllm.server import create_app

    model = pyllm.load(tiny_folder)

    def broken(messages, chat_template=None, tools=None):
        raise RuntimeError("the template engine broke")

    model.render_chat = broken
    port = free_port()
    uv = uvicorn.Server(uvicorn.Config(create_app(model, "tiny"), host="127.0.0.1", port=port, log_level="critical"))
    thread = threading.Thread(target=uv.run)
    thread.start()
    try:
        while not uv.started:
            assert thread.is_alive()
            time.sleep(0.02)
        url = f"http://127.0.0.1:{port}"
        status, body = request(url, "POST", "/v1/chat/completions", _fill(CHAT, "tiny"))
        assert status == 500 and body["error"]["type"] == "server_error"
        assert "broke" not in body["error"]["message"] and "RuntimeError" not in body["error"]["message"]
        assert request(url, "POST", "/v1/completions", _fill(COMPLETION, "tiny"))[0] == 200
    finally:
        uv.should_exit = True
        thread.join()


# ---- clients that go away, and load ------------------------------------------------------------------


def test_a_client_that_drops_a_stream_frees_its_slot(server, mid, tiny):
    # 4000 tokens take this server seconds; the slot must come back long before that
    conn, resp = open_stream(server.url, "/v1/completions", {"model": mid, "prompt": PROMPTS[0], "max_tokens": 4000,
                                                             "temperature": 0, "logit_bias": NO_EOS})
    assert len(read_events(resp, 3)) == 3
    assert server.health()["active"] == 1
    drop(conn)
    assert server.wait_idle(timeout=3)["active"] == 0
    r = server.client().completions.create(model=mid, prompt=PROMPTS[0], max_tokens=5, temperature=0)
    assert r.choices[0].text == tiny.generate(PROMPTS[0], max_tokens=5).text


def test_a_client_killed_while_waiting_for_a_whole_answer_frees_its_slot(server, mid):
    conn = send_only(server.url, "/v1/chat/completions",
                     {"model": mid, "messages": chat_messages("Talk."), "max_tokens": 4000, "temperature": 0,
                      "logit_bias": NO_EOS})
    deadline = time.monotonic() + 10
    while server.health()["active"] == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    drop(conn)
    assert server.wait_idle(timeout=3)["active"] == 0


def test_clients_killed_at_random_during_a_load_run_leave_no_stuck_slot(server, mid, tiny):
    rng = random.Random(0)
    plans = [(rng.choice(["drop-stream", "drop-wait", "finish"]), rng.choice([30, 300]), rng.randint(0, 12), i)
             for i in range(40)]

    def one(plan):
        what, max_tokens, events, i = plan
        body = {"model": mid, "max_tokens": max_tokens, "temperature": 0, "logit_bias": NO_EOS}
        path = "/v1/completions" if i % 2 else "/v1/chat/completions"
        body.update({"prompt": PROMPTS[i % 4]} if i % 2 else {"messages": chat_messages(PROMPTS[i % 4])})
        if what == "drop-wait":
            conn = send_only(server.url, path, body)
            time.sleep(events / 100)
            drop(conn)
            return None
        conn, resp = open_stream(server.url, path, body)
        got = read_events(resp, events if what == "drop-stream" else 10**6)
        drop(conn)
        return got[-1] if what == "finish" else None

    with ThreadPoolExecutor(12) as pool:
        ends = list(pool.map(one, plans))
    assert all(end == "[DONE]" for end, plan in zip(ends, plans) if plan[0] == "finish")
    health = server.wait_idle(timeout=10)
    assert (health["active"], health["queued"]) == (0, 0)
    r = server.client().completions.create(model=mid, prompt=PROMPTS[1], max_tokens=5, temperature=0)
    assert r.choices[0].text == tiny.generate(PROMPTS[1], max_tokens=5).text


def test_200_requests_16_at_a_time_each_get_what_they_would_alone(server, tiny, mid):
    text = english_text()
    prompts = PROMPTS + [text[1000:1000 + n] for n in (300, 1200)]  # up to a few hundred tokens
    rng = random.Random(1)
    plans = [(rng.choice(["chat", "completion"]), rng.randrange(len(prompts)), rng.choice([1, 8, 32, 64]),
              rng.random() < 0.5) for _ in range(200)]
    expected = {}
    for kind, p, max_tokens, _ in plans:
        if (kind, p, max_tokens) not in expected:
            c = (tiny.chat(chat_messages(prompts[p]), max_tokens=max_tokens) if kind == "chat"
                 else tiny.generate(prompts[p], max_tokens=max_tokens))
            expected[kind, p, max_tokens] = (c.text, c.finish_reason)
    client = server.client()

    def one(plan):
        kind, p, max_tokens, stream = plan
        if kind == "chat":
            r = client.chat.completions.create(model=mid, messages=chat_messages(prompts[p]), max_tokens=max_tokens,
                                               temperature=0, stream=stream)
        else:
            r = client.completions.create(model=mid, prompt=prompts[p], max_tokens=max_tokens, temperature=0,
                                          stream=stream)
        if stream:
            chunks = list(r)
            return streamed_text(chunks, kind == "chat")[0], finish_reasons(chunks)[0]
        c = r.choices[0]
        return (c.message.content if kind == "chat" else c.text), c.finish_reason

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(one, plans))
    assert results == [expected[kind, p, m] for kind, p, m, _ in plans]
    assert server.wait_idle()["active"] == 0


def test_server_memory_stays_flat_over_2000_requests(server, mid):
    process = psutil.Process(server.proc.pid)
    client = server.client()

    def one(i):
        if i % 2:
            client.completions.create(model=mid, prompt=PROMPTS[i % 4], max_tokens=3, temperature=0)
        else:
            list(client.chat.completions.create(model=mid, messages=chat_messages(PROMPTS[i % 4]), max_tokens=3,
                                                temperature=0, stream=True))

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(one, range(300)))  # warm-up: caches, allocator arenas, lazily built objects
        before = process.memory_info().rss
        list(pool.map(one, range(2000)))
    after = process.memory_info().rss
    print(f"server RSS {before / 2**20:.1f} -> {after / 2**20:.1f} MiB over 2000 requests")
    assert after - before < 4 * 2**20, f"RSS grew by {(after - before) / 2**20:.1f} MiB over 2000 requests"


# ---- the API key, the queue, the extra ---------------------------------------------------------------


def test_the_api_key_is_required_except_for_health(guarded):
    status, body = request(guarded.url, "GET", "/v1/models")
    _assert_error(status, body, 401, None, "invalid_api_key")
    status, body = request(guarded.url, "POST", "/v1/completions", {"model": "x", "prompt": "hi"},
                           headers={"Authorization": "Bearer wrong"})
    _assert_error(status, body, 401, None, "invalid_api_key")
    with pytest.raises(openai.AuthenticationError):
        guarded.client(api_key="wrong").models.list()
    assert guarded.health()["status"] == "ok"
    client = guarded.client()
    mid = client.models.list().data[0].id
    assert client.completions.create(model=mid, prompt="hi", max_tokens=2).choices[0].text is not None


def test_a_full_queue_is_429_and_clears(guarded):
    auth = {"Authorization": "Bearer sekrit"}
    mid = guarded.client().models.list().data[0].id
    body = {"model": mid, "prompt": PROMPTS[0], "max_tokens": 4000, "temperature": 0, "logit_bias": NO_EOS}
    running, resp = open_stream(guarded.url, "/v1/completions", body, headers=auth)
    assert len(read_events(resp, 1)) == 1
    waiting, _ = open_stream(guarded.url, "/v1/completions", body, headers=auth)
    assert (guarded.health()["active"], guarded.health()["queued"]) == (1, 1)
    status, answer = request(guarded.url, "POST", "/v1/completions", {**body, "max_tokens": 2}, headers=auth)
    _assert_error(status, answer, 429, None, "queue_full")
    drop(running)
    drop(waiting)
    assert guarded.wait_idle(timeout=5)["active"] == 0
    assert guarded.client().completions.create(model=mid, prompt="hi", max_tokens=2).choices


def test_serve_without_the_server_extra_says_how_to_install_it(tiny_folder):
    code = ("import sys; sys.modules['fastapi'] = None; from pyllm.cli import main; "
            f"sys.exit(main(['serve', {tiny_folder!r}]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert 'pip install "pyllm[server]"' in out.stderr and "fastapi" in out.stderr


# ---- the real default model --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smol_server(smollm2_gguf):
    s = ServerProcess("smollm2", "--parallel", "2", "--n-ctx", "1024")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def smol(smollm2_gguf):
    return pyllm.load("smollm2", n_ctx=1024)


def test_smollm2_chat_equals_model_chat_streamed_and_not(smol_server, smol):
    client = smol_server.client()
    assert [m.id for m in client.models.list().data] == ["smollm2"]
    messages = [{"role": "user", "content": "Name the capital of France."}]
    expected = smol.chat(messages, max_tokens=16)
    assert "Paris" in expected.text
    r = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=16, temperature=0)
    assert (r.choices[0].message.content, r.choices[0].finish_reason) == (expected.text, expected.finish_reason)
    assert_usage(r.usage, expected.usage["prompt_tokens"], expected.usage["completion_tokens"])
    # the file's own name and the alias's long form name the same model
    chunks = list(client.chat.completions.create(model="SmolLM2-135M-Instruct.Q4_1", messages=messages,
                                                 max_tokens=16, temperature=0, stream=True))
    assert streamed_text(chunks, chat=True) == {0: expected.text}
    stop = expected.text.split()[2]
    cut = smol.chat(messages, max_tokens=16, stop=[stop])
    r = client.chat.completions.create(model="smollm2-135m-instruct", messages=messages, max_tokens=16,
                                       temperature=0, stop=stop)
    assert (r.choices[0].message.content, r.choices[0].finish_reason) == (cut.text, "stop")
