"""Chat templates render byte-identically to transformers' apply_chat_template (ChatML as SmolLM2
ships it, Llama 3 and 3.1 with tools, Gemma 3, Mistral [INST] with a BOS token), template errors
and raise_exception() surface as ChatTemplateError, bad messages as ChatMessageError, and the sandbox
stops escapes with a pyllm error instead of running them; a template that would run too long or
make too much is stopped with a ChatTemplateError before it does."""
from __future__ import annotations

import time
import tracemalloc
from datetime import datetime

import pytest
import tokenizers
import transformers

from pyllm import chat as pyllm_chat
from pyllm.chat import ChatMessageError, ChatTemplateError, render_chat
from pyllm.errors import PyllmError


SMOLLM2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

# Llama 3.1/3.2 style: tools as indented JSON, strftime_now for the date, namespaces, tool calls.
LLAMA31_TOOLS = """{{- bos_token }}
{%- if not date_string is defined %}
    {%- if strftime_now is defined %}
        {%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}
        {%- set date_string = "26 Jul 2024" %}
    {%- endif %}
{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{%- if tools is not none %}
    {{- "Environment: ipython\\n" }}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{%- if tools is not none %}
    {{- "You have access to the following functions:\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- set ns = namespace(turns=0) %}
{%- for message in messages %}
    {%- set ns.turns = ns.turns + 1 %}
    {%- if message.role == 'assistant' and message.tool_calls is defined %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
        {%- for call in message.tool_calls %}
            {{- '{"name": "' + call.function.name + '", "parameters": ' }}
            {{- call.function.arguments | tojson }}
            {{- "}" }}
        {%- endfor %}
        {{- "<|eot_id|>" }}
    {%- elif message.role == 'tool' %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}
        {%- if message.content is mapping or message.content is iterable and message.content is not string %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- else %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

GEMMA3 = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"""

MISTRAL = """{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('After the optional system message, conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {%- if loop.first and system_message is defined %}
            {{- ' [INST] ' + system_message + '\n\n' + message['content'] + ' [/INST]' }}
        {%- else %}
            {{- ' [INST] ' + message['content'] + ' [/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'assistant' %}
        {{- ' ' + message['content'] + eos_token}}
    {%- else %}
        {{- raise_exception('Only user and assistant roles are supported, with the exception of an initial optional system message!') }}
    {%- endif %}
{%- endfor %}
"""

# Exercises what transformers' environment adds: loop controls, {% generation %}, dict(),
# tojson keeping non-ASCII and HTML characters, and reasoning fields under both names.
FEATURES = """{%- for m in messages %}
{%- if m.role == 'stop' %}{% break %}{% endif %}
{%- if m.role == 'skip' %}{% continue %}{% endif %}
<{{ m.role }}>
{%- if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}
{%- else %}{{ m.content | tojson }}{% endif %}
{%- if m.thinking is defined %}[think:{{ m.thinking }}|{{ m.reasoning_content }}]{% endif %}
{%- if m.content is not defined %}[no content]{% endif %}
{% endfor %}
{{- dict(a=1, b=[1, 2]) | tojson(separators=(',', ':'), sort_keys=True) }}
{{- extra_var | default('none') }}{% if add_generation_prompt %}<assistant>{% endif %}"""

SYSTEM = {"role": "system", "content": "You are terse. Ünïcödé ✓ <b>&amp;</b>"}
CONVERSATION = [
    {"role": "user", "content": "  What is 2+2?  "},
    {"role": "assistant", "content": "4."},
    {"role": "user", "content": "And 3+3? Answer in 日本語."},
]


def hf_render(template: str, messages: list[dict], bos: str | None = "<s>", eos: str | None = "</s>",
              add_generation_prompt: bool = True, **kwargs) -> str:
    """transformers' apply_chat_template with a tokenizer whose only special tokens are bos and eos."""
    vocab = {"<s>": 0, "</s>": 1, "[UNK]": 2}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    specials = {k: v for k, v in (("bos_token", bos), ("eos_token", eos)) if v is not None}
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, **specials)
    return tok.apply_chat_template(messages, chat_template=template, tokenize=False,
                                   add_generation_prompt=add_generation_prompt, **kwargs)


def assert_matches_transformers(template, messages, bos="<s>", eos="</s>", add_generation_prompt=True, **kw):
    ours = render_chat(template, messages, bos_token=bos, eos_token=eos,
                       add_generation_prompt=add_generation_prompt, **kw)
    theirs = hf_render(template, messages, bos, eos, add_generation_prompt, **kw)
    assert ours == theirs
    return ours


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("messages", [CONVERSATION[:1], CONVERSATION, [SYSTEM] + CONVERSATION],
                         ids=["one-turn", "multi-turn", "system+multi-turn"])
