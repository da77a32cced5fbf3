"""A `pyllm serve` subprocess on a free port of 127.0.0.1, and plain HTTP beside the openai client
(for what the client would not send: malformed JSON, wrong types, a connection dropped mid-stream)."""
from __future__ import annotations

import http.client
import json
import os
import select
import socket
import subprocess
import sys
import tempfile
import time

import openai

from conftest import make_tiny_checkpoint

# A ChatML-like template, so the tiny random checkpoints can chat.
CHAT_TEMPLATE = ("{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
                 "{% if add_generation_prompt %}<s>assistant\n{% endif %}")


def make_tiny_chat_checkpoint(folder: str, chat_template: str = CHAT_TEMPLATE, positions: int = 4096) -> str:
    """The tiny random Llama of conftest with a chat template and 4096 positions unless told (so a
    stream can run long enough to be cut off by its client)."""
    make_tiny_checkpoint(folder, max_position_embeddings=positions)
    path = os.path.join(folder, "tokenizer_config.json")
    with open(path) as f:
        config = json.load(f)
    config["chat_template"] = chat_template
    with open(path, "w") as f:
        json.dump(config, f)
    return folder


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """`python -m pyllm serve MODEL --port P *args`, up once /health answers."""

    def __init__(self, model: str, *args: str, api_key: str | None = None, timeout: float = 180):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.api_key = api_key
        self.log = tempfile.NamedTemporaryFile("w+", prefix="pyllm-serve-", suffix=".log", delete=False)
        cmd = [sys.executable, "-m", "pyllm", "serve", model, "--port", str(self.port), "--log-level", "warning",
               *args, *(["--api-key", api_key] if api_key else [])]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"pyllm serve exited with {self.proc.returncode}:\n{self.output()}")
            try:
                self.health()
                return
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"pyllm serve did not answer /health in {timeout} s:\n{self.output()}")
                time.sleep(0.1)

    def output(self) -> str:
        self.log.flush()
        with open(self.log.name) as f:
            return f.read()

    def client(self, **kw) -> openai.OpenAI:
        kw.setdefault("api_key", self.api_key or "unused")
        return openai.OpenAI(base_url=self.url + "/v1", max_retries=0, timeout=120, **kw)

    def health(self) -> dict:
        status, body = request(self.url, "GET", "/health")
        assert status == 200, body
        return body

    def wait_idle(self, timeout: float = 15) -> dict:
        """/health once no sequence holds a slot and none waits (or the last answer at the deadline)."""
        deadline = time.monotonic() + timeout
        while True:
            h = self.health()
            if (h["active"] == 0 and h["queued"] == 0) or time.monotonic() > deadline:
                return h
            time.sleep(0.05)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        os.unlink(self.log.name)


def request(url: str, method: str, path: str, body=None, headers: dict | None = None,
            timeout: float = 120) -> tuple[int, dict]:
    """(status, parsed JSON) of one request; body is sent as is when bytes, else as JSON."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"null")
    finally:
        conn.close()


def open_stream(url: str, path: str, body: dict, headers: dict | None = None
                ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    """A streamed request whose response headers have come: its events are read with read_events."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    conn.request("POST", path, body=json.dumps({**body, "stream": True}).encode(),
                 headers={"Content-Type": "application/json", **(headers or {})})
    resp = conn.getresponse()
    assert resp.status == 200, resp.read()
    return conn, resp


def read_events(resp: http.client.HTTPResponse, count: int) -> list[str]:
    """The data of the next count server-sent events."""
    events = []
    while len(events) < count:
        raw = resp.fp.readline()
        if not raw:  # the server closed the stream
            break
        line = raw.decode().strip()
        if line.startswith("data:"):
            events.append(line[5:].strip())
    return events


def send_only(url: str, path: str, body: dict) -> http.client.HTTPConnection:
    """A request sent whose answer is never read (a client that will be killed while it waits)."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    conn.request("POST", path, body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    return conn


def drop(conn: http.client.HTTPConnection) -> None:
    """Closes the connection at once, as a killed client would."""
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()


def raw_exchange(url: str, data: bytes, timeout: float = 30) -> bytes:
    """What the server sends back to data written on a fresh connection, until it closes it or
    has sent a whole answer."""
    return send_until_answered(url, [data], timeout)


def send_until_answered(url: str, pieces, timeout: float = 30) -> bytes:
    """Writes pieces on a fresh connection, stopping as soon as the server answers (a client that
    reads while it writes); returns the answer, read until the server closes or it is whole."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        for piece in pieces:
            if select.select([sock], [], [], 0)[0]:
                break
            try:
                sock.sendall(piece)
            except (BrokenPipeError, ConnectionResetError):  # the server answered and closed mid-body
                break
        answer = b""
        while True:
            try:
                part = sock.recv(65536)
            except ConnectionResetError:
                break
            if not part:
                break
            answer += part
            head, _, body = answer.partition(b"\r\n\r\n")
            length = [int(v) for k, _, v in (h.partition(b":") for h in head.split(b"\r\n")[1:])
                      if k.strip().lower() == b"content-length"]
            if length and len(body) >= length[0]:
                break
        return answer


def parse_answer(answer: bytes) -> tuple[int, dict]:
    """(status, parsed JSON body) of a raw HTTP answer."""
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)
