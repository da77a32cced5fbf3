"""`pyllm serve` against clients that try to stall or crash it: huge bodies, texts longer than any
context, abandoned embeddings, slow templates, requests that can never fit, unbounded max_tokens,
malformed JSON, half-sent requests, forged Host headers, and a shutdown with requests in flight.
Each answer is OpenAI's error shape, and the other clients go on being served meanwhile."""
from __future__ import annotations

import itertools
import json
import signal
import socket
import threading
import time

import numpy as np
import psutil
import pytest

import pyllm
from pyllm.errors import QueueFullError
from pyllm.sampling import SamplingParams
from pyllm.scheduler import Embedded, Engine, Scheduler

from server_helpers import (CHAT_TEMPLATE, ServerProcess, drop, make_tiny_chat_checkpoint, open_stream,
                            parse_answer, raw_exchange, read_events, request, send_only,
                            send_until_answered)

NO_EOS = {"1": -100}  # the tiny checkpoint's </s> never comes: it runs as long as max_tokens says
# A template with a slow path a client can take: lipsum builds megabytes of text for seconds.
HOSTILE_TEMPLATE = "{% if messages[-1]['content'] == 'HOSTILE' %}{{ lipsum(n=4000) }}{% endif %}" + CHAT_TEMPLATE
KEY = "k3y"


def assert_error(status: int, body: dict, expected_status: int, param, code) -> None:
    assert status == expected_status, body
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    assert body["error"]["message"] and (body["error"]["param"], body["error"]["code"]) == (param, code), body


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_tiny_chat_checkpoint(str(tmp_path_factory.mktemp("hostile")), HOSTILE_TEMPLATE)


@pytest.fixture(scope="module")
def tiny(folder):
    return pyllm.load(folder)


@pytest.fixture(scope="module")
def served(folder):
    """The default limits, two slots."""
    s = ServerProcess(folder, "--parallel", "2")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def strict(folder):
    """One slot, one waiting place, 1 MiB bodies, 1 s to send a request, 4 connections, a key."""
    s = ServerProcess(folder, "--parallel", "1", "--max-queue", "1", "--max-body-mb", "1", "--request-timeout", "1",
                      "--max-connections", "4", api_key=KEY)
    yield s
    s.stop()


def mid_of(server) -> str:
    return server.client().models.list().data[0].id


def timed(fn, *args, **kw):
    start = time.monotonic()
    out = fn(*args, **kw)
    return out, time.monotonic() - start


# ---- 1 and 6: large bodies, long texts, memory ------------------------------------------------------


def test_a_body_over_the_limit_is_413_before_it_is_read(strict):
    auth = f"Authorization: Bearer {KEY}\r\n"
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}Content-Type: application/json\r\n"
            f"Content-Length: {50 * 2**20}\r\n\r\n").encode()
    status, body = parse_answer(raw_exchange(strict.url, head + b'{"model": "x", "prompt": "' + b"word " * 1000))
    assert_error(status, body, 413, None, "request_too_large")
    chunked = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}Content-Type: application/json\r\n"
               f"Transfer-Encoding: chunked\r\n\r\n").encode()
    piece = b"word " * 100_000
    data = chunked + b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for _ in range(3))  # 1.5 MB, no length
    status, body = parse_answer(raw_exchange(strict.url, data))
    assert_error(status, body, 413, None, "request_too_large")
    assert strict.health()["status"] == "ok"


def test_a_text_longer_than_the_context_can_hold_is_refused_without_tokenizing(served, tiny):
    mid = mid_of(served)
    text = "word " * 1_000_000  # 5 MB: tokenizing it took the server 6 s
    for path, body, param in [("/v1/completions", {"model": mid, "prompt": text}, "prompt"),
                              ("/v1/completions", {"model": mid, "prompt": ["hi", text]}, "prompt"),
                              ("/v1/embeddings", {"model": mid, "input": text}, "input"),
                              ("/v1/chat/completions", {"model": mid, "messages": [{"role": "user", "content": text}]},
                               "messages")]:
        status, answer = request(served.url, "POST", path, body)
        assert_error(status, answer, 400, param, "context_length_exceeded")
        assert f"{len(text)} characters" in answer["error"]["message"]