@pytest.mark.parametrize("template", [SMOLLM2, LLAMA3, LLAMA31_TOOLS, GEMMA3, MISTRAL],
                         ids=["smollm2-chatml", "llama3", "llama3.1-tools", "gemma3", "mistral"])
def test_renders_byte_identical_to_transformers(template, messages, add_generation_prompt):
    assert_matches_transformers(template, messages, add_generation_prompt=add_generation_prompt,
                                date_string="01 Jan 2025")


def test_smollm2_chatml_output_is_what_the_model_expects():
    out = assert_matches_transformers(SMOLLM2, [{"role": "user", "content": "hi"}], bos="<|im_start|>",
                                      eos="<|im_end|>")
    assert out == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                   "<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_smollm2_template_from_the_model_files_matches_transformers(smollm2_folder):
    import json
    import os

    path = os.path.join(smollm2_folder, "tokenizer_config.json")
    with open(path, encoding="utf-8") as f:
        config = json.load(f)
    tok = transformers.AutoTokenizer.from_pretrained(os.path.dirname(path))
    for messages in (CONVERSATION, [SYSTEM] + CONVERSATION):
        ours = render_chat(config["chat_template"], messages, bos_token=config["bos_token"],
                           eos_token=config["eos_token"], unk_token=config["unk_token"],
                           pad_token=config["pad_token"])
        assert ours == tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def test_mistral_puts_bos_first_and_eos_after_answers():
    out = assert_matches_transformers(MISTRAL, [SYSTEM] + CONVERSATION)
    assert out.startswith("<s> [INST] You are terse.") and out.count("</s>") == 1


