"""Chat templates: messages → prompt text, rendered exactly as transformers' apply_chat_template.

A model's chat template (tokenizer_config.json ``chat_template``, GGUF ``tokenizer.chat_template``) is
a Jinja program from the internet, so it runs in jinja2's immutable sandbox with the environment
transformers builds (``transformers.utils.chat_template_utils``): trim_blocks and lstrip_blocks,
the loopcontrols extension, the ``{% generation %}`` tag (rendered as plain text), the globals
``raise_exception``, ``strftime_now``, ``dict`` and an underscore-proof ``namespace``, and a ``tojson``
filter that keeps non-ASCII text and takes ``indent``/``separators``/``sort_keys``. The template sees
``messages``, ``tools``, ``documents``, ``add_generation_prompt``, the special tokens given, and any
extra keywords, prepared as transformers prepares them: keys whose value is None are dropped from
each message, everything is rebuilt from plain JSON types, and a message's reasoning given as
``reasoning_content``, ``thinking`` or ``reasoning`` is visible under ``reasoning_content`` and
``thinking``. Content given as a list of parts ({"type": "text", "text": ...}, ...) is passed to the
template as it is, as transformers does; templates written for multimodal models iterate over it.

One difference from transformers, on purpose: reading an attribute the sandbox deems unsafe
(``{{ ''.__class__ }}``) raises ChatTemplateError at once, where jinja would render an empty string
and fail only on the next step of the escape.

The sandbox keeps a template from reaching Python, not from spending time and memory, and a template
from a downloaded file runs on every chat() call. So each rendering is bounded (ChatTemplateError
past a bound): RENDER_SECONDS of wall time, checked at every loop step, call, operator and piece of
output, and at the calls inside a global, filter or macro; MAX_CHARS characters (or items) for any one
value it makes and for the prompt; MADE_CHARS for all the values it makes together. Operations that
could make a huge value in one step (``'x' * n``, ``s.replace(a, b)``, ``'%9999999d' % 1``, each field
of ``str.format`` once its nested fields are filled in, ``lipsum(n)``, ``indent(n)``, ...) are checked
before they run.

>>> render_chat("{% for m in messages %}<{{ m.role }}>{{ m.content }}\\n{% endfor %}"
...             "{% if add_generation_prompt %}<assistant>{% endif %}",
...             [{"role": "user", "content": "Hi"}])
'<user>Hi\\n<assistant>'
"""
from __future__ import annotations

from collections.abc import Mapping

from .errors import ChatTemplateError, PyllmError

_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")

RENDER_SECONDS = 5.0   # a real template renders a long conversation in milliseconds
MAX_CHARS = 1 << 21    # 2 Mi characters: more than any context holds (a 128k-token prompt is ~0.5 Mi)
MADE_CHARS = 1 << 25   # all values one rendering makes, together


class ChatMessageError(PyllmError, ValueError):
    """The messages are not a list of {"role": str, "content": str | list of parts} dicts."""


def render_chat(template: str, messages: list[dict], *, bos_token: str | None = None,
                eos_token: str | None = None, add_generation_prompt: bool = True, **extra) -> str:
    """The prompt text template makes of messages, byte-identical to transformers'
    ``tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=...)`` for a
    tokenizer whose special tokens are bos_token and eos_token.

    Special tokens that are None are left undefined (as transformers leaves out unset ones); extra
    keywords reach the template as variables (tools=[...], documents=[...], enable_thinking=False,
    unk_token=..., ...); tools and documents are lists of dicts (JSON schemas), None by default.

    >>> render_chat("{{ bos_token }}{{ messages[0]['content'] }}", [{"role": "user", "content": "x"}],
    ...             bos_token="<s>")
    '<s>x'
    """
    if not isinstance(template, str) or not template:
        raise ChatTemplateError("the chat template must be a non-empty string")
    _check_messages(messages)
    for name in ("tools", "documents"):
        value = extra.get(name)
        if value is not None and (not isinstance(value, list) or not all(isinstance(v, Mapping) for v in value)):
            raise ChatMessageError(f"{name} must be a list of dicts, got {value!r}")
    chat = _alias_reasoning([{k: v for k, v in m.items() if v is not None} for m in messages])
    variables = {name: token for name, token in (("bos_token", bos_token), ("eos_token", eos_token))
                 if token is not None}
    variables.update(extra)
    variables = _plain(variables)
    variables.setdefault("tools", None)
    variables.setdefault("documents", None)
    from .chat_sandbox import Limits, render  # jinja2 is ~7 MB resident: imported by the first chat only
    return render(template, _plain(chat), add_generation_prompt, variables,
                  Limits(RENDER_SECONDS, MAX_CHARS, MADE_CHARS))


def _check_messages(messages) -> None:
    if not isinstance(messages, list) or not messages:
        raise ChatMessageError(f"messages must be a non-empty list of dicts, got {messages!r}")
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise ChatMessageError(f"messages[{i}] must be a dict, got {m!r}")
        if not isinstance(m.get("role"), str):
            raise ChatMessageError(f"messages[{i}] needs a str 'role', got {m.get('role')!r}")
        content = m.get("content")
        if content is None:
            if m.get("tool_calls"):  # an assistant turn that only calls tools (OpenAI sends None)
                continue
            raise ChatMessageError(f"messages[{i}] needs a 'content' (str or list of parts)")
        if isinstance(content, str):
            continue
        if not isinstance(content, list):
            raise ChatMessageError(f"messages[{i}]['content'] must be a str or a list of parts, got {content!r}")
        for j, part in enumerate(content):
            if not isinstance(part, Mapping) or not isinstance(part.get("type"), str):
                raise ChatMessageError(f"messages[{i}]['content'][{j}] must be a dict with a str 'type', got {part!r}")
            if part["type"] == "text" and not isinstance(part.get("text"), str):
                raise ChatMessageError(f"messages[{i}]['content'][{j}] is a text part without a str 'text'")


def _alias_reasoning(chat: list[dict]) -> list[dict]:
    out = []
    for m in chat:
        reasoning = next((m[k] for k in _REASONING_FIELDS if m.get(k) is not None), None)
        if reasoning is not None:
            m = {"thinking": reasoning, **m, "reasoning_content": reasoning}
        out.append(m)
    return out


def _plain(value):
    """A copy made of plain JSON types, so a template cannot reach methods of richer objects."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if hasattr(value, "item") and hasattr(value, "dtype") and getattr(value, "shape", None) == ():
        return _plain(value.item())  # numpy scalars
    return f"<{type(value).__name__}>"
