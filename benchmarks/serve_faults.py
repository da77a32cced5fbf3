"""Hostile clients against `pyllm serve smollm2` (the default limits, but --request-timeout 5): for each
case the answer, whether it is a clear OpenAI-shaped error (a code), whether the server crashed (exited
or answered 500) or hung (over 30 s, or /health slower than 1 s meanwhile), the slowest /health during
the case and the server's RSS after it. The last case sends SIGTERM with requests in flight.

    python benchmarks/serve_faults.py    # about 3 minutes on an idle 2-core machine
"""
import itertools
import json
import os
import signal
import socket
import sys
import threading
import time

import psutil

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from server_helpers import (ServerProcess, drop, open_stream, parse_answer, read_events, request,  # noqa: E402
                            send_only, send_until_answered)

s = ServerProcess("smollm2", "--parallel", "4", "--n-ctx", "2048", "--request-timeout", "5", "--log-level", "info")
proc = psutil.Process(s.proc.pid)
M = "smollm2"
rows = []
probe = {"max": 0.0, "fail": 0, "on": False}

def prober():
    while True:
        if probe["on"]:
            t = time.monotonic()
            try:
                if not s.alive():
                    raise OSError("exited")
                request(s.url, "GET", "/health", timeout=60)
                probe["max"] = max(probe["max"], time.monotonic() - t)
            except Exception:
                probe["fail"] += 1
        time.sleep(0.1)
threading.Thread(target=prober, daemon=True).start()
rss0 = proc.memory_info().rss

def case(name, fn):
    probe["max"], probe["fail"], probe["on"] = 0.0, 0, True
    t = time.monotonic()
    try:
        status, body = fn()
    except Exception as e:
        status, body = "exc", {"exception": repr(e)[:100]}
    dt = time.monotonic() - t
    time.sleep(0.5)
    probe["on"] = False
    err = body.get("error") if isinstance(body, dict) else None
    clear = isinstance(err, dict) and set(err) == {"message", "type", "param", "code"} and err["code"] is not None
    crash = (not s.alive() and "SIGTERM" not in name) or status == 500
    try:
        rss = proc.memory_info().rss // 2**20
    except psutil.NoSuchProcess:
        rss = "exited"
    rows.append((name, status, err["code"] if clear else (body if status != 200 else "ok"), clear, crash,
                 dt > 30 or probe["max"] > 1, round(dt, 2), round(probe["max"], 3), rss))
    print(rows[-1], flush=True)

def post(path, body, **kw):
    return request(s.url, "POST", path, body, timeout=60, **kw)

