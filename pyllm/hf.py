"""Hugging Face Hub ids to files: "owner/name" becomes a snapshot folder or one .gguf file in the HF cache.

huggingface_hub does the work, so its cache layout and its settings hold: HF_HOME / HF_HUB_CACHE,
HF_ENDPOINT, HF_HUB_OFFLINE, HF_TOKEN (or the token= argument), and its own progress bars. It is the
optional extra pyllm[hub], imported only when an id is loaded.

The cache comes first: a revision found there (refs/<branch> names its commit) with every file pyllm
needs loads without a single request, so a model fetched once loads offline and never waits on the
network (nor learns of newer commits on its branch: `pyllm rm` the repository, or pass a commit as the
revision, to move on). Otherwise only what pyllm reads is downloaded: config.json, generation_config.json, the
tokenizer's files and the safetensors weights (the shards an index names, else model.safetensors,
else every top-level *.safetensors), or, from a repository of GGUF files, the one file that `file=`
picks: a glob matched against the files' paths and names, ignoring case (a glob is tried on the
cached files first), or a plain name fetched as it is. huggingface_hub writes each file under a
temporary name and renames it when whole, and resumes a connection that drops mid-file with a Range
request.
"""
from __future__ import annotations

import fnmatch
import glob
import json
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

from .errors import PyllmError

HUB_EXTRA = 'pip install "pyllm[hub]"'
INDEX = "model.safetensors.index.json"
# What pyllm reads from a model folder besides the weights (model.py, tokenizer.py).
FOLDER_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                "chat_template.jinja")
DEFAULT_REVISION = "main"

# The Hub's rules for a model id: owner and name of letters, digits, '-', '_' and '.', at most 96 each,
# no "--" or ".." anywhere (the cache uses "--" as its separator).
_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}", re.ASCII)
_COMMIT = re.compile(r"[0-9a-f]{40}")
_GLOB = re.compile(r"[*?[]")


def is_repo_id(text: str) -> bool:
    """Whether text has the form of a Hub model id, "owner/name"."""
    return (bool(_REPO_ID.fullmatch(text)) and "--" not in text and ".." not in text
            and not text.endswith(".git"))


def import_hub(why: str) -> ModuleType:
    """huggingface_hub, or a PyllmError that says why it is needed and how to install it."""
    try:
        import huggingface_hub
        import huggingface_hub.file_download  # noqa: F401  (repo_folder_name)
    except ImportError:
        raise PyllmError(f"{why} needs huggingface_hub: {HUB_EXTRA}") from None
    return huggingface_hub


def hub_cache(hub: ModuleType) -> str:
    """The folder of huggingface_hub's cache (HF_HUB_CACHE, else HF_HOME/hub)."""
    return hub.constants.HF_HUB_CACHE


def repo_folder(hub: ModuleType, repo_id: str) -> str:
    return os.path.join(hub_cache(hub), hub.file_download.repo_folder_name(repo_id=repo_id, repo_type="model"))


def resolve(repo_id: str, *, file: str | None = None, revision: str | None = None,
            token: str | bool | None = None) -> str:
    """The local path of a Hub model: its snapshot folder, or the .gguf file `file` picks.

    Raises PyllmError when huggingface_hub is missing, the repository, revision or file does not
    exist (or needs a token), a glob picks no file or several, or HF_HUB_OFFLINE is set and the
    cache does not hold the model.
    """
    for name, value in (("file", file), ("revision", revision)):
        if value is not None and (not isinstance(value, str) or not value):
            raise PyllmError(f"{name} must be a non-empty string, got {value!r}")
    if file is not None and not _GLOB.search(file) and not file.lower().endswith(".gguf"):
        raise PyllmError(f"file= picks the .gguf file to load from a repository of GGUF files, got {file!r}; "
                         f"a model folder needs no file=")
    if token is not None and not isinstance(token, (str, bool)):
        raise PyllmError(f"token must be a string (or True/False), got {type(token).__name__}")
    hub = import_hub(f"{repo_id!r} is not a local file or folder; loading it as a Hugging Face id")
    revision = revision or DEFAULT_REVISION
    storage = repo_folder(hub, repo_id)
    found, why_not = _from_cache(hub, repo_id, storage, revision, file)
    if found is not None:
        return found
    if hub.constants.HF_HUB_OFFLINE:
        raise PyllmError(
            f"{repo_id!r} is not a local file or folder, and the Hugging Face cache does not hold "
            f"{_wanted(file)} of {repo_id} at revision {revision!r}: {why_not} (cache: {hub_cache(hub)}); "
            f"HF_HUB_OFFLINE is set, so nothing was downloaded: unset it to download the model, or point "
            f"HF_HOME or HF_HUB_CACHE at a cache that holds it")
    return _download(hub, repo_id, revision, file, token, why_not)


