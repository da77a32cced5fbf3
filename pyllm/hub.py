"""Names to files: a model folder (config.json + safetensors + tokenizer.json)."""
from __future__ import annotations

import os

from .errors import PyllmError


def resolve(source: str | os.PathLike) -> str:
    """The local folder or file a source names, or a PyllmError saying what was looked for."""
    path = os.path.expanduser(os.fspath(source))
    if os.path.isdir(path):
        if not os.path.exists(os.path.join(path, "config.json")):
            raise PyllmError(f"{path} is a folder without config.json: not a Hugging Face model folder")
        return path
    if os.path.isfile(path):
        raise PyllmError(f"{path}: pyllm loads model folders (config.json + *.safetensors)")
    raise PyllmError(f"no model at {path!r}: pass a model folder (config.json + *.safetensors)")
