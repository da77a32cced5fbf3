"""The `pyllm` command as a person uses it: run, info, and an interactive chat on a terminal."""
from __future__ import annotations

import os
import subprocess
import sys

import pexpect
import pytest

import pyllm

from conftest import make_tiny_checkpoint


def pyllm_cmd(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pyllm", *args], capture_output=True, text=True,
                          timeout=300, **kw)


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return make_tiny_checkpoint(str(tmp_path_factory.mktemp("cli")))


def test_run_prints_the_greedy_continuation(tiny_folder):
    expected = pyllm.load(tiny_folder).generate("the license", max_tokens=12).text
    out = pyllm_cmd("run", tiny_folder, "the license", "--max-tokens", "12")
    assert out.returncode == 0, out.stderr
    assert out.stdout == expected + "\n"


def test_run_with_sampling_flags_and_stop(tiny_folder):
    args = ["run", tiny_folder, "the license", "--max-tokens", "20", "--temperature", "0.8",
            "--top-k", "20", "--top-p", "0.9", "--min-p", "0.01", "--seed", "7"]
    first, second = pyllm_cmd(*args), pyllm_cmd(*args)
    assert first.returncode == 0, first.stderr
    assert first.stdout == second.stdout  # the seed makes it reproducible
    text = first.stdout.rstrip("\n")
    if len(text) > 3:
        cut = pyllm_cmd(*args, "--stop", text[2:4])
        assert cut.stdout.rstrip("\n") == text[: text.index(text[2:4])]


def test_run_reports_bad_input_without_a_traceback(tiny_folder):
    out = pyllm_cmd("run", tiny_folder, "x", "--temperature", "-1")
    assert out.returncode == 1 and "temperature" in out.stderr and "Traceback" not in out.stderr
    out = pyllm_cmd("run", "/no/such/model", "x")
    assert out.returncode == 1 and "no model" in out.stderr


def test_info_describes_the_model(tiny_folder):
    out = pyllm_cmd("info", tiny_folder)
    assert out.returncode == 0, out.stderr
    assert "llama" in out.stdout and "BF16" in out.stdout and "vocabulary:      320" in out.stdout
    assert "chat template:   no" in out.stdout


@pytest.mark.slow
def test_info_of_the_default_gguf(smollm2_gguf):
    out = pyllm_cmd("info", smollm2_gguf)
    assert out.returncode == 0, out.stderr
    assert "Q4_1" in out.stdout and "chat template:   yes" in out.stdout and "8192" in out.stdout


