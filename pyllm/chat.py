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

>>> render_chat("{% for m in messages %}<{{ m.role }}>{{ m.content }}\\n{% endfor %}"
...             "{% if add_generation_prompt %}<assistant>{% endif %}",
...             [{"role": "user", "content": "Hi"}])
'<user>Hi\\n<assistant>'
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from functools import lru_cache
from typing import ClassVar

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.exceptions import SecurityError, TemplateError, TemplateSyntaxError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .errors import PyllmError

_MIN_JINJA = (3, 1, 6)  # older releases have known sandbox escapes; templates are untrusted code
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class ChatTemplateError(PyllmError):
    """A chat template failed: bad syntax, a raise_exception() call (its message verbatim), an
    unsafe operation blocked by the sandbox, or any other error while rendering."""


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
    compiled = _compile(template)
    chat = _alias_reasoning([{k: v for k, v in m.items() if v is not None} for m in messages])
    variables = {name: token for name, token in (("bos_token", bos_token), ("eos_token", eos_token))
                 if token is not None}
    variables.update(extra)
    variables = _plain(variables)
    variables.setdefault("tools", None)
    variables.setdefault("documents", None)
    try:
        return compiled.render(messages=_plain(chat), add_generation_prompt=add_generation_prompt,
                               **variables)
    except ChatTemplateError:
        raise
    except SecurityError as e:
        raise ChatTemplateError(f"chat template blocked by the sandbox: {e}") from None
    except TemplateError as e:
        raise ChatTemplateError(f"chat template failed: {e}") from None
    except Exception as e:  # a template is a program: any failure inside it is the template's
        raise ChatTemplateError(f"chat template failed: {type(e).__name__}: {e}") from e


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


class _Sandbox(ImmutableSandboxedEnvironment):
    def unsafe_undefined(self, obj, attribute):
        raise SecurityError(f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe")


class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}…{% endgeneration %}`` marks assistant text for training masks in
    transformers; here it renders its body unchanged."""

    tags: ClassVar[set[str]] = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


class _Namespace(jinja2.utils.Namespace):
    # Underscore names on a namespace are a path to CPython internals; transformers refuses them too.
    def __init__(*args, **kwargs):
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name):
        if isinstance(name, str) and name.startswith("_"):
            raise SecurityError(f"chat templates cannot store underscore-prefixed attributes, got {name!r}")


class _Dict:
    # dict() for templates, without the dict type itself (and its class attributes) in reach.
    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


def _raise_exception(message):
    raise ChatTemplateError(str(message))


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # jinja's own tojson escapes <, >, & and ' for HTML, which would change the prompt text.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format):
    return datetime.now().strftime(format)


@lru_cache(maxsize=32)
def _compile(template: str) -> jinja2.Template:
    version = tuple(int(p) for p in jinja2.__version__.split(".")[:3] if p.isdigit())
    if version < _MIN_JINJA:
        raise ChatTemplateError(f"chat templates need jinja2 >= 3.1.6 (older sandboxes have known escapes), "
                                f"found {jinja2.__version__}")
    env = _Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _Dict()
    env.globals["namespace"] = _Namespace
    try:
        return env.from_string(template)
    except TemplateSyntaxError as e:
        raise ChatTemplateError(f"chat template syntax error on line {e.lineno}: {e.message}") from None
    except TemplateError as e:
        raise ChatTemplateError(f"chat template does not compile: {e}") from None
