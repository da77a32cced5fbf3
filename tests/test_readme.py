"""The README says what is true: every `pyllm` command and option it names exists (read from the
command's own argparse parser), the install commands name real extras and no package index that
does not have pyllm, the torch it installs for the tests is the CPU build (as .ci/run's), and the
defaults it states are the code's."""
from __future__ import annotations

import argparse
import inspect
import os
import re

import pytest

import pyllm
from pyllm.cli import build_parser

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read(path: str) -> str:
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read()


README = read("README.md")


def commands() -> dict[str, set[str]]:
    """Each pyllm command ("" for `pyllm` itself) -> its option strings, from the parser."""
    parser = build_parser()
    found = {"": {s for a in parser._actions for s in a.option_strings}}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found[name] = {s for a in sub._actions for s in a.option_strings}
    return found


def code() -> list[tuple[str, bool]]:
    """The README's code: (text, is a block) for each fenced or indented block and inline span."""
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", README, re.S | re.M)
    prose = re.sub(r"^```.*?^```", "", README, flags=re.S | re.M)
    indented = re.findall(r"(?:^(?: {4}|\t)\S.*\n)+", prose, re.M)
    spans = re.findall(r"`([^`\n]+)`", prose)
    return [(b, True) for b in blocks + indented] + [(s, False) for s in spans]


PYLLM = re.compile(r"(?<![\w./\"'\[-])pyllm(?= |$)((?: [a-z][a-z-]*(?: \| [a-z][a-z-]*)*)?)", re.M)
OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def named() -> list[tuple[str | None, str, str]]:
    """(command, option or "", where) for each pyllm command and each option the README's code names.
    An option belongs to the pyllm command before it on its line (or on the line an indented line
    continues, in a block); an option in a span of its own (`--n-ctx`) to no command in particular
    (None); options of other programs (pip, python) are left out."""
    found = []
    for text, block in code():
        context = None  # the command an indented line of a block continues
        for line in text.splitlines():
            for piece in line.split("&&"):
                hits = list(PYLLM.finditer(piece))
                if hits:
                    for i, hit in enumerate(hits):
                        names = [n.strip() for n in hit[1].split("|")] if hit[1] else [""]
                        for name in names:
                            found.append((name, "", line))
                        context = names[0]
                        end = hits[i + 1].start() if i + 1 < len(hits) else len(piece)
                        found += [(context, o, line) for o in OPTION.findall(piece[hit.end():end])]
                elif block and piece[:1].isspace() and context is not None:
                    found += [(context, o, line) for o in OPTION.findall(piece)]
                elif not block and piece.lstrip().startswith("--"):
                    found += [(None, o, line) for o in OPTION.findall(piece)]
                else:
                    context = None  # another program's line
    return found


def test_the_readme_names_only_commands_and_options_that_exist():
    known = commands()
    every_option = set().union(*known.values())
    mentions = named()
    assert len({c for c, o, _ in mentions if c}) >= 10 and len([o for _, o, _ in mentions if o]) >= 40
    wrong = []
    for command, option, where in mentions:
        if command is not None and command not in known:
            wrong.append(f"no command `pyllm {command}`: {where.strip()}")
        elif option and option not in (every_option if command is None else known[command] | known[""]):
            wrong.append(f"`pyllm {command or '...'}` has no {option}: {where.strip()}")
    assert wrong == []


def test_the_reader_follows_the_options_to_their_commands():
    """The parsing above, on lines of the README's own shapes."""
    mentions = {(c, o) for c, o, _ in named() if o}
    for expected in [("run", "--repetition-penalty"), ("run", "--dtype"), ("run", "--verbose"),
                     ("chat", "--chat-template"), ("serve", "--chat-template"), ("serve", "--log-level"),
                     ("serve", "--port"), ("serve", "--parallel"), ("rm", "--yes"), ("info", "--system"),
                     ("perplexity", "--window"), ("inspect", "--plot"), (None, "--kv-dtype")]:
        assert expected in mentions
    assert not any(o in ("--only-binary", "--without-pip", "--index-url", "--strip") for _, o in mentions)


def test_install_says_what_is_true():
    install = README[README.index("## Install"):README.index("## Set-up of this repository")]
    assert "not on PyPI" in install
    assert not re.search(r"pip install \"?pyllm\b", README)  # no such distribution on any index
    extras = set(re.findall(r"^(\w+) = \[", read("pyproject.toml").split("[project.optional-dependencies]")[1]
                            .split("\n[")[0], re.M))
    named_extras = set(re.findall(r"\.\[(\w+)\]", install))
    assert named_extras == extras - {"test", "bench"}  # every user's extra, [server] included, and no other
    assert set(re.findall(r"\.\[(\w+)\]", README)) <= extras
    assert ".github/workflows/wheels.yml" in install and ".ci/wheel" in install


def test_the_tests_torch_is_the_cpu_build_in_the_readme_and_in_ci():
    readme = re.findall(r'torch==([\w.+]+)', "".join(b for b, block in code() if block))
    ci = re.findall(r'torch==([\w.+]+)', read(".ci/run"))
    assert readme and ci and set(readme) == set(ci) and all(v.endswith("+cpu") for v in readme)
    command = next(b for b, block in code() if block and "python -m pytest tests" in b)
    ci_lines = {line.removeprefix("python -m ").strip() for line in read(".ci/run").splitlines()}
    for step in command.strip().split(" && "):  # .ci/run runs the README's command as written
        assert step.removeprefix("python -m ") in ci_lines, step


@pytest.mark.parametrize("what,value", [
    ("generate", inspect.signature(pyllm.Model.generate).parameters["max_tokens"].default),
    ("chat", inspect.signature(pyllm.Model.chat).parameters["max_tokens"].default),
])
def test_the_python_defaults_stated_are_the_codes(what, value):
    defaults = README[README.index("- Defaults:"):]
    defaults = defaults[:defaults.index("\n- ")]
    sentence = next(s for s in defaults.split(";") if f"`{what}`" in s)
    assert f"`max_tokens={value}`" in sentence and "greedy" in sentence
    assert pyllm.SamplingParams().temperature == 0 and "`temperature=0`" in defaults


def test_the_command_line_defaults_stated_are_the_parsers():
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    run_max = sub["run"].get_default("max_tokens")
    chat_max = sub["chat"].get_default("max_tokens")
    defaults = README[README.index("- Defaults:"):]
    assert f"`pyllm run` writes up to {run_max} tokens" in defaults
    assert f"`pyllm chat` answers with up\n  to {chat_max}" in defaults or f"up to {chat_max}" in defaults


def test_the_readme_says_what_embed_is_and_is_not():
    text = README[README.index("- `embed` mean-pools"):]
    text = text[:text.index("\n- ")]
    assert "not a trained\n  embedding model" in text or "not a trained embedding model" in text.replace("\n  ", " ")
    assert "good for" in text