def test_while_hostile_clients_are_in_flight_health_and_chat_answer_within_a_second(served, tiny):
    """A 50 MB body (sent without a length, so the server reads 8 MiB of it before refusing it),
    a 5 MB prompt, 8 embedding requests abandoned by their clients and 2 chats whose template takes
    its slow path, all at once: /health and a normal chat answer within 1 s each meanwhile, and the
    server's memory comes back to within 100 MB of where it was."""
    mid = mid_of(served)
    client = served.client()
    chat = [{"role": "user", "content": "hi"}]
    expected = tiny.chat(chat, max_tokens=4).text
    assert client.chat.completions.create(model=mid, messages=chat, max_tokens=4, temperature=0
                                          ).choices[0].message.content == expected
    client.embeddings.create(model=mid, input="warm up")
    process = psutil.Process(served.proc.pid)
    rss_before = process.memory_info().rss
    results: dict = {}

    def big_body():
        head = (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n")
        piece = b"word " * 50_000
        chunks = (b"%x\r\n%s\r\n" % (len(piece), piece) for _ in range(200))  # 50 MB
        results["big"] = parse_answer(send_until_answered(served.url, itertools.chain([head], chunks)))

    def long_prompt():
        results["long"] = request(served.url, "POST", "/v1/completions", {"model": mid, "prompt": "word " * 1_000_000})

    def hostile_chat(i):
        results[f"hostile{i}"] = request(served.url, "POST", "/v1/chat/completions",
                                         {"model": mid, "messages": [{"role": "user", "content": "HOSTILE"}]})

    long_input = " ".join(f"word{i % 50}" for i in range(200))  # about 1,000 tokens
    abandoned = [send_only(served.url, "/v1/embeddings", {"model": mid, "input": [long_input] * 8}) for _ in range(8)]
    load = [threading.Thread(target=big_body), threading.Thread(target=long_prompt)]
    load += [threading.Thread(target=hostile_chat, args=(i,)) for i in range(2)]
    for t in load:
        t.start()
    time.sleep(0.2)
    for conn in abandoned:
        drop(conn)
    probes = []
    while any(t.is_alive() for t in load) or not probes:
        health, health_s = timed(request, served.url, "GET", "/health", timeout=5)
        answer, chat_s = timed(client.with_options(timeout=5).chat.completions.create, model=mid, messages=chat,
                               max_tokens=4, temperature=0)
        probes.append((health[0], health_s, answer.choices[0].message.content, chat_s))
    for t in load:
        t.join()
    print("probes (health status, s, chat, s):", [(p[0], round(p[1], 3), round(p[3], 3)) for p in probes])
    assert all(status == 200 and health_s < 1 and text == expected and chat_s < 1
               for status, health_s, text, chat_s in probes), probes
    assert_error(*results["big"], 413, None, "request_too_large")
    assert_error(*results["long"], 400, "prompt", "context_length_exceeded")
    for i in range(2):
        status, body = results[f"hostile{i}"]
        assert status == 400 and body["error"]["code"] in ("context_length_exceeded", "invalid_value"), body
    health = served.wait_idle(timeout=20)
    assert (health["active"], health["queued"]) == (0, 0)
    deadline = time.monotonic() + 10
    while process.memory_info().rss - rss_before > 100 * 2**20 and time.monotonic() < deadline:
        time.sleep(0.2)
    rss_after = process.memory_info().rss
    print(f"server RSS {rss_before / 2**20:.0f} -> {rss_after / 2**20:.0f} MiB")
    assert rss_after - rss_before < 100 * 2**20


# ---- 2: embeddings wait in the queue ----------------------------------------------------------------


def test_embedding_inputs_are_queued_counted_and_cancelled_at_once(tiny):
    engine = Engine(tiny, max_queue=2)
    got = []
    ids = [tiny.tokenize(t) for t in ("a cat", "the license")]
    first = engine.submit_embedding(ids[0], on_event=got.append)
    engine.submit_embedding(ids[1], on_event=got.append)
    assert engine.queued == 2
    with pytest.raises(QueueFullError):
        engine.submit_embedding(ids[0], on_event=got.append)
    for _ in range(engine.slots):  # a generation may still take a free slot
        engine.submit(ids[0], sampling=SamplingParams(), max_tokens=2, on_event=got.append)
    with pytest.raises(QueueFullError):  # generations and embeddings share the queue
        engine.submit(ids[0], sampling=SamplingParams(), max_tokens=2, on_event=got.append)
    engine.cancel(first)
    assert engine.queued == 1 + engine.slots  # its place is free at once, not at the next step
    while engine.busy():
        engine.step()
    embedded = [e for e in got if isinstance(e, Embedded)]
    assert len(embedded) == 1
    np.testing.assert_allclose(embedded[0].vector, tiny.embed("the license"), atol=1e-6)


def test_an_embeddings_request_with_more_inputs_than_the_queue_is_400(strict):
    mid = mid_of(strict)
    status, body = request(strict.url, "POST", "/v1/embeddings", {"model": mid, "input": ["a", "b"]},
                           headers={"Authorization": f"Bearer {KEY}"})
    assert_error(status, body, 400, "input", "invalid_value")
    status, body = request(strict.url, "POST", "/v1/embeddings", {"model": mid, "input": ["a"]},
                           headers={"Authorization": f"Bearer {KEY}"})
    assert status == 200 and len(body["data"]) == 1


# ---- 4: requests that can never fit ----------------------------------------------------------------


def test_a_request_with_more_jobs_than_slots_plus_queue_is_400_not_429(strict):
    auth = {"Authorization": f"Bearer {KEY}"}
    mid = mid_of(strict)
    for extra, param in [({"prompt": ["a"] * 3}, "prompt"), ({"prompt": "a", "n": 3}, "n")]:
        status, body = request(strict.url, "POST", "/v1/completions", {"model": mid, "max_tokens": 2, **extra},
                               headers=auth)
        assert_error(status, body, 400, param, "invalid_value")
    status, body = request(strict.url, "POST", "/v1/completions", {"model": mid, "max_tokens": 2, "prompt": ["a"] * 2},
                           headers=auth)
    assert status == 200 and len(body["choices"]) == 2


def test_a_cancelled_job_leaves_the_queue_at_once(tiny):
    scheduler = Scheduler(tiny, max_queue=1)  # not started: nothing steps the engine
    job = scheduler.submit(tiny.tokenize("hi"), sampling=SamplingParams(), max_tokens=2, on_event=print)
    scheduler.cancel(job)
    assert scheduler.queued == 0
    scheduler.submit(tiny.tokenize("hi"), sampling=SamplingParams(), max_tokens=2, on_event=print)
    assert scheduler.queued == 1


# ---- 5: max_tokens past the context ----------------------------------------------------------------


def test_max_tokens_past_the_end_of_the_context_is_400_context_length_exceeded(served, tiny):
    mid = mid_of(served)
    messages = [{"role": "user", "content": "hi"}]
    for path, body, param in [
            ("/v1/completions", {"model": mid, "prompt": "hi", "max_tokens": 10**12}, "prompt"),
            ("/v1/completions", {"model": mid, "prompt": "hi", "max_tokens": 10**30}, "prompt"),
            ("/v1/completions", {"model": mid, "prompt": ["a", "b"], "max_tokens": tiny.n_ctx}, "prompt"),
            ("/v1/chat/completions", {"model": mid, "messages": messages, "max_tokens": tiny.n_ctx}, "messages"),
            ("/v1/chat/completions", {"model": mid, "messages": messages, "max_completion_tokens": 10**12},
             "messages")]:
        status, answer = request(served.url, "POST", path, body)
        assert_error(status, answer, 400, param, "context_length_exceeded")
        assert f"maximum context length is {tiny.n_ctx} tokens" in answer["error"]["message"]
    prompt = [5] * (tiny.n_ctx - 4)  # what is left of the context may be asked for, and no more
    status, answer = request(served.url, "POST", "/v1/completions", {"model": mid, "prompt": prompt, "max_tokens": 5})
    assert_error(status, answer, 400, "prompt", "context_length_exceeded")
    status, answer = request(served.url, "POST", "/v1/completions",
                             {"model": mid, "prompt": prompt, "max_tokens": 4, "temperature": 0, "logit_bias": NO_EOS})
    assert status == 200 and answer["usage"]["completion_tokens"] == 4


# ---- 8: bad bodies, connections, hosts, keys -------------------------------------------------------


@pytest.mark.parametrize("body,param,code", [
    (b'{"model": "M", "prompt": "hi", "stop": ["\\ud800"]}', "stop", "invalid_value"),
    (b'{"model": "M", "prompt": "hi", "stop": "a\\udfffb"}', "stop", "invalid_value"),
    (b'{"model": "M", "prompt": "caf\xe9"}', None, "invalid_json"),  # Latin-1, not UTF-8
    (b"[" * 100_000 + b"]" * 100_000, None, "invalid_json"),
    (b'{"model": "M", "prompt": "hi", "max_tokens": 1' + b"0" * 5000 + b"}", None, "invalid_json"),
    (b"", None, "invalid_json"),
], ids=["stop-surrogate", "stop-inner-surrogate", "invalid-utf8", "nested-100k", "5000-digits", "empty"])
def test_unreadable_bodies_are_400_in_openais_shape_with_a_code(served, body, param, code):
    status, answer = request(served.url, "POST", "/v1/completions", body.replace(b'"M"', json.dumps(mid_of(served)).encode()))
    assert_error(status, answer, 400, param, code)


def test_idle_and_half_sent_requests_are_closed_after_the_request_timeout(strict):
    host, port = strict.url.removeprefix("http://").split(":")
    half = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {KEY}\r\n"
            f"Content-Length: 100\r\n\r\n" + "{" * 10).encode()
    for sent in (b"", b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n", half):
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(sent)
            start = time.monotonic()
            assert sock.recv(4096) == b""  # closed by the server, not by this timeout
            assert time.monotonic() - start < 9


def test_past_max_connections_requests_are_503(strict):
    host, port = strict.url.removeprefix("http://").split(":")
    idle = [socket.create_connection((host, int(port))) for _ in range(4)]
    try:
        status = int(raw_exchange(strict.url, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").split()[1])
        assert status == 503
    finally:
        for sock in idle:
            sock.close()
    deadline = time.monotonic() + 5
    while True:  # the server sees the closes a moment later
        status = int(raw_exchange(strict.url, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").split()[1])
        if status == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert status == 200


def test_only_localhost_names_are_answered_on_loopback(strict):
    port = strict.url.rsplit(":", 1)[1]
    auth = {"Authorization": f"Bearer {KEY}"}
    for host in ("evil.example", f"evil.example:{port}", "127.0.0.1.nip.io", "10.0.0.1"):
        status, body = request(strict.url, "GET", "/v1/models", headers={**auth, "Host": host})
        assert_error(status, body, 400, None, "invalid_host")
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", "LOCALHOST"):
        assert request(strict.url, "GET", "/v1/models", headers={**auth, "Host": host})[0] == 200


def test_the_authorization_scheme_is_case_insensitive(strict):
    for given in (f"bearer {KEY}", f"BEARER {KEY}", f"Bearer  {KEY}"):
        assert request(strict.url, "GET", "/v1/models", headers={"Authorization": given})[0] == 200
    for given in (KEY, f"Basic {KEY}", f"bearer {KEY}x", "bearer"):
        status, body = request(strict.url, "GET", "/v1/models", headers={"Authorization": given})
        assert_error(status, body, 401, None, "invalid_api_key")


# ---- 3: shutdown with requests in flight -----------------------------------------------------------


@pytest.fixture(scope="module")
def deep(tmp_path_factory):
    """The tiny checkpoint with 32k positions: a 4000-token stream of it could end inside the grace
    on a fast machine; 30,000 tokens, each attending over all before it, cannot."""
    return make_tiny_chat_checkpoint(str(tmp_path_factory.mktemp("deep")), HOSTILE_TEMPLATE, positions=32768)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_shutdown_lets_running_requests_finish_then_answers_503(deep, sig):
    server = ServerProcess(deep, "--parallel", "6", "--n-ctx", "32768", "--shutdown-grace", "3", "--log-level", "info")
    try:
        mid = mid_of(server)
        long = {"model": mid, "max_tokens": 30000, "temperature": 0, "logit_bias": NO_EOS}
        streams = []
        for i in range(4):
            path, extra = (("/v1/completions", {"prompt": "the license"}) if i % 2 else
                           ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Talk."}]}))
            conn, resp = open_stream(server.url, path, {**long, **extra})
            assert len(read_events(resp, 2)) == 2
            streams.append((conn, resp))
        short = send_only(server.url, "/v1/completions", {**long, "prompt": "b", "max_tokens": 40})
        waiting = [send_only(server.url, "/v1/completions", {**long, "prompt": "a"}) for _ in range(4)]
        deadline = time.monotonic() + 10
        while server.health()["queued"] < 3 and time.monotonic() < deadline:  # 6 running, 3 waiting
            time.sleep(0.02)
        server.proc.send_signal(sig)
        time.sleep(0.3)
        refused = None
        try:
            refused = request(server.url, "POST", "/v1/completions", {"model": mid, "prompt": "c", "max_tokens": 2},
                              timeout=5)
        except OSError:  # the listening socket is closed: no new connection gets in
            pass
        assert refused is None or refused[0] == 503
        for conn, resp in streams:
            events = read_events(resp, 10**6)
            assert events[-1] == "[DONE]"
            error = json.loads(events[-2])
            assert error["error"]["code"] == "server_shutting_down" and error["error"]["type"] == "server_error"
            conn.close()
        for conn in waiting:
            resp = conn.getresponse()
            assert_error(resp.status, json.loads(resp.read()), 503, None, "server_shutting_down")
        resp = short.getresponse()
        body = json.loads(resp.read())
        assert resp.status == 200 and body["usage"]["completion_tokens"] == 40  # ran to its end in the grace
        server.proc.wait(20)
        log = server.output()
        assert "Traceback" not in log and "Exception in ASGI" not in log, log
    finally:
        server.stop()
