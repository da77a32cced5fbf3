"""Hugging Face ids: pyllm.load("owner/name") through huggingface_hub and its cache, against a stand-in
Hub on 127.0.0.1 (hub_server.py) that serves real files: a tiny checkpoint made here and a tiny GGUF.

huggingface_hub reads HF_ENDPOINT, HF_HOME and HF_HUB_OFFLINE when it is imported, so each load runs in
a fresh Python with those set, as a user's process would be; the cache is a folder of the test's own."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import pyllm
from pyllm import PyllmError, hf, hub as pyllm_hub

from conftest import cache_dir, make_tiny_checkpoint
from hub_server import StandInHub, lay_out_hf_cache
from test_gguf_model_errors import tiny_metadata, tiny_tensors, write_gguf

PROMPT = "the license"

LOAD = textwrap.dedent("""
    import json, sys
    import pyllm

    args = json.loads(sys.argv[1])
    if "chunk_size" in args:  # huggingface_hub's write size, so that a small file spans several
        import huggingface_hub.constants
        huggingface_hub.constants.DOWNLOAD_CHUNK_SIZE = args.pop("chunk_size")
    try:
        llm = pyllm.load(args.pop("source"), threads=1, **args)
    except pyllm.PyllmError as e:
        print(json.dumps({"error": str(e)}))
    else:
        print(json.dumps({"source": llm.source, "text": llm.generate(%r, max_tokens=8).text}))
""") % PROMPT


def load(env: dict, source: str, cwd: str | None = None, **kwargs) -> dict:
    """pyllm.load(source, **kwargs) in a fresh Python with env: {"source", "text"} or {"error"}."""
    out = subprocess.run([sys.executable, "-c", LOAD, json.dumps({"source": source, **kwargs})], env=env,
                         cwd=cwd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


def folder_files(folder: str) -> dict[str, bytes]:
    found = {}
    for root, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                found[os.path.relpath(path, folder).replace(os.sep, "/")] = f.read()
    return found


def greedy(source: str) -> str:
    return pyllm.load(source, threads=1).generate(PROMPT, max_tokens=8).text


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny llama checkpoint: its folder, its files and what it generates."""
    folder = make_tiny_checkpoint(str(tmp_path_factory.mktemp("tiny")))
    return folder, folder_files(folder), greedy(folder)


def gguf_bytes(folder, scale: float = 1.0) -> bytes:
    path = folder / f"tiny-{scale}.gguf"
    write_gguf(path, tiny_metadata(), {name: t * np.float32(scale) for name, t in tiny_tensors().items()})
    return path.read_bytes()


@pytest.fixture(scope="module")
def gguf(tmp_path_factory):
    """A tiny GGUF model: its bytes and what it generates."""
    folder = tmp_path_factory.mktemp("gguf")
    data = gguf_bytes(folder)
    (folder / "tiny.gguf").write_bytes(data)
    return data, greedy(str(folder / "tiny.gguf"))


@pytest.fixture
def hub():
    with StandInHub() as server:
        yield server


