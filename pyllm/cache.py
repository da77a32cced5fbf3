"""What pyllm has on disk: the aliases' files in its own cache (hub.py), anything else that folder
holds, and the Hugging Face models in the HF cache that it can load (hf.py). `pyllm list` shows them;
`pyllm rm` removes one.

The HF cache is read with huggingface_hub's scan_cache_dir and emptied with its delete strategy,
which knows its layout (snapshots of links into blobs, blobs shared between repositories); a model
counts as loadable when a snapshot holds every file pyllm needs and names an architecture it runs.
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

from . import hf, hub
from .errors import PyllmError


@dataclass(frozen=True)
class Entry:
    name: str                  # what pyllm.load() and `pyllm rm` take
    what: str                  # what the model is
    size: int | None           # bytes on disk when cached, else the download's
    path: str | None           # the file or folder that is loaded (or removed), when cached
    kind: str                  # "alias", "hf", or "other" (anything else in pyllm's cache folder)
    names: tuple[str, ...] = ()  # every name of an alias's model


def aliases() -> list[Entry]:
    """One entry per model the aliases name, cached or not."""
    names: dict[hub.ModelPackage, list[str]] = {}
    for name, model in hub.ALIASES.items():
        names.setdefault(model, []).append(name)
    entries = []
    for model, its_names in names.items():
        path = hub.cached_path(model)
        size = os.path.getsize(path) if path else model.size
        entries.append(Entry(its_names[0], model.description, size, path, "alias", tuple(its_names)))
    return entries


def _size_on_disk(path: str) -> int:
    if os.path.islink(path) or not os.path.isdir(path):
        return os.lstat(path).st_size
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:  # removed meanwhile
                pass
    return total


def others() -> list[Entry]:
    """Everything in pyllm's cache folder that is not an alias's file or its bookkeeping, by name:
    what a killed fetch left, files put there by hand or by pyllm's tests run with PYLLM_CACHE."""
    folder = hub.cache_dir()
    try:
        names = sorted(os.listdir(folder))
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as e:
        raise PyllmError(f"cannot read pyllm's cache {folder}: {e}") from e
    aliases_own = set()
    for model in hub.ALIASES.values():
        aliases_own |= {model.filename, f".{model.filename}.verified", f".{model.filename}.lock"}
    entries = []
    for name in names:
        if name in aliases_own:
            continue
        path = os.path.join(folder, name)
        if ".fetch-" in name:
            what = "left by an interrupted fetch"
        else:
            what = "folder" if os.path.isdir(path) and not os.path.islink(path) else "file"
        entries.append(Entry(name, what, _size_on_disk(path), path, "other"))
    return entries


def _hub_or_none():
    try:
        return hf.import_hub("listing the Hugging Face cache")
    except PyllmError:
        return None


def hf_cache_folder() -> str | None:
    """The HF cache's folder, or None without huggingface_hub."""
    hub_module = _hub_or_none()
    return hf.hub_cache(hub_module) if hub_module else None


def _scan(hub_module):
    """huggingface_hub's account of its cache; None when there is no cache yet."""
    try:
        return hub_module.scan_cache_dir(hf.hub_cache(hub_module))
    except hub_module.errors.CacheNotFound:
        return None
    except OSError as e:
        raise PyllmError(f"cannot read the Hugging Face cache {hf.hub_cache(hub_module)}: {e}") from e


def _architecture(snapshot: str) -> str | None:
    """The architecture a snapshot's config.json names, when pyllm runs it."""
    from . import arch
    from .formats.json_files import read_json_object

    try:
        config = read_json_object(os.path.join(snapshot, "config.json"))
        arch.family_for(config)
    except (PyllmError, ValueError):
        return None
    return config["architectures"][0] if config.get("architectures") else config.get("model_type")