def _wanted(file: str | None) -> str:
    if file is not None:
        return f"a .gguf file matching {file!r}"
    return "a model pyllm loads (config.json, tokenizer.json and safetensors weights, or one .gguf file)"


# ---------------------------------------------------------------------------------------------------
# Choosing files from a repository's listing


def gguf_files(files: list[str]) -> list[str]:
    return sorted(f for f in files if f.lower().endswith(".gguf"))


def _matching(ggufs: list[str], pattern: str) -> list[str]:
    """The files whose path or name the glob matches, ignoring case (Q4_K_M and q4_k_m both occur)."""
    pattern = pattern.lower()
    return [f for f in ggufs if fnmatch.fnmatchcase(f.lower(), pattern)
            or fnmatch.fnmatchcase(f.rsplit("/", 1)[-1].lower(), pattern)]


def is_folder_model(files: list[str]) -> bool:
    return "config.json" in files and any("/" not in f and f.endswith(".safetensors") for f in files)


def folder_files(files: list[str], shards: list[str]) -> list[str]:
    """The files of a repository's listing that pyllm reads, as formats/safetensors.py picks weights:
    the index and the shards it names (shards, read from it), else model.safetensors, else every
    top-level *.safetensors."""
    wanted = [f for f in FOLDER_FILES if f in files]
    if INDEX in files:
        return wanted + [INDEX] + shards
    if "model.safetensors" in files:
        return wanted + ["model.safetensors"]
    return wanted + sorted(f for f in files if "/" not in f and f.endswith(".safetensors"))


def index_shards(index_path: str) -> list[str]:
    """The shard names model.safetensors.index.json lists (formats/safetensors.py checks them at load)."""
    try:
        with open(index_path, encoding="utf-8") as f:
            weight_map = json.load(f).get("weight_map")
    except (OSError, ValueError, AttributeError) as e:
        raise PyllmError(f"{index_path}: not a safetensors index ({e})") from None
    if not isinstance(weight_map, dict) or not all(isinstance(s, str) for s in weight_map.values()):
        raise PyllmError(f"{index_path}: its weight_map is not an object of shard names")
    return list(dict.fromkeys(weight_map.values()))


def _pick_gguf(repo_id: str, files: list[str], file: str | None, where: str) -> str | None:
    """The one .gguf file of files that file (a glob) picks, or the only one when file is None;
    None when there is none to pick. Several are a PyllmError listing them."""
    ggufs = gguf_files(files)
    found = _matching(ggufs, file) if file is not None else ggufs
    if len(found) == 1:
        return found[0]
    if len(found) > 1:
        if file is None:
            raise PyllmError(f"{repo_id} holds {len(found)} .gguf files ({where}): {', '.join(found)}; "
                             f"choose one with file= (a glob such as '*Q4_K_M.gguf')")
        raise PyllmError(f"file={file!r} matches {len(found)} .gguf files of {repo_id} ({where}): "
                         f"{', '.join(found)}; make it match one")
    return None


# ---------------------------------------------------------------------------------------------------
# The cache