@pytest.fixture
def env(tmp_path, hub):
    """The environment of a user's process: the stand-in as HF_ENDPOINT, a fresh HF_HOME, no token."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING_FACE_", "TRANSFORMERS_"))}
    return {**clean, "HF_HOME": str(tmp_path / "hf"), "HF_ENDPOINT": hub.url}


def snapshot_of(env: dict, repo_id: str) -> str:
    storage = os.path.join(env["HF_HOME"], "hub", "models--" + repo_id.replace("/", "--"))
    with open(os.path.join(storage, "refs", "main")) as f:
        return os.path.join(storage, "snapshots", f.read())


# ---------------------------------------------------------------------------------------------------------
# Ids


@pytest.mark.parametrize("text", ["HuggingFaceTB/SmolLM2-135M-Instruct", "owner/Some-Model-GGUF", "a/b",
                                  "o_1/m.v2"])
def test_hub_ids_are_recognised(text):
    assert hf.is_repo_id(text)


@pytest.mark.parametrize("text", ["smollm2", "/abs/path", "./rel/x", "~/x/y", "a/b/c", "a--b/c", "a/b..c", "a/.b",
                                  "a/b.git", "a b/c", "a/" + "x" * 97, "C:\\x\\y"])
def test_paths_and_malformed_ids_are_not_ids(text):
    assert not hf.is_repo_id(text)


def test_an_unknown_source_names_every_form_it_can_take(tmp_path):
    with pytest.raises(PyllmError, match=r"model folder .* \.gguf file, a Hugging Face id \(owner/name\)"):
        pyllm_hub.resolve(str(tmp_path / "nothing" / "here" / "at-all"))


def test_hub_arguments_with_a_local_path_or_an_alias_are_refused(tiny):
    with pytest.raises(PyllmError, match="file= choose what to take from a Hugging Face repository.*a local path"):
        pyllm_hub.resolve(tiny[0], file="*.gguf")
    with pytest.raises(PyllmError, match="revision=, token= choose .*an alias"):
        pyllm_hub.resolve("smollm2", revision="main", token="x")


def test_file_must_pick_a_gguf_file():
    with pytest.raises(PyllmError, match="file= picks the .gguf file to load .* got 'config.json'"):
        pyllm_hub.resolve("owner/model", file="config.json")


def test_without_huggingface_hub_the_error_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # as if it were not installed
    with pytest.raises(PyllmError, match=r"'owner/model' is not a local file or folder.*"
                                         r"pip install \"pyllm\[hub\]\""):
        pyllm.load("owner/model")


def test_a_local_folder_wins_over_the_id_it_spells(tiny, tmp_path, env):
    shutil.copytree(tiny[0], tmp_path / "owner" / "tiny")
    got = load({**env, "HF_HUB_OFFLINE": "1"}, "owner/tiny", cwd=str(tmp_path))
    assert got == {"source": "owner/tiny", "text": tiny[2]}


# ---------------------------------------------------------------------------------------------------------
# Folder models


def test_a_folder_model_downloads_only_what_pyllm_reads_then_loads_from_the_cache(tiny, hub, env):
    folder, files, text = tiny
    extra = {"README.md": b"# tiny", "pytorch_model.bin": b"pickled weights", "onnx/model.onnx": b"onnx",
             "special_tokens_map.json": b"{}", "consolidated.safetensors": files["model.safetensors"]}
    hub.add_commit("owner/tiny", {**files, **extra})
    got = load(env, "owner/tiny")
    snapshot = snapshot_of(env, "owner/tiny")
    assert got == {"source": snapshot, "text": text}
    assert folder_files(snapshot) == files  # every file pyllm reads, byte for byte, and nothing else
    assert hub.unexpected == []

    before = len(hub.requests)
    assert load(env, "owner/tiny") == got
    assert len(hub.requests) == before  # the cache first: not a single request

    hub.close()
    assert load({**env, "HF_HUB_OFFLINE": "1"}, "owner/tiny") == got


def test_a_snapshot_missing_a_file_pyllm_reads_is_completed_online_and_refused_offline(tiny, hub, env):
    folder, files, text = tiny
    hub.add_commit("owner/tiny", files)
    snapshot = load(env, "owner/tiny")["source"]
    os.remove(os.path.join(snapshot, "generation_config.json"))  # as a download cut short leaves it
    error = load({**env, "HF_HUB_OFFLINE": "1"}, "owner/tiny")["error"]
    assert f"the snapshot {snapshot} lacks generation_config.json" in error
    assert load(env, "owner/tiny") == {"source": snapshot, "text": text}
    with open(os.path.join(snapshot, "generation_config.json"), "rb") as f:
        assert f.read() == files["generation_config.json"]


def test_a_sharded_folder_fetches_the_index_and_the_shards_it_names(tiny, tmp_path, hub, env):
    from safetensors.torch import load_file, save_file

    folder, files, text = tiny
    tensors = load_file(os.path.join(folder, "model.safetensors"))
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    repo = {k: v for k, v in files.items() if k != "model.safetensors"}
    for shard, its_names in shards.items():
        save_file({n: tensors[n] for n in its_names}, str(tmp_path / shard), metadata={"format": "pt"})
        repo[shard] = (tmp_path / shard).read_bytes()
    weight_map = {name: shard for shard, its_names in shards.items() for name in its_names}
    repo[hf.INDEX] = json.dumps({"metadata": {}, "weight_map": weight_map}).encode()
    repo["model.safetensors"] = b"not in the index: never fetched"
    hub.add_commit("owner/sharded", repo)
    got = load(env, "owner/sharded")
    assert "error" not in got, got
    assert got["text"] == text
    assert sorted(folder_files(got["source"])) == sorted(k for k in repo if k != "model.safetensors")


# ---------------------------------------------------------------------------------------------------------
# GGUF repositories


def test_a_gguf_repo_loads_the_one_file_a_glob_picks(gguf, hub, env):
    data, text = gguf
    hub.add_commit("owner/tiny-GGUF", {"tiny.Q8_0.gguf": b"another quantization", "tiny.F32.gguf": data,
                                       "README.md": b"# GGUF"})
    got = load(env, "owner/tiny-GGUF", file="*f32.gguf")  # matched ignoring case
    snapshot = snapshot_of(env, "owner/tiny-GGUF")
    assert got == {"source": os.path.join(snapshot, "tiny.F32.gguf"), "text": text}
    assert os.listdir(snapshot) == ["tiny.F32.gguf"]
    with open(got["source"], "rb") as f:
        assert f.read() == data
    assert [r.headers.get("range") for r in hub.gets("store")] == [None]


def test_a_gguf_repo_with_a_single_file_needs_no_glob(gguf, hub, env):
    data, text = gguf
    hub.add_commit("owner/one-GGUF", {"sub/tiny-F32.gguf": data, "README.md": b"# GGUF"})
    got = load(env, "owner/one-GGUF")
    assert got["text"] == text and got["source"].endswith(os.path.join("sub", "tiny-F32.gguf"))


def test_a_glob_that_picks_no_file_or_several_lists_the_candidates(hub, env):
    hub.add_commit("owner/many-GGUF", {"m-Q4_K_M.gguf": b"a", "m-Q4_K_S.gguf": b"b", "m-Q8_0.gguf": b"c"})
    several = load(env, "owner/many-GGUF", file="*Q4_K*")["error"]
    assert "file='*Q4_K*' matches 2 .gguf files of owner/many-GGUF" in several
    assert "m-Q4_K_M.gguf, m-Q4_K_S.gguf" in several
    none = load(env, "owner/many-GGUF", file="*Q5*")["error"]
    assert "matches none of the 3 .gguf files" in none and "m-Q4_K_M.gguf, m-Q4_K_S.gguf, m-Q8_0.gguf" in none
    unchosen = load(env, "owner/many-GGUF")["error"]
    assert "holds 3 .gguf files" in unchosen and "choose one with file=" in unchosen
    assert hub.gets("store") == []  # nothing was downloaded


# ---------------------------------------------------------------------------------------------------------
# Failures


def test_a_missing_repo_revision_or_file_is_a_pyllm_error(gguf, hub, env):
    hub.add_commit("owner/tiny-GGUF", {"tiny-F32.gguf": gguf[0], "tiny-Q8_0.gguf": b"q8"})
    missing = load(env, "owner/no-such-model")["error"]
    assert missing.startswith("no model at 'owner/no-such-model': it is not a local file or folder, and the "
                              f"Hugging Face Hub at {hub.url} has no model repository owner/no-such-model")
    revision = load(env, "owner/tiny-GGUF", revision="v2")["error"]
    assert revision == "owner/tiny-GGUF has no revision 'v2' (a branch, tag or commit hash)"
    file = load(env, "owner/tiny-GGUF", file="tiny-Q4_0.gguf")["error"]  # a name, asked for as it is: a 404
    assert file == ("owner/tiny-GGUF has no file 'tiny-Q4_0.gguf' at revision 'main'; its .gguf files are "
                    "tiny-F32.gguf, tiny-Q8_0.gguf")
    assert any(r.method == "HEAD" and r.path.endswith("/resolve/main/tiny-Q4_0.gguf") for r in hub.requests)
    assert hub.unexpected == []


def test_a_repo_without_a_loadable_model_says_what_it_holds(hub, env):
    hub.add_commit("owner/pickles", {"config.json": b"{}", "pytorch_model.bin": b"x", "README.md": b"r"})
    error = load(env, "owner/pickles")["error"]
    assert "neither config.json with safetensors weights nor a .gguf file" in error
    assert "README.md, config.json, pytorch_model.bin" in error


def test_offline_with_nothing_cached_names_what_was_looked_for_and_where(env):
    offline = {**env, "HF_HUB_OFFLINE": "1"}
    cache = os.path.join(env["HF_HOME"], "hub")
    error = load(offline, "HuggingFaceTB/SmolLM2-135M-Instruct")["error"]
    assert error.startswith("'HuggingFaceTB/SmolLM2-135M-Instruct' is not a local file or folder, and the "
                            "Hugging Face cache does not hold a model pyllm loads")
    assert "of HuggingFaceTB/SmolLM2-135M-Instruct at revision 'main'" in error
    assert os.path.join(cache, "models--HuggingFaceTB--SmolLM2-135M-Instruct", "refs", "main") in error
    assert f"(cache: {cache}); HF_HUB_OFFLINE is set, so nothing was downloaded" in error
    error = load(offline, "owner/x-GGUF", file="*Q4_K_M.gguf", revision="v1")["error"]
    assert "a .gguf file matching '*Q4_K_M.gguf' of owner/x-GGUF at revision 'v1'" in error


def test_an_unreachable_hub_with_nothing_cached_is_a_pyllm_error(env):
    env = {**env, "HF_ENDPOINT": "http://127.0.0.1:9"}  # the discard port: nothing listens
    error = load(env, "owner/tiny")["error"]
    assert error.startswith("could not download the file list of owner/tiny (revision 'main') from "
                            "http://127.0.0.1:9 (ConnectError")
    assert "; the Hugging Face cache cannot serve it: there is no " in error
    assert error.endswith("; and 'owner/tiny' is not a local file or folder")


def test_a_private_repo_opens_with_a_token_given_or_in_hf_token(gguf, hub, env):
    data, text = gguf
    hub.add_commit("owner/private-GGUF", {"tiny-F32.gguf": data}, private=True)
    hub.tokens.add("hf_secret")
    assert "a private or gated repository needs token= or HF_TOKEN" in load(env, "owner/private-GGUF")["error"]
    assert load(env, "owner/private-GGUF", token="hf_wrong")["error"].startswith("no model at")
    assert load(env, "owner/private-GGUF", token="hf_secret")["text"] == text
    hub.add_commit("owner/private-GGUF", {"tiny-F32.gguf": data, "other.txt": b"a new commit"}, private=True)
    assert load({**env, "HF_TOKEN": "hf_secret"}, "owner/private-GGUF")["text"] == text
    to_hub = [r for r in hub.requests if r.server == "hub" and "/private-GGUF/" in r.path]
    assert to_hub[-1].headers.get("authorization") == "Bearer hf_secret"
    assert all("authorization" not in r.headers for r in hub.gets("store"))  # never sent off the Hub


def test_revision_loads_a_branch_or_an_older_commit(gguf, tmp_path, hub, env):
    data, text = gguf
    first = hub.add_commit("owner/tiny-GGUF", {"tiny-F32.gguf": data})
    hub.add_commit("owner/tiny-GGUF", {"tiny-F32.gguf": data}, branch="stable")
    hub.add_commit("owner/tiny-GGUF", {"tiny-F32.gguf": gguf_bytes(tmp_path, scale=1.5)})
    newest = load(env, "owner/tiny-GGUF")
    older = load(env, "owner/tiny-GGUF", revision=first)
    stable = load(env, "owner/tiny-GGUF", revision="stable")
    assert f"/snapshots/{first}/" in older["source"] and older["text"] == text
    assert stable["text"] == text and newest["text"] != text
    offline = {**env, "HF_HUB_OFFLINE": "1"}
    assert load(offline, "owner/tiny-GGUF", revision="stable") == stable  # refs/stable was written


# ---------------------------------------------------------------------------------------------------------
# Interrupted downloads


def test_a_dropped_connection_resumes_with_a_range_request_and_the_file_is_whole(tiny, hub, env):
    folder, files, text = tiny
    weights = files["model.safetensors"]
    assert len(weights) > 300_000
    hub.add_commit("owner/tiny", files)
    hub.drop_first_get(weights, after=150_000)
    # huggingface_hub writes what it receives in whole chunks: a small one makes the file span several
    got = load(env, "owner/tiny", chunk_size=1 << 16)
    assert got["text"] == text
    gets = hub.gets("store")
    assert len(gets) == 2 and gets[0].headers.get("range") is None
    resumed_at = int(gets[1].headers["range"].removeprefix("bytes=").removesuffix("-"))
    assert 0 < resumed_at <= 150_000
    with open(os.path.join(got["source"], "model.safetensors"), "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == hashlib.sha256(weights).hexdigest()


def test_ctrl_c_mid_download_leaves_no_file_and_the_next_load_fetches_it_whole(gguf, hub, env):
    data, text = gguf
    hub.add_commit("owner/tiny-GGUF", {"tiny-F32.gguf": data})
    hub.bytes_per_s = len(data) / 4  # four seconds
    proc = subprocess.Popen([sys.executable, "-c", LOAD, json.dumps({"source": "owner/tiny-GGUF"})], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not hub.gets("store") and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0 and "KeyboardInterrupt" in err
    storage = os.path.dirname(os.path.dirname(snapshot_of(env, "owner/tiny-GGUF")))
    left = [os.path.relpath(os.path.join(root, name), storage) for root, _, names in os.walk(storage)
            for name in names]
    assert not [p for p in left if p.startswith(("snapshots", "blobs"))], left  # no partial file anywhere
    hub.bytes_per_s = None
    got = load(env, "owner/tiny-GGUF")
    assert got["text"] == text
    with open(got["source"], "rb") as f:
        assert f.read() == data


# ---------------------------------------------------------------------------------------------------------
# A cache laid out by huggingface_hub's rules, not by pyllm


def test_smollm2_id_loads_offline_from_the_hf_cache(tiny, tmp_path, env):
    real = os.path.join(cache_dir(), "smollm2-135m-instruct-bf16")
    folder = real if os.path.isfile(os.path.join(real, "model.safetensors")) else tiny[0]
    names = [n for n in os.listdir(folder) if n in hf.FOLDER_FILES or n.endswith(".safetensors")]
    snapshot = lay_out_hf_cache(os.path.join(env["HF_HOME"], "hub"), "HuggingFaceTB/SmolLM2-135M-Instruct",
                                {name: os.path.join(folder, name) for name in names})
    offline = {**env, "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"}
    got = load(offline, "HuggingFaceTB/SmolLM2-135M-Instruct")
    assert got == {"source": snapshot, "text": greedy(folder)}
