"""The `pyllm` commands' options say what they do: --dtype where a model runs, a speed summary on
request, `pyllm pull`, no model-running settings on `pyllm info`, and perplexity's text file apart
from the --file glob that picks a model file."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

import pyllm

from conftest import make_tiny_checkpoint
from hub_server import lay_out_hf_cache


def pyllm_cmd(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pyllm", *args], capture_output=True, text=True, timeout=300, **kw)


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return make_tiny_checkpoint(str(tmp_path_factory.mktemp("commands")))


def test_run_takes_dtype_and_prints_its_speed_on_stderr_when_verbose(tiny_folder):
    out = pyllm_cmd("run", tiny_folder, "The license", "--max-tokens", "5", "--dtype", "q8_0", "--verbose")
    assert out.returncode == 0, out.stderr
    want = pyllm.load(tiny_folder, dtype="q8_0").generate("The license", max_tokens=5)
    assert out.stdout == want.text + "\n"  # the text alone on stdout, as without --verbose
    n_prompt = want.usage["prompt_tokens"]
    assert re.fullmatch(rf"pyllm: {n_prompt} prompt tokens, 5 generated; first token after \d+\.\d\d s, "
                        rf"then \d+\.\d tokens/s\n", out.stderr), out.stderr
    bad = pyllm_cmd("run", tiny_folder, "x", "--dtype", "q9")
    assert bad.returncode == 1 and "dtype must be one of" in bad.stderr


def help_text(capsys, *args: str) -> str:
    from pyllm.cli import main

    with pytest.raises(SystemExit) as e:
        main([*args, "--help"])
    assert e.value.code == 0
    return capsys.readouterr().out


def test_commands_that_run_a_model_take_dtype(capsys):
    for command in ("run", "chat", "serve"):
        assert "--dtype" in help_text(capsys, command)


def test_info_has_no_settings_of_a_running_model(capsys):
    from pyllm.cli import main

    text = help_text(capsys, "info")
    assert "--threads" not in text and "--n-ctx" not in text
    with pytest.raises(SystemExit) as e:
        main(["info", "--threads", "2"])
    assert e.value.code == 2 and "unrecognized arguments: --threads" in capsys.readouterr().err


def test_perplexity_names_its_text_file_apart_from_the_model_files_glob(capsys):
    text = help_text(capsys, "perplexity")
    assert "TEXT_FILE" in text and "--file GLOB" in text
    assert not re.search(r"\bFILE\b", text)  # not two different things both called FILE


def test_pull_fetches_without_running_and_prints_the_path(tmp_path):
    folder = lay_out_hf_cache(tmp_path / "hf" / "hub", "owner/tiny-GGUF", {"tiny-Q8_0.gguf": b"not a real model"})
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING_FACE_"))}
    env.update(HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="1")
    out = pyllm_cmd("pull", "owner/tiny-GGUF", "--file", "*Q8_0.gguf", env=env)
    assert out.returncode == 0, out.stderr  # the file is no model: it was not loaded
    assert out.stdout == os.path.join(folder, "tiny-Q8_0.gguf") + "\n"
    missing = pyllm_cmd("pull", "owner/absent", env=env)
    assert missing.returncode == 1 and "owner/absent" in missing.stderr and "Traceback" not in missing.stderr