def test_llama31_tools_render_as_indented_json_like_transformers():
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "Weather in a city, «quoted» & <escaped>?",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    messages = [SYSTEM, {"role": "user", "content": "Weather in Zürich?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}]},
                {"role": "tool", "content": '{"temp_c": 21}'},
                {"role": "user", "content": "Thanks"}]
    out = assert_matches_transformers(LLAMA31_TOOLS, messages, tools=tools, date_string="01 Jan 2025")
    assert '    "name": "get_weather"' in out and "Zürich" in out and "<escaped>" in out


def test_strftime_now_gives_todays_date():
    out = render_chat(LLAMA31_TOOLS, CONVERSATION)
    assert f"Today Date: {datetime.now().strftime('%d %b %Y')}" in out  # (flaky only at midnight)


def test_gemma3_content_parts_pass_through_like_transformers():
    messages = [{"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
                {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": " Describe. "}]}]
    out = assert_matches_transformers(GEMMA3, messages, bos="<bos>", eos="<eos>")
    assert out == ("<bos><start_of_turn>user\nBe brief.\n\n<start_of_image>Describe.<end_of_turn>\n"
                   "<start_of_turn>model\n")


def test_transformers_extras_render_the_same():
    messages = [{"role": "user", "content": "<b>café</b> & 'quotes'"},
                {"role": "assistant", "content": "answer", "reasoning_content": "because"},
                {"role": "assistant", "content": None, "tool_calls": [{"id": "x"}]},
                {"role": "skip", "content": "hidden"},
                {"role": "user", "content": "après", "reasoning": "old name"},
                {"role": "stop", "content": "end"},
                {"role": "user", "content": "never shown"}]
    out = assert_matches_transformers(FEATURES, messages, extra_var="set")
    assert '"<b>café</b> & \'quotes\'"' in out and "hidden" not in out and "never shown" not in out
    assert '{"a":1,"b":[1,2]}' in out and "[think:because|because]" in out


def test_missing_special_tokens_are_undefined_like_transformers():
    template = "[{{ bos_token }}][{{ eos_token }}]{{ messages[0].content }}"
    assert assert_matches_transformers(template, CONVERSATION[:1], bos=None, eos=None) == "[][]  What is 2+2?  "


# ---------------------------------------------------------------------------------------------
# Errors

def test_raise_exception_surfaces_as_chat_template_error_with_its_message():
    bad_roles = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    with pytest.raises(ChatTemplateError) as info:
        render_chat(GEMMA3, bad_roles, bos_token="<bos>")
    assert str(info.value) == "Conversation roles must alternate user/assistant/user/assistant/..."
    assert isinstance(info.value, PyllmError)
    with pytest.raises(ChatTemplateError, match="Only user and assistant roles"):
        render_chat(MISTRAL, [{"role": "user", "content": "x"}, {"role": "tool", "content": "y"}],
                    bos_token="<s>", eos_token="</s>")
    with pytest.raises(ChatTemplateError, match="Conversation roles must alternate"):
        render_chat(GEMMA3, [{"role": "assistant", "content": "first"}])


@pytest.mark.parametrize("template", ["{% for m in messages %}{{ m.content }", "{% if %}", "{{ x | nosuchfilter }}",
                                      "{% endfor %}"])
def test_template_syntax_errors_raise_chat_template_error(template):
    with pytest.raises(ChatTemplateError, match="chat template"):
        render_chat(template, CONVERSATION)


@pytest.mark.parametrize("template", [
    "{{ ''.__class__ }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ messages.__class__.__base__ }}",
    "{{ ''['__class__'] }}",
    "{{ raise_exception.__globals__ }}",
    "{{ cycler.__init__.__globals__.os.popen('echo pwned').read() }}",
    "{{ messages.append({'role': 'x'}) }}",
    "{{ messages[0].update(role='x') }}",
    "{% set ns = namespace(_x=1) %}",
    "{{ dict.__class__ }}",
])
def test_sandbox_blocks_escapes_with_a_pyllm_error(template):
    with pytest.raises(ChatTemplateError):
        render_chat(template, [{"role": "user", "content": "hi"}])


def test_runtime_errors_inside_templates_raise_chat_template_error():
    for template in ("{{ messages[0]['content'] + 1 }}", "{{ 1 / 0 }}", "{{ undefined_thing.attr }}",
                     "{{ messages[5].content }}x{{ messages[5].content.upper() }}"):
        with pytest.raises(ChatTemplateError):
            render_chat(template, CONVERSATION)
    with pytest.raises(ChatTemplateError, match="non-empty string"):
        render_chat("", CONVERSATION)


@pytest.mark.parametrize("messages", [
    [], "hello", [("user", "hi")], [{"content": "no role"}], [{"role": 1, "content": "x"}],
    [{"role": "user"}], [{"role": "user", "content": 5}], [{"role": "user", "content": [{"text": "no type"}]}],
    [{"role": "user", "content": [{"type": "text", "text": 3}]}], [{"role": "user", "content": ["raw"]}],
])
def test_bad_messages_raise_chat_message_error(messages):
    with pytest.raises(ChatMessageError):
        render_chat(SMOLLM2, messages)


def test_messages_are_not_modified():
    messages = [{"role": "user", "content": "x", "reasoning": "r", "name": None}]
    render_chat(FEATURES, messages)
    assert messages == [{"role": "user", "content": "x", "reasoning": "r", "name": None}]


# ---------------------------------------------------------------------------------------------
# Bounds: a template from a downloaded file runs on every chat() call

HI = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("template", [
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "{% set s = 'x' * 100000 %}{% for a in s %}{% for b in s %}{% endfor %}{% endfor %}",
    "{% for i in range(100000) %}{% for j in range(100000) %}{{ '' }}{% endfor %}{% endfor %}",
    "{% macro f(n) %}{% for i in range(100000) %}{% endfor %}{{ f(n) if n else '' }}{% endmacro %}{{ f(1) }}",
    # one call of a filter that runs for seconds inside itself (9 s here, unbounded)
    "{{ ('a ' * 900000)|urlize|length }}",
], ids=["empty-loops", "loops-over-a-string", "loops-writing-nothing", "recursive-macro", "urlize"])
def test_a_template_that_runs_too_long_is_stopped(template, monkeypatch):
    monkeypatch.setattr(pyllm_chat, "RENDER_SECONDS", 0.3)
    started = time.monotonic()
    with pytest.raises(ChatTemplateError, match=r"chat template took more than 0.3 s to render"):
        render_chat(template, HI)
    assert time.monotonic() - started < 3  # stopped near its deadline, not when the call returns


NESTED = "{% set a = [0] * 500 %}{% set b = [a] * 1000 %}{% set c = [b, b, b, b, b, b, b, b, b, b] %}"


# Each would make (or make in steps) a value of 100 MB or more; the check comes before the value.
@pytest.mark.parametrize("template", [
    "{{ 'x' * 10**8 }}",
    "{{ [0] * 10**8 }}",
    "{% set ns = namespace(s='xx') %}{% for i in range(26) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
    "{% set ns = namespace(s='xx') %}{% for i in range(26) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
    "{% macro d(s, n) %}{{ d(s ~ s, n - 1) if n else s|length }}{% endmacro %}{{ d('xx', 26) }}",
    "{% set a = 'x' * 2000000 %}{% set b = a ~ a %}{% set c = b ~ b %}{{ (c ~ c)|length }}",
    "{{ 'x'.center(10**8) }}",
    "{{ 'x'|center(10**8) }}",
    "{% set s = 'x' * 10000 %}{{ s.replace('x', s)|length }}",
    "{% set s = 'x' * 10000 %}{{ s|replace('x', s)|length }}",
    "{% set s = 'x' * 10000 %}{{ ([s] * 10000)|join|length }}",
    "{{ '%0100000000d' % 1 }}",
    "{{ '%0100000000d'|format(1) }}",
    "{{ '{:>100000000}'.format(1) }}",
    "{{ '{:>{w}}'.format(1, w=10**8) }}",
    "{{ '{0:{1}}'.format('x', '100000000') }}",  # a width given as a string, in a nested field
    "{{ '{:{}}'.format('x', '100000000') }}",
    "{{ '{a:>{b}}'.format_map({'a': 'x', 'b': '100000000'}) }}",
    "{{ '{0:.{1}f}'.format(1.5, '100000000') }}",
    "{{ '%(a)100000000s' % {'a': 1} }}",
    "{{ '%(a)100000000s'|format(a=1) }}",
    "{{ '%*d' % (100000000, 1) }}",
    "{{ lipsum(n=200000) }}",
    "{{ lipsum(1000, false, 1000, 1000) }}",
    # a list holding one list many times is small in items and huge as text
    NESTED + "{{ [c, c, c, c, c, c, c, c, c, c]|string|length }}",
    NESTED + "{{ [c, c, c, c, c, c, c, c, c, c] }}",
    NESTED + "{{ ('x' ~ [c, c, c, c, c, c, c, c, c, c])|length }}",
    NESTED + "{{ '{}'.format([c, c, c, c, c, c, c, c, c, c])|length }}",
    NESTED + "{{ ('%s' % [[c, c, c, c, c, c, c, c, c, c]])|length }}",
    NESTED + "{{ [c, c, c, c, c, c, c, c, c, c]|tojson|length }}",
    "{{ 10 ** 1000000 }}",
    "{% set ns = namespace(n=10) %}{% for i in range(21) %}{% set ns.n = ns.n * ns.n %}{% endfor %}",
    "{% set s = '\n' * 100000 %}{{ s|indent(1000)|length }}",
    "{% set s = '\t' * 100000 %}{{ s.expandtabs(1000)|length }}",
    "{{ messages|tojson(indent=10**8) }}",
    "{{ [1]|batch(10**8, 'x')|list|length }}",
    "{% set ns = namespace(l=[]) %}{% for i in range(100) %}{% set ns.l = ns.l + ['x' * 2000000 ~ i] %}{% endfor %}",
])
def test_a_template_that_would_make_a_huge_value_is_refused_before_it_does(template):
    tracemalloc.start()
    try:
        with pytest.raises(ChatTemplateError, match=r"chat template (would make|made more than|asks tojson)"):
            render_chat(template, HI)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 80 * 2**20


def test_a_sum_of_sequences_is_refused():
    # sum(start=[]) concatenates in C, copying what it has at each item: hours for these 100k lists
    with pytest.raises(ChatTemplateError, match="only numbers are summed"):
        render_chat("{{ ([[0] * 2] * 100000)|sum(start=[])|length }}", HI)
    assert render_chat("{{ [1, 2.5]|sum }}{{ [{'n': 2}]|sum(attribute='n', start=1) }}", HI) == "3.53"


def test_a_template_that_writes_more_than_any_prompt_is_refused():
    with pytest.raises(ChatTemplateError, match="chat template wrote more than 2,097,152 characters"):
        render_chat("{% for i in range(3000) %}{{ 'x' * 1000 }}{% endfor %}", HI)


def test_bounds_leave_a_long_conversation_alone():
    conversation = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " + "word " * 400}
                    for i in range(200)]
    assert_matches_transformers(SMOLLM2, conversation)
    assert_matches_transformers(LLAMA31_TOOLS, conversation)


@pytest.mark.parametrize("template, error", [
    ("{% if true %}" * 120 + "x" + "{% endif %}" * 120, "IndentationError"),
    ("{% for x in [1] %}" * 30 + "x" + "{% endfor %}" * 30, "SyntaxError"),
    ("{{ " + "(" * 5000 + "1" + ")" * 5000 + " }}", "RecursionError"),
    ("{{ " + "[" * 5000 + "]" * 5000 + " }}", "RecursionError"),
])
def test_templates_nested_too_deeply_to_compile_raise_chat_template_error(template, error):
    with pytest.raises(ChatTemplateError, match=f"nested too deeply to compile \\({error}"):
        render_chat(template, HI)
