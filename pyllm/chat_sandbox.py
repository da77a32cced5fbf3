"""The jinja2 sandbox that renders chat templates, with the bounds on time and size described in
chat.py (which holds the limits, so they can be changed in one place). Imported on the first
rendering only: jinja2 costs ~7 MB of resident memory that a model used without chat never needs.
"""
from __future__ import annotations

import functools
import json
import re
import sys
import time
import types
from contextvars import ContextVar
from datetime import datetime
from functools import lru_cache
from typing import ClassVar, NamedTuple

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.compiler import CodeGenerator
from jinja2.exceptions import SecurityError, TemplateError, TemplateSyntaxError
from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedFormatter
from jinja2.utils import generate_lorem_ipsum

from .checks import is_int
from .errors import ChatTemplateError

_MIN_JINJA = (3, 1, 6)  # older releases have known sandbox escapes; templates are untrusted code
_MAX_INT_BITS = 1 << 16


class Limits(NamedTuple):
    """What one rendering may spend (chat.py sets them)."""
    seconds: float      # of rendering
    max_chars: int      # of the output, and of any one value
    made_chars: int     # of all values made together


def render(template: str, messages: list, add_generation_prompt: bool, variables: dict, limits: Limits) -> str:
    """template rendered over messages and variables (plain JSON values, prepared by render_chat),
    within limits; any failure is a ChatTemplateError."""
    budget = _Budget(time.monotonic() + limits.seconds, limits)
    compiled = _compile(template)
    token = _BUDGET.set(budget)
    try:
        out, size = [], 0
        for piece in compiled.generate(messages=messages, add_generation_prompt=add_generation_prompt,
                                       **variables):
            size += len(piece)
            if size > limits.max_chars:
                raise ChatTemplateError(f"chat template wrote more than {limits.max_chars:,} characters")
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


class _Budget:
    """What one rendering may still spend: time until deadline, and characters of values made."""

    def __init__(self, deadline: float, limits: Limits):
        self.deadline = deadline
        self.limits = limits
        self.made = 0
        self.calls = 0

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise ChatTemplateError(f"chat template took more than {self.limits.seconds:g} s to render")

    def run(self, f, *args, **kwargs):
        """f(*args, **kwargs), the deadline checked at the calls made inside it too: a global or
        filter can spend its time in one call (lipsum, wordwrap, urlize, a macro), where no loop
        step or piece of output is seen. Not inside another such call, whose watch goes on, nor
        where a profiler (cProfile) already watches this thread."""
        if sys.getprofile() is not None:
            return f(*args, **kwargs)
        sys.setprofile(self._watch)
        try:
            return f(*args, **kwargs)
        finally:
            sys.setprofile(None)

    def _watch(self, frame, event, arg) -> None:
        # a profile function: its exception stops the call it came from (and the profiling)
        self.calls += 1
        if not self.calls & 1023:
            self.tick()

    def need(self, size: int, what: str) -> None:
        """Refuses, before it runs, an operation that would make a value of size characters."""
        if size > self.limits.max_chars:
            raise ChatTemplateError(f"chat template would make {what} of {size:,} characters or items "
                                    f"(at most {self.limits.max_chars:,})")

    def charge(self, value):
        size = _size(value)
        self.need(size, "a value")
        self.made += size
        if self.made > self.limits.made_chars:
            raise ChatTemplateError(f"chat template made more than {self.limits.made_chars:,} characters of values")
        self.tick()
        return value

    def loop(self, iterable):
        for i, item in enumerate(iterable):
            if not i & 255:
                self.tick()
            yield item


_BUDGET: ContextVar[_Budget | None] = ContextVar("pyllm_chat_template_budget", default=None)


_CONTAINERS = (list, tuple, dict, set, frozenset)


def _size(value) -> int:
    """The characters of a str (or bytes), or about those of a container's text; 0 for anything else."""
    if isinstance(value, (str, bytes)):
        return len(value)
    return _text_size(value, {}) if isinstance(value, _CONTAINERS) else 0


def _text_size(value, seen: dict) -> int:
    """About the characters of value's text, its contents counted: a list can hold one list a thousand
    times ([b] * 1000 has 1000 items, and b's text 1000 times). Each container is walked once (seen)."""
    if isinstance(value, (str, bytes)):
        return len(value) + 2
    if not isinstance(value, _CONTAINERS):
        return value.bit_length() // 3 + 2 if is_int(value) else 4
    if id(value) not in seen:
        items = [x for pair in value.items() for x in pair] if isinstance(value, dict) else value
        seen[id(value)] = 2 * len(value) + 2 + sum(_text_size(x, seen) for x in items)
    return seen[id(value)]


# Widths and precisions in printf-style format strings ("%(name)-12.4f"); a "*" width comes from
# the arguments, which _check_args bounds.
_PRINTF_WIDTHS = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\d*)(?:\.(\d*))?")


def _check_args(budget: _Budget, args, kwargs) -> None:
    """No int argument larger than a value may be (a width, a count, a fill)."""
    for value in (*args, *kwargs.values()):
        if is_int(value) and abs(value) > budget.limits.max_chars:
            budget.need(abs(value), "a value (from an argument)")


def _check_format(budget: _Budget, fmt) -> None:
    if not isinstance(fmt, str):
        return
    numbers = [n for m in _PRINTF_WIDTHS.finditer(fmt) for n in m.groups() if n]
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
            if _size(seq) and is_int(n):
                budget.need(_size(seq) * n, "a repeated value")
        if is_int(left) and is_int(right) and left.bit_length() + right.bit_length() > _MAX_INT_BITS:
            raise _too_big_int()
    elif op == "+" and _size(left) and _size(right):
        budget.need(_size(left) + _size(right), "a concatenation")
    elif op == "**" and is_int(left) and is_int(right) and abs(left) > 1 and right > 0:
        if left.bit_length() * right > _MAX_INT_BITS:
            raise _too_big_int()
    elif op == "%" and isinstance(left, str):
        _check_format(budget, left)
        _check_args(budget, right if isinstance(right, tuple) else (right,), {})
        budget.need(len(left) + _size(right), "a formatted string")


