"""The `pyllm` command as a person uses it: run, info, and an interactive chat on a terminal."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from types import SimpleNamespace

import pexpect
import pytest

import pyllm

from conftest import make_tiny_checkpoint
from hub_server import lay_out_hf_cache


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


def test_run_with_an_f16_kv_cache(tiny_folder):
    expected = pyllm.load(tiny_folder, kv_dtype="f16").generate("the license", max_tokens=12).text
    out = pyllm_cmd("run", tiny_folder, "the license", "--max-tokens", "12", "--kv-dtype", "f16")
    assert out.returncode == 0, out.stderr
    assert out.stdout == expected + "\n"
    bad = pyllm_cmd("run", tiny_folder, "x", "--kv-dtype", "q3")
    assert bad.returncode == 2 and "--kv-dtype" in bad.stderr


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
    child.sendline("Name the capital of France.")
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
    child.sendline("Name the capital of France.")
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


# ---------------------------------------------------------------------------------------------
# pyllm list and pyllm rm: what is cached, and removing it


@pytest.fixture
def caches(tmp_path, tiny_folder):
    """A pyllm cache holding gemma3's file (a stand-in of the right name) and an HF cache holding a
    model folder and a GGUF file pyllm loads, an architecture it does not run and a snapshot without
    its tokenizer; the environment that points at both."""
    hf_cache = tmp_path / "hf" / "hub"
    tiny = {}
    for name in os.listdir(tiny_folder):
        with open(os.path.join(tiny_folder, name), "rb") as f:
            tiny[name] = f.read()
    bert = {"config.json": json.dumps({"architectures": ["BertModel"]}).encode(), "model.safetensors": b"x",
            "tokenizer.json": b"{}"}
    pyllm_cache = tmp_path / "pyllm"
    pyllm_cache.mkdir()
    (pyllm_cache / "gemma-3-270m-q4_k_m.gguf").write_bytes(b"g" * 1500)
    lay_out_hf_cache(hf_cache, "owner/bert", bert)
    lay_out_hf_cache(hf_cache, "owner/partial", {k: v for k, v in tiny.items() if k != "tokenizer.json"})
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING_FACE_", "PYLLM_"))}
    return SimpleNamespace(
        env={**clean, "PYLLM_CACHE": str(pyllm_cache), "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"},
        folder=lay_out_hf_cache(hf_cache, "owner/tiny", tiny),
        gguf=lay_out_hf_cache(hf_cache, "owner/tiny-GGUF", {"tiny-Q8_0.gguf": b"q" * 2500, "README.md": b"r"}),
        hf=hf_cache, pyllm=pyllm_cache, tiny_size=sum(map(len, tiny.values())))


def columns(out: str) -> dict[str, list[str]]:
    """pyllm list's rows by their first column's text; cells are split on runs of 2+ spaces."""
    rows = {}
    for line in out.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) == 5:
            rows.setdefault(cells[0], []).append(cells[1:])
    return rows


def test_list_shows_the_aliases_and_the_hf_models_pyllm_loads(caches):
    out = pyllm_cmd("list", env=caches.env)
    assert out.returncode == 0, out.stderr
    rows = columns(out.stdout)
    assert rows["NAME"] == [["WHAT", "SIZE", "CACHED", "PATH"]]
    assert rows["smollm2, smollm2-135m-instruct"] == [["SmolLM2-135M-Instruct, Q4_1 GGUF", "98.4 MB", "no", "-"]]
    assert rows["gemma3, gemma3-270m"] == [["Gemma 3 270M (base), Q4_K_M GGUF", "1.5 kB", "yes",
                                            str(caches.pyllm / "gemma-3-270m-q4_k_m.gguf")]]
    assert rows["owner/tiny"] == [["LlamaForCausalLM, safetensors (revision main)",
                                   f"{caches.tiny_size / 1000:.1f} kB", "yes", caches.folder]]
    assert rows["owner/tiny-GGUF"] == [["GGUF tiny-Q8_0.gguf (revision main)", "2.5 kB", "yes",
                                        os.path.join(caches.gguf, "tiny-Q8_0.gguf")]]
    assert "owner/bert" not in out.stdout and "owner/partial" not in out.stdout  # pyllm could not load them
    assert f"Hugging Face cache:   {caches.hf} (HF_HUB_CACHE or HF_HOME)" in out.stdout


def test_list_shows_everything_in_pyllms_cache_with_sizes_and_rm_removes_it(caches):
    """Not only the aliases' files: what tests, a killed fetch or a person left there is listed too,
    with its size, and `pyllm rm` takes its name."""
    (caches.pyllm / "sdist").mkdir()
    (caches.pyllm / "sdist" / "llama_cpp_python-0.3.36.tar.gz").write_bytes(b"s" * 3000)
    (caches.pyllm / "notes.txt").write_bytes(b"n" * 10)
    (caches.pyllm / ".gemma-3-270m-q4_k_m.gguf.fetch-x1").mkdir()
    (caches.pyllm / ".gemma-3-270m-q4_k_m.gguf.fetch-x1" / "0.whl").write_bytes(b"w" * 500)
    out = pyllm_cmd("list", env=caches.env)
    assert out.returncode == 0, out.stderr
    rows = columns(out.stdout)
    assert rows["sdist"] == [["folder", "3.0 kB", "yes", str(caches.pyllm / "sdist")]]
    assert rows["notes.txt"] == [["file", "10 B", "yes", str(caches.pyllm / "notes.txt")]]
    assert rows[".gemma-3-270m-q4_k_m.gguf.fetch-x1"] == [
        ["left by an interrupted fetch", "500 B", "yes", str(caches.pyllm / ".gemma-3-270m-q4_k_m.gguf.fetch-x1")]]
    assert f"pyllm's cache:        {caches.pyllm} (PYLLM_CACHE), 5.0 kB in all" in out.stdout  # + gemma3's 1.5 kB
    out = pyllm_cmd("rm", "sdist", "--yes", env=caches.env)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "removed sdist (3.0 kB freed)\n"
    assert not (caches.pyllm / "sdist").exists() and (caches.pyllm / "notes.txt").exists()
    assert "sdist" not in columns(pyllm_cmd("list", env=caches.env).stdout)


def test_rm_off_a_terminal_needs_yes_then_removes_an_aliass_file(caches):
    target = caches.pyllm / "gemma-3-270m-q4_k_m.gguf"
    (caches.pyllm / ".gemma-3-270m-q4_k_m.gguf.verified").write_text("{}")
    out = pyllm_cmd("rm", "gemma3", env=caches.env, stdin=subprocess.DEVNULL)
    assert out.returncode == 1 and "needs --yes when stdin is not a terminal" in out.stderr
    assert target.exists()
    out = pyllm_cmd("rm", "gemma3-270m", "--yes", env=caches.env)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "removed gemma3-270m (1.5 kB freed)\n"
    assert sorted(os.listdir(caches.pyllm)) == [".gemma-3-270m-q4_k_m.gguf.lock"]  # the stamp went too
    out = pyllm_cmd("rm", "gemma3", "--yes", env=caches.env)
    assert out.returncode == 1 and "is not in the cache" in out.stderr and "nothing to remove" in out.stderr


def test_rm_removes_a_repository_from_the_hf_cache(caches):
    out = pyllm_cmd("rm", "owner/tiny", "--yes", env=caches.env)
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"removed owner/tiny ({caches.tiny_size / 1000:.1f} kB freed)\n"
    assert sorted(os.listdir(caches.hf)) == ["models--owner--bert", "models--owner--partial",
                                             "models--owner--tiny-GGUF"]
    assert "owner/tiny " not in pyllm_cmd("list", env=caches.env).stdout
    out = pyllm_cmd("rm", "owner/tiny", "--yes", env=caches.env)
    assert out.returncode == 1 and "is not in the Hugging Face cache" in out.stderr
    out = pyllm_cmd("rm", "some/folder/model.gguf", "--yes", env=caches.env)
    assert out.returncode == 1 and "neither an alias" in out.stderr and "Traceback" not in out.stderr


def test_rm_on_a_terminal_asks_first(caches):
    def answer(reply: str) -> pexpect.spawn:
        child = pexpect.spawn(sys.executable, ["-m", "pyllm", "rm", "owner/tiny-GGUF"], encoding="utf-8",
                              timeout=60, env=caches.env)
        child.expect(r"remove owner/tiny-GGUF \(Hugging Face repository, 1 revision, 2\.5 kB\) at .*\? \[y/N\] ")
        child.sendline(reply)
        child.expect(pexpect.EOF)
        child.close()
        return child

    child = answer("n")
    assert child.exitstatus == 1 and "nothing removed" in child.before
    assert (caches.hf / "models--owner--tiny-GGUF").exists()
    child = answer("y")
    assert child.exitstatus == 0 and "removed owner/tiny-GGUF" in child.before
    assert not (caches.hf / "models--owner--tiny-GGUF").exists()


@pytest.mark.parametrize("flag,want", [(None, "f16"), ("f32", "f32"), ("q8_0", "q8_0")])
def test_kv_dtype_defaults_to_f16_for_the_default_quantized_model(smollm2_gguf, flag, want):
    # the commands' --kv-dtype goes to load(kv_dtype=) as given, None when absent: f16 on Q4_1 weights
    import argparse

    from pyllm.cli import load_model

    args = argparse.Namespace(model=smollm2_gguf, file=None, revision=None, threads=1, n_ctx=32, kv_dtype=flag)
    assert load_model(args).kv_dtype == want
