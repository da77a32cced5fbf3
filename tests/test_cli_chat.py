"""`pyllm chat`'s conversation: messages of several lines, /commands that never reach the model, and
a message too long for the context refused before any turn is dropped."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pexpect
import pytest

import pyllm

from conftest import make_tiny_checkpoint

TEMPLATE = "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}<assistant>"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("chat")
    make_tiny_checkpoint(str(folder))
    (folder / "chat.jinja").write_text(TEMPLATE)
    return folder


def chat(tiny, text: str, *args: str) -> subprocess.CompletedProcess:
    """pyllm chat on the tiny model with stdin from text (no terminal: one input() a line)."""
    return subprocess.run([sys.executable, "-m", "pyllm", "chat", str(tiny), "--chat-template",
                           str(tiny / "chat.jinja"), "--max-tokens", "6", *args],
                          input=text, capture_output=True, text=True, timeout=300)


def saved(path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def test_commands_are_not_sent_and_set_save_load_work(tiny, tmp_path):
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    out = chat(tiny, "\n".join(["/help", "/set temperature 0.5", "/set seed 3", "/set top_p 7", "/set",
                                "/unknown", "the license", f"/save {first}", "/exit", "never read"]) + "\n")
    assert out.returncode == 0, out.stderr
    assert "/set NAME VALUE" in out.stdout and "/save FILE" in out.stdout  # /help's list
    assert "(temperature 0.5)" in out.stdout and "(seed 3)" in out.stdout
    assert "(top_p: " in out.stdout  # refused: out of range, and not kept
    assert "temperature 0.5, seed 3, max_tokens 6)" in out.stdout  # /set alone shows them
    assert "(unknown command /unknown: /help lists them" in out.stdout
    llm = pyllm.load(str(tiny))
    turn = [{"role": "user", "content": "the license"}]
    answer = llm.chat(turn, chat_template=TEMPLATE, max_tokens=6, temperature=0.5, seed=3).text
    assert saved(first) == turn + [{"role": "assistant", "content": answer}]  # no /command reached the model
    out = chat(tiny, f"/load {first}\nand more\n/save {second}\n")
    assert out.returncode == 0, out.stderr
    assert f"(loaded 2 messages from {first})" in out.stdout
    conversation = saved(second)
    assert conversation[:2] == saved(first) and conversation[2] == {"role": "user", "content": "and more"}
    assert len(conversation) == 4
    bad = tmp_path / "bad.json"
    bad.write_text('{"not": "a conversation"}')
    out = chat(tiny, f"/load {bad}\n/load\n")
    assert out.returncode == 0 and "is not a conversation" in out.stdout and "(/load needs a file name" in out.stdout


def test_a_message_of_several_lines_is_one_turn(tiny, tmp_path):
    target = tmp_path / "lines.json"
    out = chat(tiny, '"""\nline one\nline two\n"""\nfirst \\\nsecond\n//set is text\n' + f"/save {target}\n")
    assert out.returncode == 0, out.stderr
    users = [m["content"] for m in saved(target) if m["role"] == "user"]
    assert users == ["line one\nline two", "first \nsecond", "/set is text"]


def test_a_pasted_text_on_a_terminal_is_one_turn(tiny, tmp_path):
    """Bracketed paste: the terminal wraps a paste in ESC[200~ ... ESC[201~ and readline takes its
    newlines as text, so Enter sends it whole."""
    target = tmp_path / "paste.json"
    child = pexpect.spawn(sys.executable, ["-m", "pyllm", "chat", str(tiny), "--chat-template", str(tiny / "chat.jinja"),
                                           "--max-tokens", "3"], encoding="utf-8", timeout=120,
                          env={**os.environ, "PYTHONUNBUFFERED": "1", "TERM": "xterm"})
    child.expect("> ")
    child.send("\x1b[200~pasted one\npasted two\x1b[201~\r")
    child.expect(r"\[cut: --max-tokens\]")
    child.expect("> ")
    child.send(f"/save {target}\r")
    child.expect(r"\(saved 2 messages")
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert saved(target)[0] == {"role": "user", "content": "pasted one\npasted two"}


def test_a_message_too_long_for_the_context_is_refused_before_any_turn_is_dropped(tiny, tmp_path):
    target = tmp_path / "kept.json"
    out = chat(tiny, "Hi\n" + "word " * 100 + f"\n/save {target}\n", "--n-ctx", "64")
    assert out.returncode == 0, out.stderr
    assert "the context holds 64: not sent; the conversation is as it was)" in out.stdout
    assert "dropped" not in out.stdout
    assert [m["role"] for m in saved(target)] == ["user", "assistant"]  # the first turn is still there
    assert saved(target)[0]["content"] == "Hi"