def _snapshot_files(snapshot: str) -> list[str]:
    """The files of a snapshot folder, as repository paths; a link whose blob is gone is not one."""
    found = []
    for root, _, names in os.walk(snapshot):
        for name in names:
            if os.path.isfile(os.path.join(root, name)):
                found.append(os.path.relpath(os.path.join(root, name), snapshot).replace(os.sep, "/"))
    return found


def cached_listing(hub: ModuleType, repo_id: str, commit: str) -> list[str] | None:
    """The commit's full file listing, which huggingface_hub keeps beside a snapshot it downloaded
    (None for a snapshot laid out otherwise, or by a version that keeps none)."""
    get_tree = getattr(hub, "get_cached_repo_tree", None)
    if get_tree is None:
        return None
    try:
        return [f.path for f in get_tree(repo_id, revision=commit, cache_dir=hub_cache(hub))]
    except Exception:  # CachedRepoTreeNotFoundError, or a listing it cannot read: none to go by
        return None


def missing_from_folder(snapshot: str, listing: list[str] | None = None) -> list[str]:
    """The files pyllm needs that a snapshot folder lacks. listing is the repository's file list
    when known (then every file pyllm reads must be there); without one, config.json,
    tokenizer.json and whole weights must be."""
    present = set(_snapshot_files(snapshot))
    if listing is None:  # a snapshot laid out by hand, or an older huggingface_hub's
        listing = sorted(present | {"config.json", "tokenizer.json"})
    shards = index_shards(os.path.join(snapshot, INDEX)) if INDEX in present else []
    return [f for f in folder_files(listing, shards) if f not in present]


def _from_cache(hub: ModuleType, repo_id: str, storage: str, revision: str,
                file: str | None) -> tuple[str | None, str]:
    """(the path to load, "") when the cache holds what is asked for, else (None, what it lacks)."""
    if _COMMIT.fullmatch(revision):
        commit = revision
    else:
        ref = os.path.join(storage, "refs", *revision.split("/"))
        try:
            with open(ref, encoding="utf-8") as f:
                commit = f.read().strip()
        except OSError:
            return None, f"there is no {ref}"
    snapshot = os.path.join(storage, "snapshots", commit)
    if not os.path.isdir(snapshot):
        return None, f"there is no snapshot {snapshot}"
    files = _snapshot_files(snapshot)
    if file is None and is_folder_model(files):
        missing = missing_from_folder(snapshot, cached_listing(hub, repo_id, commit))
        if missing:
            return None, f"the snapshot {snapshot} lacks {', '.join(missing)}"
        return snapshot, ""
    picked = _pick_gguf(repo_id, files, file, f"in the cache at {snapshot}")
    if picked is None:
        return None, f"the snapshot {snapshot} holds no {'such file' if file else 'model'}"
    return os.path.join(snapshot, *picked.split("/")), ""


# ---------------------------------------------------------------------------------------------------
# Downloading


def _transport_errors() -> tuple[type[BaseException], ...]:
    """The HTTP library's errors (refused connections, timeouts, dropped connections): httpx2 under
    huggingface_hub 2, httpx under 1. Only looked up when an error is being matched."""
    found = []
    for name in ("httpx2", "httpx"):
        try:
            found.append(__import__(name).HTTPError)
        except (ImportError, AttributeError):
            pass
    return tuple(found)


