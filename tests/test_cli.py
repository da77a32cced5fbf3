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
