"""The small JSON files beside the weights (config.json, tokenizer_config.json, ...)."""
from __future__ import annotations

import json
import os

from ..errors import FormatError


def read_json_object(path: str) -> dict:
    """The JSON object in path; {} if the file does not exist; FormatError if it is not an object."""
    if not os.path.exists(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise FormatError(path, f"not valid JSON: {e}") from None
    except RecursionError:
        raise FormatError(path, "JSON nested too deeply") from None
    if not isinstance(data, dict):
        raise FormatError(path, "expected a JSON object")
    return data