def big(path, field, mb, chunked=False):
    text = "word " * (mb * 2**20 // 5)
    body = json.dumps({"model": M, field: text}).encode()
    if chunked:
        head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
        pieces = itertools.chain([head], (b"%x\r\n%s\r\n" % (len(body[i:i+2**18]), body[i:i+2**18]) for i in range(0, len(body), 2**18)), [b"0\r\n\r\n"])
    else:
        head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        pieces = [head] + [body[i:i+2**18] for i in range(0, len(body), 2**18)]
    return lambda: parse_answer(send_until_answered(s.url, pieces, timeout=120))

case("50 MB prompt, /v1/completions", big("/v1/completions", "prompt", 50))
case("50 MB input, /v1/embeddings", big("/v1/embeddings", "input", 50))
case("50 MB prompt, chunked (no length)", big("/v1/completions", "prompt", 50, chunked=True))
case("5 MB prompt", lambda: post("/v1/completions", {"model": M, "prompt": "word " * 1_000_000}))
case("7 MB of token ids (1M)", lambda: post("/v1/completions", {"model": M, "prompt": [5] * 1_000_000}))
case("2M token ids (14 MB)", lambda: post("/v1/completions", {"model": M, "prompt": [5] * 2_000_000}))
text1000 = " ".join(["the license"] * 500)
def abandoned():
    conn = send_only(s.url, "/v1/embeddings", {"model": M, "input": [text1000] * 8})
    time.sleep(3); drop(conn)
    return post("/v1/completions", {"model": M, "prompt": "hi", "max_tokens": 4})
case("8 x 1000-token embeddings, client gone after 3 s; then a completion", abandoned)
case("16 x 1000-token embeddings", lambda: post("/v1/embeddings", {"model": M, "input": [text1000] * 16}))
case("prompt ['a'] * 69", lambda: post("/v1/completions", {"model": M, "prompt": ["a"] * 69, "max_tokens": 2}))
case("next request after it", lambda: post("/v1/completions", {"model": M, "prompt": "hi", "max_tokens": 2}))
case("n=16 x 16 prompts", lambda: post("/v1/completions", {"model": M, "prompt": ["a"] * 16, "n": 16, "max_tokens": 2}))
case("max_tokens 10^12", lambda: post("/v1/completions", {"model": M, "prompt": "hi", "max_tokens": 10**12}))
case("max_tokens 10^30", lambda: post("/v1/chat/completions", {"model": M, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10**30}))
case("lone surrogate in stop", lambda: post("/v1/completions", b'{"model": "smollm2", "prompt": "hi", "stop": ["\\ud800"]}'))
case("invalid UTF-8 body", lambda: post("/v1/completions", b'{"model": "smollm2", "prompt": "caf\xe9"}'))
case("JSON nested 100k deep", lambda: post("/v1/completions", b"[" * 100_000 + b"]" * 100_000))
case("5,000-digit integer", lambda: post("/v1/completions", b'{"model": "smollm2", "prompt": "hi", "max_tokens": 1' + b"0" * 5000 + b"}"))
def idle(data):
    def run():
        host, port = s.url[7:].split(":")
        with socket.create_connection((host, int(port)), timeout=60) as sock:
            sock.sendall(data)
            t = time.monotonic(); got = sock.recv(100)
            return ("closed" if got == b"" else got[:12]), {"error": {"message": f"closed after {time.monotonic() - t:.1f} s", "type": "-", "param": None, "code": "connection_closed"}}
    return run
case("idle connection (--request-timeout 5)", idle(b""))
case("half-sent body", idle(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{"))
case("Host: evil.example (DNS rebinding)", lambda: request(s.url, "GET", "/v1/models", headers={"Host": "evil.example"}))
def many():
    host, port = s.url[7:].split(":")
    socks = [socket.create_connection((host, int(port))) for _ in range(300)]
    try:
        answer = send_until_answered(s.url, [b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"])
        return int(answer.split()[1]), {"error": {"message": answer.split(b"\r\n")[0].decode(), "type": "-", "param": None, "code": "service_unavailable"}}
    finally:
        for x in socks: x.close()
case("300 idle connections, then a request", many)
def shutdown():
    long = {"model": M, "max_tokens": 1500, "temperature": 0, "logit_bias": {"2": -100}}
    streams = []
    for i in range(4):
        conn, resp = open_stream(s.url, "/v1/completions", {**long, "prompt": f"story {i}"})
        read_events(resp, 1); streams.append(resp)
    plain = [send_only(s.url, "/v1/completions", {**long, "prompt": f"tale {i}"}) for i in range(4)]
    time.sleep(0.5)
    s.proc.send_signal(signal.SIGTERM)
    ends = [read_events(r, 10**6)[-2:] for r in streams]
    codes = [c.getresponse().status for c in plain]
    s.proc.wait(60)
    log = s.output()
    ok = all(e[-1] == "[DONE]" and "server_shutting_down" in e[0] for e in ends) and codes == [503] * 4
    return (f"streams: error+[DONE] x{sum(e[-1] == '[DONE]' for e in ends)}, plain {codes}, exit {s.proc.returncode}, "
            f"tracebacks {log.count('Traceback')}"), ({"error": {"message": "", "type": "", "param": None, "code": "server_shutting_down"}} if ok else {})
rss_before_shutdown = proc.memory_info().rss // 2**20
print("RSS at start", rss0 // 2**20, "MiB; before shutdown", rss_before_shutdown, "MiB", flush=True)
try:
    case("SIGTERM with 4 streams + 4 plain in flight (grace 10 s)", shutdown)
except Exception as e:
    print("shutdown case", e)
print()
print("| case | answer | clear error | crash | hang | s | slowest /health s | RSS MiB after |")
print("|---|---|---|---|---|---|---|---|")
for r in rows:
    print("| " + " | ".join(str(x) for x in r) + " |")
s.stop()