def hf_models() -> list[Entry] | None:
    """The models in the HF cache that pyllm can load, one entry per snapshot folder and per .gguf
    file, newest revision first; None without huggingface_hub."""
    hub_module = _hub_or_none()
    if hub_module is None:
        return None
    info = _scan(hub_module)
    if info is None:
        return []
    entries = []
    for repo in sorted(info.repos, key=lambda r: r.repo_id.lower()):
        if repo.repo_type != "model":
            continue
        for rev in sorted(repo.revisions, key=lambda r: -r.last_modified):
            snapshot = str(rev.snapshot_path)
            label = f"revision {', '.join(sorted(rev.refs))}" if rev.refs else f"commit {rev.commit_hash[:10]}"
            files = {os.path.relpath(f.file_path, snapshot).replace(os.sep, "/"): f for f in rev.files}
            if hf.is_folder_model(list(files)):
                listing = hf.cached_listing(hub_module, repo.repo_id, rev.commit_hash)
                architecture = _architecture(snapshot)
                if architecture and not hf.missing_from_folder(snapshot, listing):
                    entries.append(Entry(repo.repo_id, f"{architecture}, safetensors ({label})", rev.size_on_disk,
                                         snapshot, "hf"))
            for name in hf.gguf_files(list(files)):
                entries.append(Entry(repo.repo_id, f"GGUF {name} ({label})", files[name].size_on_disk,
                                     str(files[name].file_path), "hf"))
    return entries


def _cached_repo(hub_module, repo_id: str):
    info = _scan(hub_module)
    repos = [r for r in (info.repos if info else ()) if r.repo_type == "model"]
    exact = [r for r in repos if r.repo_id == repo_id]
    loose = [r for r in repos if r.repo_id.lower() == repo_id.lower()]  # the Hub ignores case in ids
    found = exact or (loose if len(loose) == 1 else [])
    return (info, found[0]) if found else (info, None)


def find(name: str) -> Entry:
    """What `pyllm rm name` would remove: an alias's cached file, or a whole repository of the HF
    cache (every revision). PyllmError when it names nothing cached."""
    model = hub.ALIASES.get(name.lower())
    if model is not None:
        path = hub.cached_path(model)
        if path is None:
            raise PyllmError(f"{name} ({model.description}) is not in the cache {hub.cache_dir()}: "
                             f"nothing to remove")
        return Entry(name.lower(), model.description, os.path.getsize(path), path, "alias")
    for entry in others():
        if entry.name == name:
            return entry
    if not hf.is_repo_id(name):
        raise PyllmError(f"{name!r} is neither an alias ({', '.join(sorted(hub.ALIASES))}), nor a name in "
                         f"pyllm's cache {hub.cache_dir()} (`pyllm list` shows them), nor a Hugging Face "
                         f"id (owner/name): `pyllm rm` removes what pyllm downloaded, not other files")
    hub_module = hf.import_hub(f"removing {name} from the Hugging Face cache")
    _, repo = _cached_repo(hub_module, name)
    if repo is None:
        raise PyllmError(f"{name} is not in the Hugging Face cache {hf.hub_cache(hub_module)}: nothing to remove")
    revisions = len(repo.revisions)
    return Entry(repo.repo_id, f"Hugging Face repository, {revisions} revision{'s' if revisions != 1 else ''}",
                 repo.size_on_disk, str(repo.repo_path), "hf")


def remove(entry: Entry) -> int:
    """Deletes what find() returned; returns the bytes freed."""
    if entry.kind == "alias":
        return hub.remove(hub.ALIASES[entry.name])
    if entry.kind == "other":
        try:
            if os.path.isdir(entry.path) and not os.path.islink(entry.path):
                shutil.rmtree(entry.path)
            else:
                os.remove(entry.path)
        except FileNotFoundError:
            return 0
        except OSError as e:
            raise PyllmError(f"cannot remove {entry.path}: {e}") from e
        return entry.size
    hub_module = hf.import_hub(f"removing {entry.name} from the Hugging Face cache")
    info, repo = _cached_repo(hub_module, entry.name)
    if repo is None:
        return 0
    try:
        if repo.revisions:
            info.delete_revisions(*(r.commit_hash for r in repo.revisions)).execute()
        if os.path.isdir(repo.repo_path):  # blobs of no revision (an interrupted first download)
            shutil.rmtree(repo.repo_path)
    except OSError as e:
        raise PyllmError(f"cannot remove {repo.repo_path}: {e}") from e
    return repo.size_on_disk