@pytest.mark.slow
def test_chat_on_a_terminal_two_turns_ctrl_c_and_ctrl_d(smollm2_gguf):
    child = pexpect.spawn(sys.executable, ["-m", "pyllm", "chat", smollm2_gguf, "--max-tokens", "40"],
                          encoding="utf-8", timeout=120, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    child.expect("> ")
    child.sendline("What is the capital of France?")
    child.expect("Paris")
    child.expect("> ")
    child.sendline("And of Germany?")
    child.expect("Berlin")
    child.expect("> ")
    # a long answer interrupted by Ctrl-C: the program stays, the prompt comes back
    child.sendline("Write a long story about a dragon.")
    child.expect(r"dragon\.\r\n")  # the terminal echoes the line; the answer comes after it
    child.expect(r"\w+ \w+ \w+")  # it has started answering
    child.sendintr()
    child.expect(r"\[stopped\]")
    child.expect("> ")
    child.sendline("/reset")
    child.expect("conversation cleared")
    child.expect("> ")
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_output_cut_short_by_its_reader_ends_quietly(tiny_folder):
    """`pyllm run ... | head -c 1`: no traceback when the pipe closes."""
    proc = subprocess.Popen([sys.executable, "-m", "pyllm", "run", tiny_folder, "the license",
                             "--max-tokens", "64"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.read(1)
    proc.stdout.close()  # the reader goes away while tokens are still coming
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=300) in (0, 141)
    assert "Traceback" not in stderr, stderr


def test_version_is_printed():
    out = pyllm_cmd("--version")
    assert out.returncode == 0 and out.stdout == f"pyllm {pyllm.__version__}\n"


@pytest.mark.parametrize("flag", ["--max-tokens", "--threads", "--n-ctx"])
@pytest.mark.parametrize("value", ["0", "-3", "1.5"])
def test_counts_that_are_not_positive_integers_are_refused(tiny_folder, flag, value):
    out = pyllm_cmd("run", tiny_folder, "the license", flag, value)
    assert out.returncode == 2 and out.stdout == ""
    assert f"argument {flag}: must be an integer >= 1, got '{value}'" in out.stderr


def test_a_context_beyond_the_models_is_refused_naming_both(tiny_folder):
    out = pyllm_cmd("run", tiny_folder, "the license", "--n-ctx", "100000")
    assert out.returncode == 1 and out.stdout == ""
    assert "n_ctx 100000 is more than the model's context of 256 tokens" in out.stderr


def test_chat_without_a_template_says_so_before_the_first_prompt(tiny_folder):
    out = pyllm_cmd("chat", tiny_folder, input="Hello\n")
    assert out.returncode == 1
    assert "> " not in out.stdout  # the user was never asked to type
    assert "has no chat template: give one with --chat-template FILE" in out.stderr


def test_chat_with_a_template_file_answers_through_it(tiny_folder, tmp_path):
    template = tmp_path / "chat.jinja"
    template.write_text("{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}<assistant>")
    rendered = "<user>the license\n<assistant>"
    llm = pyllm.load(tiny_folder)
    expected = llm.generate(llm.tokenize(rendered, add_special=False), max_tokens=6).text
    out = pyllm_cmd("chat", tiny_folder, "--chat-template", str(template), "--max-tokens", "6",
                    input="the license\n")
    assert out.returncode == 0, out.stderr
    assert f"> {expected} [cut: --max-tokens]\n" in out.stdout
    missing = pyllm_cmd("chat", tiny_folder, "--chat-template", str(tmp_path / "nothing.jinja"), input="")
    assert missing.returncode == 1 and "cannot read --chat-template" in missing.stderr


@pytest.mark.slow
def test_chat_prompt_edits_the_line_and_recalls_earlier_ones(smollm2_gguf):
    """readline at the prompt: Ctrl-A goes to the start of the line, the up arrow recalls the last
    one. Without it both reach the model as control characters in a message."""
    child = pexpect.spawn(sys.executable, ["-m", "pyllm", "chat", smollm2_gguf], encoding="utf-8", timeout=60,
                          env={**os.environ, "PYTHONUNBUFFERED": "1", "TERM": "xterm"})
    child.expect("> ")
    child.send("reset")
    child.send("\x01/\r")  # Ctrl-A, then the "/" that makes it a command
    child.expect(r"\(conversation cleared\)")
    child.expect("> ")
    child.send("\x1b[A\r")  # up arrow: the same command again
    child.expect(r"\(conversation cleared\)")
    child.expect("> ")
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


@pytest.mark.slow
def test_ctrl_c_during_run_ends_the_line(smollm2_gguf):
    child = pexpect.spawn(sys.executable, ["-m", "pyllm", "run", smollm2_gguf, "Once upon a time",
                                           "--max-tokens", "2000"],
                          encoding="utf-8", timeout=120, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    child.expect(r"\w+ \w+ \w+")  # it has started writing
    child.sendintr()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 130  # interrupted, not finished
    assert child.before.endswith("\r\n")  # the shell's prompt will start on a line of its own


@pytest.mark.slow
def test_chat_at_the_context_limit_drops_old_turns_and_marks_a_cut_answer(smollm2_gguf):
    child = pexpect.spawn(sys.executable, ["-m", "pyllm", "chat", smollm2_gguf, "--n-ctx", "100"],
                          encoding="utf-8", timeout=120, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    child.expect("> ")
    child.sendline("What is the capital of France?")
    child.expect("Paris")
    child.expect("> ")
    child.sendline("Write a long story about a dragon.")
    child.expect(r"dragon\.\r\n")
    child.expect(r"\(the context holds 100 tokens: dropped the oldest 1 turn\)")
    child.expect(r"\[cut: the context is full\]")
    child.expect("> ")
    child.sendline("What is the capital of Germany?")  # the session goes on
    child.expect("dropped the oldest")
    child.expect("Berlin")
    child.expect("> ")
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert "error" not in child.before
