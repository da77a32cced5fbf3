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
output; MAX_CHARS characters (or items) for any one value it makes and for the prompt; MADE_CHARS for
all the values it makes together. Operations that could make a huge value in one step (``'x' * n``,
``s.replace(a, b)``, ``'%9999999d' % 1``, ``indent(n)``, ...) are checked before they run.

>>> render_chat("{% for m in messages %}<{{ m.role }}>{{ m.content }}\\n{% endfor %}"
...             "{% if add_generation_prompt %}<assistant>{% endif %}",
...             [{"role": "user", "content": "Hi"}])
'<user>Hi\\n<assistant>'
"""
from __future__ import annotations

import functools
import json
import re
import time
from collections.abc import Mapping
from contextvars import ContextVar
from datetime import datetime
from functools import lru_cache
from typing import ClassVar

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.compiler import CodeGenerator
from jinja2.exceptions import SecurityError, TemplateError, TemplateSyntaxError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .errors import PyllmError

_MIN_JINJA = (3, 1, 6)  # older releases have known sandbox escapes; templates are untrusted code
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")

RENDER_SECONDS = 5.0   # a real template renders a long conversation in milliseconds
MAX_CHARS = 1 << 21    # 2 Mi characters: more than any context holds (a 128k-token prompt is ~0.5 Mi)
MADE_CHARS = 1 << 25   # all values one rendering makes, together
_MAX_INT_BITS = 1 << 16


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
    budget = _Budget(time.monotonic() + RENDER_SECONDS)
    compiled = _compile(template)
    chat = _alias_reasoning([{k: v for k, v in m.items() if v is not None} for m in messages])
    variables = {name: token for name, token in (("bos_token", bos_token), ("eos_token", eos_token))
                 if token is not None}
    variables.update(extra)
    variables = _plain(variables)
    variables.setdefault("tools", None)
    variables.setdefault("documents", None)
    token = _BUDGET.set(budget)
    try:
        out, size = [], 0
        for piece in compiled.generate(messages=_plain(chat), add_generation_prompt=add_generation_prompt,
                                       **variables):
            size += len(piece)
            if size > MAX_CHARS:
                raise ChatTemplateError(f"chat template wrote more than {MAX_CHARS:,} characters")
            budget.tick()
            out.append(piece)
        return "".join(out)
    except ChatTemplateError:
        raise
    except SecurityError as e:
        raise ChatTemplateError(f"chat template blocked by the sandbox: {e}") from None
    except TemplateError as e:
        raise ChatTemplateError(f"chat template failed: {e}") from None
    except Exception as e:  # a template is a program: any failure inside it is the template's
        raise ChatTemplateError(f"chat template failed: {type(e).__name__}: {e}") from e
    finally:
        _BUDGET.reset(token)


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


class _Budget:
    """What one rendering may still spend: time until deadline, and characters of values made."""

    def __init__(self, deadline: float):
        self.deadline = deadline
        self.made = 0

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise ChatTemplateError(f"chat template took more than {RENDER_SECONDS:g} s to render")

    def need(self, size: int, what: str) -> None:
        """Refuses, before it runs, an operation that would make a value of size characters."""
        if size > MAX_CHARS:
            raise ChatTemplateError(f"chat template would make {what} of {size:,} characters or items "
                                    f"(at most {MAX_CHARS:,})")

    def charge(self, value):
        size = _size(value)
        self.need(size, "a value")
        self.made += size
        if self.made > MADE_CHARS:
            raise ChatTemplateError(f"chat template made more than {MADE_CHARS:,} characters of values")
        self.tick()
        return value

    def loop(self, iterable):
        for i, item in enumerate(iterable):
            if not i & 255:
                self.tick()
            yield item


_BUDGET: ContextVar[_Budget | None] = ContextVar("pyllm_chat_template_budget", default=None)


def _size(value) -> int:
    return len(value) if isinstance(value, (str, bytes, list, tuple, dict, set, frozenset)) else 0


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# Widths and precisions in printf-style and str.format format strings.
_PRINTF_WIDTHS = re.compile(r"%[-#0 +]*(\d*)(?:\.(\d*))?")
_FORMAT_SPECS = re.compile(r"\{[^{}]*:([^{}]*)\}")


def _check_args(budget: _Budget, args, kwargs) -> None:
    """No int argument larger than a value may be (a width, a count, a fill)."""
    for value in (*args, *kwargs.values()):
        if _is_int(value) and abs(value) > MAX_CHARS:
            budget.need(abs(value), "a value (from an argument)")


def _check_format(budget: _Budget, fmt) -> None:
    if not isinstance(fmt, str):
        return
    numbers = [n for m in _PRINTF_WIDTHS.finditer(fmt) for n in m.groups() if n]
    numbers += [n for spec in _FORMAT_SPECS.findall(fmt) for n in re.findall(r"\d+", spec)]
    if numbers:
        budget.need(max(int(n) for n in numbers), "a formatted string")


def _replaced_size(s, old, new) -> int:
    if not all(isinstance(x, str) for x in (s, old, new)):
        return 0
    hits = s.count(old) if old else len(s) + 1
    return len(s) + hits * len(new)


def _joined_size(sep, items) -> int:
    if not isinstance(items, (list, tuple, str, dict)):
        return 0  # an iterator: its result is charged once made
    return sum(_size(x) for x in items) + _size(sep) * len(items)


def _check_binop(budget: _Budget, op: str, left, right) -> None:
    if op == "*":
        for seq, n in ((left, right), (right, left)):
            if _size(seq) and _is_int(n):
                budget.need(_size(seq) * n, "a repeated value")
        if _is_int(left) and _is_int(right) and left.bit_length() + right.bit_length() > _MAX_INT_BITS:
            raise _too_big_int()
    elif op == "+" and _size(left) and _size(right):
        budget.need(_size(left) + _size(right), "a concatenation")
    elif op == "**" and _is_int(left) and _is_int(right) and abs(left) > 1 and right > 0:
        if left.bit_length() * right > _MAX_INT_BITS:
            raise _too_big_int()
    elif op == "%" and isinstance(left, str):
        _check_format(budget, left)
        _check_args(budget, right if isinstance(right, tuple) else (right,), {})


def _too_big_int() -> ChatTemplateError:
    return ChatTemplateError(f"chat template would make an integer of more than {_MAX_INT_BITS:,} bits")


def _check_method(budget: _Budget, method, args, kwargs) -> None:
    """Estimates for the str methods whose result can be far larger than their inputs."""
    method = getattr(method, "__wrapped__", method)  # the sandbox wraps str.format
    owner, name = getattr(method, "__self__", None), getattr(method, "__name__", "")
    if not isinstance(owner, str):
        return
    if name == "replace" and len(args) >= 2:
        budget.need(_replaced_size(owner, args[0], args[1]), "a replaced string")
    elif name == "join" and args:
        budget.need(_joined_size(owner, args[0]), "a joined string")
    elif name == "expandtabs":
        size = args[0] if args else kwargs.get("tabsize", 8)
        if _is_int(size):
            budget.need(len(owner) + owner.count("\t") * size, "an expanded string")
    elif name in ("format", "format_map"):
        _check_format(budget, owner)


def _guarded_filter(name: str, f):
    """The filter f, with its result charged and, for those whose result can be far larger than
    their input, the size it would make checked first."""
    skip = 1 if getattr(f, "jinja_pass_arg", None) is not None else 0

    @functools.wraps(f)
    def guarded(*args, **kwargs):
        budget = _BUDGET.get()
        if budget is None:  # jinja's optimizer folding constants while compiling: not unbounded
            raise jinja2.nodes.Impossible()
        own = args[skip:]
        _check_args(budget, own, kwargs)
        if name == "replace" and len(own) >= 3:
            budget.need(_replaced_size(*own[:3]), "a replaced string")
        elif name == "join" and own:
            budget.need(_joined_size(own[1] if len(own) > 1 else kwargs.get("d", ""), own[0]),
                        "a joined string")
        elif name == "indent" and own and isinstance(own[0], str):
            width = own[1] if len(own) > 1 else kwargs.get("width", 4)
            budget.need((own[0].count("\n") + 1) * (_size(width) or (width if _is_int(width) else 0)),
                        "an indented string")
        elif name == "wordwrap" and own and isinstance(own[0], str):
            wrap = kwargs.get("wrapstring") or (own[3] if len(own) > 3 else None)
            budget.need(len(own[0]) * (1 + _size(wrap)), "a wrapped string")
        elif name == "format" and own:
            _check_format(budget, own[0])
        elif name == "tojson":
            indent = own[1] if len(own) > 1 else kwargs.get("indent")
            if (_size(indent) or (indent if _is_int(indent) else 0)) > 64:
                raise ChatTemplateError(f"chat template asks tojson for an indent of {indent!r} (at most 64)")
        return budget.charge(f(*args, **kwargs))

    return guarded


class _CodeGenerator(CodeGenerator):
    """jinja's code generator with the two hooks a sandbox lacks: every for-loop's iterable goes
    through environment.guard_loop (a template can loop without calling anything) and every ``~``
    concatenation through environment.charge."""

    def visit_Template(self, node, frame=None):
        self._loop_iterables = {id(loop.iter) for loop in node.find_all(jinja2.nodes.For)}
        super().visit_Template(node, frame)

    def visit(self, node, *args, **kwargs):
        if id(node) in getattr(self, "_loop_iterables", ()):
            self.write("environment.guard_loop(")
            super().visit(node, *args, **kwargs)
            self.write(")")
        else:
            super().visit(node, *args, **kwargs)

    def visit_Concat(self, node, frame):
        self.write("environment.charge(")
        super().visit_Concat(node, frame)
        self.write(")")


class _Sandbox(ImmutableSandboxedEnvironment):
    code_generator_class = _CodeGenerator
    intercepted_binops = frozenset({"*", "+", "**", "%"})

    def unsafe_undefined(self, obj, attribute):
        raise SecurityError(f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe")

    def call_binop(self, context, operator, left, right):
        budget = _BUDGET.get()
        if budget is None:
            return super().call_binop(context, operator, left, right)
        _check_binop(budget, operator, left, right)
        return budget.charge(super().call_binop(context, operator, left, right))

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja's own spelling)
        budget = _BUDGET.get()
        if budget is None:
            return super().call(__context, __obj, *args, **kwargs)
        _check_args(budget, args, kwargs)
        _check_method(budget, __obj, args, kwargs)
        return budget.charge(super().call(__context, __obj, *args, **kwargs))

    def guard_loop(self, iterable):
        budget = _BUDGET.get()
        return iterable if budget is None else budget.loop(iterable)

    def charge(self, value):
        budget = _BUDGET.get()
        return value if budget is None else budget.charge(value)


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
    env.filters = {name: _guarded_filter(name, f) for name, f in env.filters.items()}
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
    except (SyntaxError, RecursionError) as e:
        # Blocks nested past what Python compiles (IndentationError, "too many statically nested
        # blocks") or past the parser's recursion limit.
        raise ChatTemplateError(f"chat template is nested too deeply to compile "
                                f"({type(e).__name__}: {e.msg if isinstance(e, SyntaxError) else e})") from None
