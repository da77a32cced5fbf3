"""`pyllm serve` as a person meets it: a port already taken, a model without a chat template and
--chat-template, and the server's messages in the words of an HTTP client."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

import pyllm

from conftest import make_tiny_checkpoint
from server_helpers import CHAT_TEMPLATE, ServerProcess, request

pytest.importorskip("fastapi")


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    """The tiny random Llama, which has no chat template (as gemma3, a base model, has none)."""
    return make_tiny_checkpoint(str(tmp_path_factory.mktemp("serve")))


@pytest.fixture(scope="module")
def app_client(tiny_folder):
    """(chat_template or None) -> a TestClient of the app serving the tiny model with it."""
    from fastapi.testclient import TestClient

    from pyllm.server import create_app

    model = pyllm.load(tiny_folder, n_ctx=64)
    clients = []

    def make(chat_template=None):
        # a localhost name: the app answers only those when it is not told other hosts
        client = TestClient(create_app(model, "tiny", chat_template=chat_template), base_url="http://localhost")
        client.__enter__()  # runs the lifespan: the scheduler's thread
        clients.append(client)
        return client
    yield make
    for client in clients:
        client.__exit__(None, None, None)


def chat(client, messages, **fields):
    r = client.post("/v1/chat/completions", json={"model": "tiny", "messages": messages, "max_tokens": 4,
                                                  "temperature": 0, **fields})
    return r.status_code, r.json()


def test_a_port_in_use_is_one_line_and_exit_status_3_before_anything_loads(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run([sys.executable, "-m", "pyllm", "serve", str(tmp_path / "no-model"), "--port", str(port)],
                             capture_output=True, text=True, timeout=120)
    assert out.returncode == 3
    assert out.stderr == (f"pyllm: error: cannot listen on 127.0.0.1 port {port}: the port is in use (another "
                          f"server?): choose another with --port\n")  # no banner, no model loaded, no traceback
    assert out.stdout == ""


def test_a_port_out_of_range_is_refused_by_the_argument_parser(tmp_path):
    out = subprocess.run([sys.executable, "-m", "pyllm", "serve", "--port", "70000"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2 and "must be a port number from 1 to 65535" in out.stderr


def test_chat_without_a_template_is_a_400_that_names_the_servers_option(app_client):
    status, body = chat(app_client(), [{"role": "user", "content": "Hi"}])
    assert status == 400 and body["error"]["param"] == "messages"
    message = body["error"]["message"]
    assert "has no chat template" in message and "pyllm serve --chat-template FILE" in message
    assert "/v1/completions" in message
    assert "chat_template=" not in message  # Python's advice, not an HTTP client's


def test_a_chat_template_given_to_the_server_renders_the_messages_as_model_chat(app_client, tiny_folder):
    messages = [{"role": "user", "content": "the license"}]
    status, body = chat(app_client(CHAT_TEMPLATE), messages)
    assert status == 200, body
    want = pyllm.load(tiny_folder, n_ctx=64).chat(messages, chat_template=CHAT_TEMPLATE, max_tokens=4)
    assert body["choices"][0]["message"]["content"] == want.text


def test_an_image_part_gets_one_plain_sentence(app_client):
    content = [{"type": "text", "text": "What is this?"},
               {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]
    status, body = chat(app_client(CHAT_TEMPLATE), [{"role": "user", "content": content}])
    assert status == 400
    assert body["error"]["message"] == (
        "messages[0].content[1] is a part of type 'image_url': this server runs a text-only model, whose "
        "messages hold text (a string, or parts of type 'text')")
    assert body["error"]["param"] == "messages"


def test_too_long_messages_are_worded_in_the_plural(app_client):
    status, body = chat(app_client(CHAT_TEMPLATE), [{"role": "user", "content": "word " * 200}])
    assert status == 400 and body["error"]["code"] == "context_length_exceeded"
    message = body["error"]["message"]  # refused by its characters before it is tokenized
    assert "but the messages have 1000 characters" in message and " has " not in message
    status, body = chat(app_client(CHAT_TEMPLATE), [{"role": "user", "content": "word " * 40}])
    assert status == 400 and body["error"]["code"] == "context_length_exceeded"
    assert "but the messages make " in body["error"]["message"] and " has " not in body["error"]["message"]


def test_serve_takes_a_chat_template_file_and_counts_its_slots(tiny_folder, tmp_path):
    template = tmp_path / "chat.jinja"
    template.write_text(CHAT_TEMPLATE)
    server = ServerProcess(tiny_folder, "--chat-template", str(template), "--parallel", "1")
    try:
        status, body = request(server.url, "POST", "/v1/chat/completions",
                               {"model": os.path.basename(tiny_folder), "max_tokens": 2,
                                "messages": [{"role": "user", "content": "Hi"}]})
        assert status == 200, body
        assert "(1 slot, " in server.output()
    finally:
        server.stop()
    missing = subprocess.run([sys.executable, "-m", "pyllm", "serve", tiny_folder, "--chat-template",
                              str(tmp_path / "none.jinja")], capture_output=True, text=True, timeout=120)
    assert missing.returncode == 1 and "cannot read --chat-template" in missing.stderr