def _too_big_int() -> ChatTemplateError:
    return ChatTemplateError(f"chat template would make an integer of more than {_MAX_INT_BITS:,} bits")


def _check_method(budget: _Budget, method, args, kwargs) -> None:
    """Estimates for the str methods whose result can be far larger than their inputs."""
    owner, name = getattr(method, "__self__", None), getattr(method, "__name__", "")
    if not isinstance(owner, str):
        return
    if name == "replace" and len(args) >= 2:
        budget.need(_replaced_size(owner, args[0], args[1]), "a replaced string")
    elif name == "join" and args:
        budget.need(_joined_size(owner, args[0]), "a joined string")
    elif name == "expandtabs":
        size = args[0] if args else kwargs.get("tabsize", 8)
        if is_int(size):
            budget.need(len(owner) + owner.count("\t") * size, "an expanded string")


# Filters that write their input out as text (or a copy of it), whatever its size in items.
_WRITING_FILTERS = frozenset({"string", "tojson", "pprint", "format", "join", "list", "e", "escape", "forceescape",
                              "safe", "urlencode", "xmlattr", "unique", "sort", "dictsort", "batch", "slice",
                              "reverse", "items", "map", "select", "reject", "selectattr", "rejectattr",
                              "groupby"})


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
        if name in _WRITING_FILTERS and own:
            budget.need(_size(own[0]), "the text of a value")
        if name == "sum" and not is_int(own[2] if len(own) > 2 else kwargs.get("start", 0)):
            # sum(start=[]) concatenates in C, copying all it has so far at each item: hours for 100k items
            raise ChatTemplateError("chat template asks sum() to add up sequences; only numbers are summed")
        if name == "replace" and len(own) >= 3:
            budget.need(_replaced_size(*own[:3]), "a replaced string")
        elif name == "join" and own:
            budget.need(_joined_size(own[1] if len(own) > 1 else kwargs.get("d", ""), own[0]),
                        "a joined string")
        elif name == "indent" and own and isinstance(own[0], str):
            width = own[1] if len(own) > 1 else kwargs.get("width", 4)
            budget.need((own[0].count("\n") + 1) * (_size(width) or (width if is_int(width) else 0)),
                        "an indented string")
        elif name == "wordwrap" and own and isinstance(own[0], str):
            wrap = kwargs.get("wrapstring") or (own[3] if len(own) > 3 else None)
            budget.need(len(own[0]) * (1 + _size(wrap)), "a wrapped string")
        elif name == "format" and own:
            _check_format(budget, own[0])
        elif name == "tojson":
            indent = own[1] if len(own) > 1 else kwargs.get("indent")
            if (_size(indent) or (indent if is_int(indent) else 0)) > 64:
                raise ChatTemplateError(f"chat template asks tojson for an indent of {indent!r} (at most 64)")
        return budget.charge(budget.run(f, *args, **kwargs))

    return guarded


class _Formatter(SandboxedFormatter):
    """str.format and str.format_map for templates: each field's spec is checked once its nested
    fields are filled in ('{0:{1}}'.format('x', '2000000000') is a width of 2,000,000,000)."""

    def format_field(self, value, format_spec):
        budget = _BUDGET.get()
        numbers = re.findall(r"\d+", format_spec)
        if budget is not None:
            budget.need(max([_size(value), *map(int, numbers)]), "a formatted value")
        return super().format_field(value, format_spec)


def _lipsum(n=5, html=True, min=20, max=100):  # noqa: A002 (jinja's own keywords)
    """jinja's lipsum, refused before it runs when it could write more than a value may hold: n
    paragraphs of up to max words, each up to 16 characters with its space and markup."""
    budget = _BUDGET.get()
    if budget is not None and is_int(n) and is_int(max):
        budget.need(n * max * 16, "lorem ipsum")
    return generate_lorem_ipsum(n=n, html=html, min=min, max=max)


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
        # each operand's text is checked before the join makes it
        self.write("environment.charge(str_join((")
        for arg in node.nodes:
            self.write("environment.check(")
            self.visit(arg, frame)
            self.write("), ")
        self.write(")))")


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
        return budget.charge(budget.run(super().call, __context, __obj, *args, **kwargs))

    def wrap_str_format(self, value):
        """str.format and str.format_map of a template's string, through _Formatter (jinja's own
        wrapper, with the bounds added)."""
        if (not isinstance(value, (types.MethodType, types.BuiltinMethodType))
                or value.__name__ not in ("format", "format_map") or not isinstance(value.__self__, str)):
            return None
        text, by_map, formatter = value.__self__, value.__name__ == "format_map", _Formatter(self)

        def wrapper(*args, **kwargs):
            if by_map:
                if kwargs or len(args) != 1:
                    raise TypeError("format_map() takes exactly one argument")
                args, kwargs = (), args[0]
            return str(formatter.vformat(text, args, kwargs))

        return wrapper

    def check(self, value):
        """value, once the text it would write is known to fit in a value (before it is written)."""
        budget = _BUDGET.get()
        if budget is not None:
            budget.need(_size(value), "the text of a value")
        return value

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
    env.finalize = env.check  # what {{ ... }} writes
    env.filters["tojson"] = _tojson
    env.filters = {name: _guarded_filter(name, f) for name, f in env.filters.items()}
    env.globals["raise_exception"] = _raise_exception
    env.globals["lipsum"] = _lipsum
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
