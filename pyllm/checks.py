"""Checks of values handed in by users or read from files, shared by every module that takes them."""
from __future__ import annotations

import math

import numpy as np

# Far above any real model, low enough that nothing sized from these values can exhaust memory
# before the tensor shapes (which a file must really hold) are checked against them.
MAX_SIZE = 1 << 20


def _shown(value) -> str:
    """value for an error message, cut short: JSON ints may have thousands of digits."""
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:40]}...({len(text)} characters)"


def as_int(value, name: str, low: int = 1, high: int = MAX_SIZE) -> int:
    """A hyper-parameter that must be a whole number in [low, high] (JSON may spell it 64.0)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} must be a whole number, got {_shown(value)}")
    # an int is compared as it is: math.isfinite would convert it to a float, and JSON ints of more
    # than 308 digits do not fit one (OverflowError)
    whole = isinstance(value, (int, np.integer)) or (math.isfinite(value) and value == int(value))
    if not whole or not low <= int(value) <= high:
        raise ValueError(f"{name} must be a whole number in [{low}, {high}], got {_shown(value)}")
    return int(value)


def as_float(value, name: str, positive: bool = True) -> float:
    """A real hyper-parameter: finite, and > 0 unless positive=False."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} must be a number, got {_shown(value)}")
    try:
        number = float(value)
    except OverflowError:  # a JSON int of more than 308 digits
        number = math.inf
    if not math.isfinite(number) or (positive and number <= 0):
        raise ValueError(f"{name} must be a finite{' positive' if positive else ''} number, got {_shown(value)}")
    return number


def is_int(value) -> bool:
    """A real integer (Python or NumPy): not a bool (`true` is not a count), a float or a string,
    which int() would take."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def check_int(name: str, value, low: int, high: int | None = None) -> int:
    if not is_int(value) or value < low or (high is not None and value > high):
        bounds = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be an int {bounds}, got {value!r}")
    return int(value)


def check_run_settings(max_tokens, logprobs) -> None:
    check_int("max_tokens", max_tokens, 0)
    if logprobs is not None:
        check_int("logprobs", logprobs, 0, 20)


def check_text(text, name: str) -> str:
    """text, if UTF-8 can encode it: a lone surrogate (from a file read with errors="surrogateescape",
    or JSON's "\\ud800") is not text, and the tokenizer would fail with a TypeError."""
    if not isinstance(text, str):
        raise ValueError(f"{name} must be a str, got {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"{name} holds a lone surrogate {text[e.start]!r} at index {e.start}, which is "
                         f"not text") from None
    return text