@contextmanager
def _hub_errors(hub: ModuleType, repo_id: str, revision: str, what: str, not_cached: str) -> Iterator[None]:
    """huggingface_hub's exceptions as PyllmErrors that say what was asked of which repository;
    not_cached says why the cache could not serve it instead."""
    errors = hub.errors
    endpoint = hub.constants.ENDPOINT
    try:
        yield
    except errors.GatedRepoError as e:
        raise PyllmError(f"{repo_id} is a gated repository: accept its conditions on its page at {endpoint}, "
                         f"then pass a token of that account (token= or HF_TOKEN)") from e
    except errors.RepositoryNotFoundError as e:
        raise PyllmError(
            f"no model at {repo_id!r}: it is not a local file or folder, and the Hugging Face Hub at {endpoint} "
            f"has no model repository {repo_id}, or does not let this request read it (a private or gated "
            f"repository needs token= or HF_TOKEN, of an account with access)") from e
    except errors.RevisionNotFoundError as e:
        raise PyllmError(f"{repo_id} has no revision {revision!r} (a branch, tag or commit hash)") from e
    except errors.LocalEntryNotFoundError as e:  # before EntryNotFoundError, of which it is a kind
        raise PyllmError(f"could not download {what} of {repo_id} (revision {revision!r}) from {endpoint} "
                         f"({e}); the Hugging Face cache cannot serve it: {not_cached}") from e
    except errors.EntryNotFoundError as e:
        raise PyllmError(f"{repo_id} has no file {what} at revision {revision!r}") from e
    except (errors.HfHubHTTPError, *_transport_errors()) as e:
        raise PyllmError(f"could not download {what} of {repo_id} (revision {revision!r}) from {endpoint} "
                         f"({type(e).__name__}: {e}); the Hugging Face cache cannot serve it: {not_cached}; "
                         f"and {repo_id!r} is not a local file or folder") from e
    except OSError as e:  # the cache: a full disk, a read-only folder
        raise PyllmError(f"could not write {what} of {repo_id} into the Hugging Face cache at "
                         f"{hub_cache(hub)}: {e}") from e


def _download(hub: ModuleType, repo_id: str, revision: str, file: str | None, token: str | bool | None,
              not_cached: str) -> str:
    def hub_errors(what: str):
        return _hub_errors(hub, repo_id, revision, what, not_cached)

    # The model's info lists its files, and fails at once when the Hub cannot be reached (the paginated
    # tree listing retries for half a minute).
    with hub_errors("the file list"):
        files = [s.rfilename for s in hub.model_info(repo_id, revision=revision, token=token).siblings or ()]
    if file is not None and not _GLOB.search(file):  # a name: asked for as it is
        with hub_errors(file):
            try:
                return hub.hf_hub_download(repo_id, file, revision=revision, token=token)
            except hub.errors.EntryNotFoundError as e:
                if isinstance(e, hub.errors.LocalEntryNotFoundError):
                    raise
                ggufs = gguf_files(files)
                raise PyllmError(f"{repo_id} has no file {file!r} at revision {revision!r}"
                                 + (f"; its .gguf files are {', '.join(ggufs)}" if ggufs else "")) from e
    where = f"at revision {revision!r}"
    if file is not None or not is_folder_model(files):
        picked = _pick_gguf(repo_id, files, file, where)
        if picked is None:
            ggufs = gguf_files(files)
            if file is not None:
                raise PyllmError(f"file={file!r} matches none of the {len(ggufs)} .gguf files of {repo_id} "
                                 f"{where}" + (f": {', '.join(ggufs)}" if ggufs else ""))
            shown = ", ".join(sorted(files)[:12]) + (", ..." if len(files) > 12 else "")
            raise PyllmError(f"{repo_id} {where} holds no model pyllm loads: neither config.json with "
                             f"safetensors weights nor a .gguf file (it holds {shown or 'no files'})")
        with hub_errors(picked):
            return hub.hf_hub_download(repo_id, picked, revision=revision, token=token)
    shards = []
    if INDEX in files:
        with hub_errors(INDEX):
            shards = index_shards(hub.hf_hub_download(repo_id, INDEX, revision=revision, token=token))
        absent = [s for s in shards if s not in files]
        if absent:
            raise PyllmError(f"{repo_id}'s {INDEX} names shards the repository does not hold: "
                             f"{', '.join(absent)}")
    wanted = folder_files(files, shards)
    with hub_errors(", ".join(wanted)):
        return hub.snapshot_download(repo_id, revision=revision, token=token,
                                     allow_patterns=[glob.escape(f) for f in wanted])
