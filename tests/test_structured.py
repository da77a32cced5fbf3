"""Constrained output (pyllm.constraints, pyllm.tool_calls): JSON schemas, regexes, choices and
grammars on generate/stream/chat, response_format and tool calls through `pyllm serve` with the
official openai client."""
from __future__ import annotations

import json
import os
import re
import shutil
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, Field

import pyllm
from conftest import make_tiny_checkpoint
from families import llama_cpp_converter
from pyllm import speculative
from pyllm.constraints import output_grammar
from pyllm.errors import PyllmError
from pyllm.generation import Generation
from pyllm.sampling import SamplingParams
from server_helpers import CHAT_TEMPLATE, ServerProcess, request


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    folder = make_tiny_checkpoint(str(tmp_path_factory.mktemp("structured")), max_position_embeddings=2048)
    path = os.path.join(folder, "tokenizer_config.json")
    with open(path) as f:
        config = json.load(f)
    with open(path, "w") as f:
        json.dump({**config, "chat_template": CHAT_TEMPLATE}, f)
    return folder


@pytest.fixture(scope="module")
def tiny(tiny_folder):
    return pyllm.load(tiny_folder, parallel=3)


PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 8},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3}},
    "required": ["name", "age"], "additionalProperties": False}


@pytest.mark.parametrize("n", [1, 31, 32, 33, 1000, 49152])
def test_the_mask_keeps_exactly_the_allowed_logits(n):
    """_core.masked_logits, which applies llguidance's bits: whole words clear, set and mixed."""
    rng = np.random.default_rng(n)
    logits = rng.standard_normal(n).astype(np.float32)
    allowed = np.zeros(n, bool)
    allowed[n // 4: n // 2] = True
    allowed[n // 2:] = rng.random(n - n // 2) < 0.3
    bits = np.packbits(np.concatenate([allowed, np.zeros(-n % 32, bool)]), bitorder="little").view(np.int32)
    out = np.empty(n, np.float32)
    pyllm._core.masked_logits(logits, bits, out)
    assert np.array_equal(out, np.where(allowed, logits, -np.inf).astype(np.float32))


def test_every_sampler_gives_matching_output(tiny):
    """Greedy, temperature, top-k, top-p, min-p, typical-p and the penalties: the output matches."""
    samplers = [{}, {"temperature": 1.5, "seed": 1}, {"temperature": 1.0, "top_k": 3, "seed": 2},
                {"temperature": 0.9, "top_p": 0.5, "seed": 3}, {"temperature": 1.2, "min_p": 0.2, "seed": 4},
                {"temperature": 1.0, "typical_p": 0.7, "seed": 5},
                {"temperature": 1.0, "repetition_penalty": 1.3, "presence_penalty": 0.5,
                 "frequency_penalty": 0.5, "logit_bias": {5: 3.0}, "seed": 6}]
    for params in samplers:
        c = tiny.generate("The wheel", json_schema=PERSON, max_tokens=300, **params)
        assert c.finish_reason == "stop", (params, c.text)
        jsonschema.validate(json.loads(c.text), PERSON)
        assert re.fullmatch(r"[0-9]{3}-[a-z]{2,4}",
                            tiny.generate("x", regex=r"[0-9]{3}-[a-z]{2,4}", max_tokens=20, **params).text)
        assert tiny.generate("x", choices=["red", "green", "blue"], max_tokens=8, **params).text in (
            "red", "green", "blue")


def _oracle(outputs: dict[tuple, list[int]], vocab_size: int, wrong: int | None = None):
    """A proposer (in place of speculative.PromptLookup) that proposes what follows the context in
    its generation's own plain output (outputs: prompt ids -> prompt and output, the tokens the
    grammar forced among them): its drafts run through the forced tokens. From the draft at index
    wrong on, every draft of a round is another token."""

    class Oracle(speculative.PromptLookup):
        def odds(self, context):
            self.output = next(o for ids, o in outputs.items() if tuple(context[:len(ids)]) == ids)
            return speculative.Odds(1.0), speculative.MAX_DRAFT

        def rates(self):
            while True:
                yield 1.0  # always worth a round

        def propose(self, context, k, choose):
            drafts = list(self.output[len(context):len(context) + k])
            if wrong is not None:
                drafts[wrong:] = [(t + 1) % vocab_size for t in drafts[wrong:]]
            return drafts, [None] * len(drafts)

    return Oracle


def _forced_calls(model, monkeypatch) -> list[int]:
    """The tokens each plain step runs (the one chosen and any the grammar forced after it)."""
    calls, step = [], model.pool.step

    def counted(cache, token, forced=()):
        calls.append(1 + len(forced))
        return step(cache, token, forced)

    monkeypatch.setattr(model.pool, "step", counted)
    return calls


def test_a_constrained_generation_speculates_and_gives_the_plain_tokens(tiny, tiny_folder, monkeypatch, untimed_costs):
    """Each draft is judged by the constraint as the plain path samples (masked, then consumed); a
    draft taken that the grammar forces tokens after keeps the drafts that are those tokens and the
    round goes on past them, and where a draft differs the forced rest runs in the next call; a draft
    model drafts among the tokens the parser would take. Greedy, the tokens, logprobs and text are the
    plain path's with every proposer, alone, in a list and streamed, and the usage counts the
    proposals."""
    monkeypatch.setattr(speculative.Speculator, "drafting", lambda self, k: 0.0)
    monkeypatch.setattr(speculative.Speculator, "catch_up_cost", lambda self: 0.0)
    same = pyllm.load(tiny_folder)  # a draft that is the target itself
    regex = r"(yes|no), [0-9]{2} wheels are built once for each platform(\.| and [a-z]{3})"
    for kind in ({"json_schema": PERSON}, {"regex": regex}):
        plain = tiny.generate("The wheel", max_tokens=120, logprobs=2, **kind)
        with monkeypatch.context() as m:  # the grammar forces runs of tokens in this output
            calls = _forced_calls(tiny, m)
            assert tiny.generate("The wheel", max_tokens=120, **kind).token_ids == plain.token_ids
            assert max(calls) > 2
        ids = tiny.prompt_ids("The wheel")
        for wrong in (None, 0, 1, 2, 3, 5):
            with monkeypatch.context() as m:
                m.setattr(speculative, "PromptLookup", _oracle({tuple(ids): ids + plain.token_ids},
                                                               tiny.vocab_size, wrong))
                got = tiny.generate("The wheel", max_tokens=120, logprobs=2, speculative="lookup", **kind)
            assert (got.token_ids, got.text, got.logprobs, got.finish_reason) == (
                plain.token_ids, plain.text, plain.logprobs, plain.finish_reason), (kind, wrong)
            counts = got.usage["speculative"]
            assert counts["proposed"] > 0 and (counts["accepted"] > 0) == (wrong != 0)
            if wrong is None:  # every draft taken, forced tokens and all: far fewer calls than tokens
                assert counts["accepted"] == counts["proposed"] and counts["steps"] < len(plain.token_ids) // 3
        for speculative_ in ("lookup", "self:1", same):
            got = tiny.generate("The wheel", max_tokens=120, logprobs=2, speculative=speculative_, **kind)
            assert (got.token_ids, got.logprobs) == (plain.token_ids, plain.logprobs)
            if speculative_ is same:  # its drafts are masked by the constraint as the target's tokens are
                counts = got.usage["speculative"]
                assert counts["proposed"] > 0 and counts["accepted"] == counts["proposed"]
            listed = tiny.generate(["The wheel", "The wheel"], max_tokens=120, speculative=speculative_, **kind)
            assert [c.token_ids for c in listed] == [plain.token_ids] * 2
            assert "".join(tiny.stream("The wheel", max_tokens=120, speculative=speculative_, **kind)) == plain.text


def test_a_constrained_job_in_a_list_runs_its_forced_tokens_between_rounds(tiny, monkeypatch, untimed_costs):
    """In the engine a job whose round ends inside what the grammar forced runs the rest as a call
    of its own (as a plain job's forced tokens), then speculates again: each job of a list gets the
    tokens it gets alone."""
    monkeypatch.setattr(speculative.Speculator, "drafting", lambda self, k: 0.0)
    prompts = ["The wheel", "Its core picks", "A small model"]
    alone = [tiny.generate(p, json_schema=PERSON, max_tokens=120) for p in prompts]
    for wrong in (None, 2):
        outputs = {tuple(tiny.prompt_ids(p)): tiny.prompt_ids(p) + c.token_ids for p, c in zip(prompts, alone)}
        with monkeypatch.context() as m:
            m.setattr(speculative, "PromptLookup", _oracle(outputs, tiny.vocab_size, wrong))
            together = tiny.generate(prompts, json_schema=PERSON, max_tokens=120, speculative="lookup")
        assert [c.token_ids for c in together] == [c.token_ids for c in alone], wrong
        assert all(c.usage["speculative"]["proposed"] > 0 for c in together)


@pytest.mark.parametrize("draft", ["allowed", "not allowed", "a draft's q"])
def test_constrained_rejection_sampling_follows_the_masked_distribution(tiny, draft):
    """A draft judged under a constraint: the tokens taken follow p, the target's distribution
    after the mask, whether the draft is a token the parser takes, one it does not (taken never:
    p gives it no mass) or drawn from a draft's own masked distribution."""
    from scipy.stats import chisquare

    gen = Generation(tiny, tiny.prompt_ids("x"), SamplingParams(temperature=1.0, seed=5), 8, None, None,
                     output_grammar(regex="[a-m]+"))
    spec = speculative.Speculator("test", speculative.PromptLookup(), gen, tiny.vocab_size)
    rng = np.random.default_rng(0)
    row = (rng.standard_normal(tiny.vocab_size) * 2).astype(np.float32)
    draft_row = (row + rng.standard_normal(tiny.vocab_size) * 1.5).astype(np.float32)
    ids, p = gen.sampler.distribution(gen.constraint.mask(row), gen.ids, gen.generated)
    ids, p = ids[p > 0], p[p > 0]  # the tokens the parser takes
    assert 3 < len(ids) < tiny.vocab_size // 2
    banned = next(t for t in np.argsort(-row).tolist() if t not in set(ids.tolist()))
    counts = dict.fromkeys(ids.tolist(), 0)
    for _ in range(6000):
        if draft == "a draft's q":
            token, q = spec._choose(draft_row, [])
            assert token in counts
        else:
            token, q = (int(ids[np.argmax(p)]) if draft == "allowed" else banned), None
        counts[spec._test(row, token, q)] += 1  # a KeyError here: a token p gives no mass
    observed = np.array([counts[i] for i in ids.tolist()])
    assert chisquare(observed, p * observed.sum()).pvalue > 1e-3


INVOICE = ("Invoice 4471 was issued on 12 March 2024 by Northwind Traders, 18 Harbour Road, Bristol, to "
           "Contoso Ltd, 2 Mill Lane, Leeds, for 40 boxes of printer paper; 363.00 pounds are due within 30 days.")
PARTY = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 40},
                                          "address": {"type": "string", "maxLength": 60}},
         "required": ["name", "address"], "additionalProperties": False}
INVOICE_SCHEMA = {"type": "object", "properties": {
    "number": {"type": "string", "maxLength": 10}, "date": {"type": "string", "maxLength": 20},
    "seller": PARTY, "buyer": PARTY, "total": {"type": "number"}},
    "required": ["number", "date", "seller", "buyer", "total"], "additionalProperties": False}


def test_the_real_q4_1_file_extracts_json_with_lookup_exactly(smollm2_gguf, untimed_costs):
    """Extraction, where lookup pays: the fields copy spans of the prompt. SmolLM2 Q4_1 under the
    schema, greedy: the plain tokens, in fewer forward calls; with the file as its own draft, and
    under a regex and choices too."""
    llm = pyllm.load(smollm2_gguf, threads=2)
    messages = [{"role": "user", "content": "Extract the invoice's fields as JSON.\n\n" + INVOICE}]
    plain = llm.chat(messages, json_schema=INVOICE_SCHEMA, max_tokens=160)
    fast = llm.chat(messages, json_schema=INVOICE_SCHEMA, max_tokens=160, speculative="lookup")
    assert (fast.token_ids, fast.text, fast.finish_reason) == (plain.token_ids, plain.text, plain.finish_reason)
    assert plain.finish_reason == "stop" and json.loads(plain.text)["seller"]["name"] == "Northwind Traders"
    counts = fast.usage["speculative"]
    assert counts["accepted"] > 10 and counts["steps"] < len(plain.token_ids) * 3 // 4
    # the quantized file as its own draft: masked by the same parser, every draft it proposes is taken
    drafted = llm.chat(messages, json_schema=INVOICE_SCHEMA, max_tokens=160, speculative=pyllm.load(smollm2_gguf))
    assert drafted.token_ids == plain.token_ids
    assert drafted.usage["speculative"]["accepted"] == drafted.usage["speculative"]["proposed"] > 0
    # a regex and choices, with lookup: the plain tokens
    for kind in ({"regex": r"Invoice [0-9]+ is due in [0-9]+ days\."}, {"choices": ["Bristol", "Leeds", "Contoso"]}):
        alone = llm.chat(messages, max_tokens=40, **kind)
        assert llm.chat(messages, max_tokens=40, speculative="lookup", **kind).token_ids == alone.token_ids, kind


def test_sampled_constrained_speculation_matches_and_keeps_the_seed_s_tokens(tiny):
    """Sampled, rejection sampling weighs each draft by the masked distribution the plain path
    samples from: the output matches, and a seed gives the same tokens run after run."""
    for seed in range(4):
        runs = [tiny.generate("The wheel", json_schema=PERSON, max_tokens=200, temperature=1.0, seed=seed,
                              speculative="lookup") for _ in range(2)]
        assert runs[0].token_ids == runs[1].token_ids
        if runs[0].finish_reason == "stop":
            jsonschema.validate(json.loads(runs[0].text), PERSON)


def test_grammars_lark_and_gbnf(tiny):
    lark = 'start: "(" item ("," item)* ")"\nitem: /[0-9]/ | "x"\n'
    text = tiny.generate("a", grammar=lark, max_tokens=40, temperature=1.0, seed=0).text
    assert re.fullmatch(r"\((?:[0-9]|x)(?:,(?:[0-9]|x))*\)", text)
    gbnf = 'root ::= "yes" | "no" | "maybe"'
    assert tiny.generate("a", grammar=gbnf, temperature=1.0, seed=1).text in ("yes", "no", "maybe")


def test_pydantic_class_list_stream_and_prefix_reuse(tiny):
    class Point(BaseModel):
        model_config = ConfigDict(extra="forbid")  # additionalProperties: false
        x: int = Field(ge=-9, le=9)
        y: int = Field(ge=-9, le=9)

    prompts = ["The wheel is built once", "Its core picks", "A small model"]
    alone = [tiny.generate(p, json_schema=Point, max_tokens=300, temperature=1.0, seed=i)
             for i, p in enumerate(prompts)]
    for c in alone:
        assert c.finish_reason == "stop"
        Point.model_validate_json(c.text)
    # each prompt of a list has its own constraint and gives what it gives alone
    together = tiny.generate(prompts, json_schema=Point, max_tokens=300, temperature=1.0, seed=0)
    assert together[0].token_ids == alone[0].token_ids
    for c in together:
        Point.model_validate_json(c.text)
    s = tiny.stream(prompts[0], json_schema=Point, max_tokens=300, temperature=1.0, seed=0)
    assert "".join(s) == alone[0].text and s.finish_reason == "stop"
    # a second run reuses the cached prompt and is constrained the same
    before = tiny.tokens_processed
    again = tiny.generate(prompts[0], json_schema=Point, max_tokens=300, temperature=1.0, seed=0)
    assert again.token_ids == alone[0].token_ids
    assert tiny.tokens_processed - before < len(tiny.tokenize(prompts[0])) + len(again.token_ids)


def test_forced_tokens_run_without_decode_steps_of_their_own(tiny, monkeypatch):
    """What the grammar forces after a sampled token runs in that token's forward call."""
    calls = []
    step = tiny.pool.step

    def counted(cache, token, forced=()):
        calls.append(1 + len(forced))
        return step(cache, token, forced)

    monkeypatch.setattr(tiny.pool, "step", counted)
    literal = "the wheel is built once for each platform"
    c = tiny.generate("x", grammar=f'start: "{literal}" /[0-9]/', temperature=1.0, seed=0)
    assert re.fullmatch(re.escape(literal) + "[0-9]", c.text) and c.finish_reason == "stop"
    assert sum(calls) == len(c.token_ids) - 1  # every token but the last ran, each once
    assert len(calls) < len(c.token_ids) - 1


def test_cut_output_is_never_complete(tiny):
    """max_tokens cuts a JSON object: finish_reason "length", whatever a stop string or the text says."""
    c = tiny.generate("x", json_schema=PERSON, max_tokens=3)
    assert c.finish_reason == "length"
    with pytest.raises(ValueError):
        json.loads(c.text)
    chat = tiny.chat([{"role": "user", "content": "hi"}], json_schema=PERSON, max_tokens=2)
    assert chat.finish_reason == "length"


def test_bad_constraints_are_refused(tiny):
    with pytest.raises(ValueError, match="one of"):
        tiny.generate("x", regex="a", choices=["a"])
    with pytest.raises(ValueError, match="grammar"):
        tiny.generate("x", grammar="start: (")
    with pytest.raises(ValueError, match="choices"):
        tiny.generate("x", choices=[])
    with pytest.raises(ValueError, match="json_schema"):
        tiny.generate("x", json_schema=[1])
    with pytest.raises(ValueError, match="not JSON"):
        tiny.generate("x", json_schema={"enum": {1, 2}})


def test_without_the_extra_the_error_names_it(tiny, monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "llguidance", None)  # import fails as if not installed
    with pytest.raises(PyllmError, match=r'pyllm\[structured\]'):
        tiny.generate("x", regex="a")


# ---- the property test: random schemas, random sampling settings ------------------------------------


def _schemas(depth: int = 0):
    leaves = st.one_of(
        st.builds(lambda lo, span: {"type": "integer", "minimum": lo, "maximum": lo + span},
                  st.integers(-50, 50), st.integers(0, 100)),
        st.builds(lambda lo: {"type": "number", "minimum": lo, "maximum": lo + 10}, st.integers(-5, 5)),
        st.builds(lambda n: {"type": "string", "maxLength": n}, st.integers(0, 6)),
        st.builds(lambda vs: {"enum": vs}, st.lists(st.sampled_from(["a", "bb", 1, None, True]), min_size=1,
                                                      max_size=4, unique=True)),
        st.just({"type": "boolean"}),
        st.just({"$ref": "#/$defs/color"}))
    if depth >= 2:
        return leaves
    inner = _schemas(depth + 1)
    return st.one_of(
        leaves,
        st.builds(lambda item, lo, extra: {"type": "array", "items": item, "minItems": lo, "maxItems": lo + extra},
                  inner, st.integers(0, 2), st.integers(0, 2)),
        _objects(inner))


def _objects(values):
    def build(props, required):
        names = sorted(props)
        return {"type": "object", "properties": props, "additionalProperties": False,
                "required": [n for n, r in zip(names, required) if r]}
    return st.builds(build, st.dictionaries(st.sampled_from(["id", "name", "x", "items", "ok"]), values,
                                            min_size=1, max_size=3),
                     st.lists(st.booleans(), min_size=5, max_size=5))


SAMPLING = st.fixed_dictionaries({}, optional={
    "temperature": st.sampled_from([0.0, 0.7, 1.0, 1.5]), "top_k": st.integers(0, 20),
    "top_p": st.sampled_from([0.3, 0.9, 1.0]), "min_p": st.sampled_from([0.0, 0.1]),
    "repetition_penalty": st.sampled_from([1.0, 1.2]), "seed": st.integers(0, 2**16)})


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(schema=_objects(_schemas()), params=SAMPLING)
def test_property_completed_outputs_validate(tiny, schema, params):
    schema = {**schema, "$defs": {"color": {"enum": ["red", "green"]}}}
    c = tiny.generate("The wheel", json_schema=schema, max_tokens=300, **params)
    if c.finish_reason == "stop":
        jsonschema.validate(json.loads(c.text), schema)
    else:  # only max_tokens ends a constrained output short of a match
        assert len(c.token_ids) == 300


@pytest.fixture(scope="module")
def tiny_draft(tiny_folder):
    """The tiny model again, as a draft: its greedy drafts under the constraint are the target's tokens."""
    return pyllm.load(tiny_folder)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(schema=_objects(_schemas()), params=SAMPLING, stop=st.sampled_from([None, ",", "]"]),
       logprobs=st.sampled_from([None, 2]))
def test_property_speculation_under_a_schema_changes_nothing(tiny, tiny_draft, schema, params, stop, logprobs):
    """Random schemas, stop strings and logprobs (which run forced tokens as steps of their own):
    greedy, lookup and a draft give the plain constrained output; sampled, it still matches."""
    schema = {**schema, "$defs": {"color": {"enum": ["red", "green"]}}}
    kwargs = {"json_schema": schema, "max_tokens": 150, "stop": stop, "logprobs": logprobs}
    plain = tiny.generate("The wheel", **kwargs)
    for proposer in ("lookup", tiny_draft):
        got = tiny.generate("The wheel", speculative=proposer, **kwargs)
        assert (got.token_ids, got.text, got.finish_reason, got.logprobs) == (
            plain.token_ids, plain.text, plain.finish_reason, plain.logprobs)
    sampled = tiny.generate("The wheel", json_schema=schema, max_tokens=300, speculative="lookup", **params)
    if sampled.finish_reason == "stop":
        jsonschema.validate(json.loads(sampled.text), schema)
    else:
        assert len(sampled.token_ids) == 300


# ---- the server ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tiny_folder):
    s = ServerProcess(tiny_folder, "--parallel", "4")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def smol_server(smollm2_gguf):
    s = ServerProcess("smollm2", "--parallel", "4", "--n-ctx", "1024")
    yield s
    s.stop()


class Trip(BaseModel):
    city: str = Field(max_length=20)
    days: int = Field(ge=1, le=30)
    by_train: bool


def test_openai_parse_and_json_object(smol_server):
    """The default model (SmolLM2-135M-Instruct) answers 20 structured requests, each parsed."""
    client = smol_server.client()

    def ask(i: int):
        return client.beta.chat.completions.parse(
            model="smollm2", messages=[{"role": "user", "content": f"Plan trip number {i} in Europe as JSON."}],
            response_format=Trip, max_tokens=100, temperature=0.8, seed=i)

    with ThreadPoolExecutor(4) as pool:
        replies = list(pool.map(ask, range(20)))
    for r in replies:
        assert isinstance(r.choices[0].message.parsed, Trip), r.choices[0].message.content
    r = client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "A person as JSON: name and age."}],
        response_format={"type": "json_object"}, max_tokens=100, temperature=0)
    assert r.choices[0].finish_reason == "stop" and isinstance(json.loads(r.choices[0].message.content), dict)
    r = client.completions.create(model="smollm2", prompt="A person as JSON:", max_tokens=100, temperature=0,
                                  extra_body={"response_format": {"type": "json_object"}})
    assert r.choices[0].finish_reason == "stop" and isinstance(json.loads(r.choices[0].text), dict)


def test_server_refuses_tools_without_template_support_and_bad_schemas(server):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    status, body = request(server.url, "POST", "/v1/chat/completions", {
        "model": server.client().models.list().data[0].id, "messages": [{"role": "user", "content": "hi"}],
        "tools": tools})
    assert status == 400 and "no tool support" in body["error"]["message"], body
    status, body = request(server.url, "POST", "/v1/chat/completions", {
        "model": server.client().models.list().data[0].id, "messages": [{"role": "user", "content": "hi"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}})
    assert status == 400 and body["error"]["param"] == "response_format", body


# ---- tool calls on a tiny Qwen2.5 with its real template ---------------------------------------------------


@pytest.fixture(scope="module")
def qwen_server(checkpoint, tmp_path_factory):
    template_dir = os.path.join(os.path.dirname(llama_cpp_converter()), "models", "templates")
    with open(os.path.join(template_dir, "Qwen-Qwen2.5-7B-Instruct.jinja")) as f:
        template = f.read()
    folder = str(tmp_path_factory.mktemp("qwen-tools") / "model")
    shutil.copytree(checkpoint("qwen2", max_position_embeddings=2048), folder)
    path = os.path.join(folder, "tokenizer_config.json")
    with open(path) as f:
        config = json.load(f)
    with open(path, "w") as f:
        json.dump({**config, "chat_template": template}, f)
    s = ServerProcess(folder, "--parallel", "2")
    s.folder = folder
    yield s
    s.stop()


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome", "Oslo"]},
                                                    "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                   "required": ["city", "days"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}},
                                       "required": ["zone"], "additionalProperties": False}}}


def _check_call(call) -> None:
    params = {"get_weather": WEATHER, "get_time": TIME}[call.function.name]["function"]["parameters"]
    jsonschema.validate(json.loads(call.function.arguments), params)
    assert call.id and call.type == "function"


def test_tool_call_round_trip(qwen_server):
    client = qwen_server.client()
    name = client.models.list().data[0].id
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = client.chat.completions.create(model=name, messages=messages, tools=[WEATHER, TIME],
                                       tool_choice="required", max_tokens=120, temperature=1.0, seed=0)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    for call in choice.message.tool_calls:
        _check_call(call)
    named = client.chat.completions.create(
        model=name, messages=messages, tools=[WEATHER, TIME], parallel_tool_calls=False, max_tokens=120,
        tool_choice={"type": "function", "function": {"name": "get_time"}}, temperature=1.0, seed=1)
    calls = named.choices[0].message.tool_calls
    assert len(calls) == 1 and calls[0].function.name == "get_time"
    _check_call(calls[0])
    # the calls and a tool's answer go back through the template; "none" answers in text
    messages += [choice.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": choice.message.tool_calls[0].id, "content": '{"sunny": true}'}]
    final = client.chat.completions.create(model=name, messages=messages, tools=[WEATHER, TIME],
                                           tool_choice="none", max_tokens=8, seed=0)
    assert final.choices[0].message.tool_calls is None and final.choices[0].message.content
    as_json = client.chat.completions.create(
        model=name, messages=messages, tools=[WEATHER, TIME], tool_choice="none", max_tokens=200, seed=0,
        response_format={"type": "json_schema", "json_schema": {"name": "w", "schema": TIME["function"]["parameters"]}})
    assert json.loads(as_json.choices[0].message.content)["zone"] in ("UTC", "CET")
    auto = client.chat.completions.create(model=name, messages=messages, tools=[WEATHER, TIME], max_tokens=60,
                                          temperature=1.0, seed=5)
    message = auto.choices[0].message
    assert message.tool_calls or not message.content.startswith("<tool")
    for call in message.tool_calls or []:
        _check_call(call)


def test_tool_calls_of_a_speculating_server_are_the_plain_ones(qwen_server):
    """`pyllm serve --speculative lookup`: the tool-call grammar judges the drafts; greedy, the calls
    (streamed or not) and a response_format's JSON are the plain server's, and the usage counts the
    proposals."""
    fast = ServerProcess(qwen_server.folder, "--parallel", "2", "--speculative", "lookup")
    try:
        replies = []
        for server in (qwen_server, fast):
            client = server.client()
            name = client.models.list().data[0].id
            messages = [{"role": "user", "content": "What is the weather in Paris, and in Rome, and in Oslo?"}]
            calls = client.chat.completions.create(model=name, messages=messages, tools=[WEATHER, TIME],
                                                   tool_choice="required", max_tokens=160, temperature=0)
            streamed = _streamed_calls(client.chat.completions.create(
                model=name, messages=messages, tools=[WEATHER, TIME], tool_choice="required", max_tokens=160,
                temperature=0, stream=True))
            as_json = client.chat.completions.create(
                model=name, messages=messages, max_tokens=200, temperature=0,
                response_format={"type": "json_schema", "json_schema": {"name": "w",
                                                                        "schema": WEATHER["function"]["parameters"]}})
            replies.append(([(c.function.name, c.function.arguments) for c in calls.choices[0].message.tool_calls],
                            [(c["name"], c["arguments"]) for c in streamed[0]], as_json.choices[0].message.content,
                            calls.usage.completion_tokens_details))
    finally:
        fast.stop()
    plain, spec = replies
    assert plain[:3] == spec[:3] and plain[0] and plain[1] == plain[0]
    assert spec[3] is not None and spec[3].accepted_prediction_tokens + spec[3].rejected_prediction_tokens > 0


def _streamed_calls(stream) -> tuple[list[dict], int, str | None]:
    """The calls a chat stream's delta.tool_calls chunks make up (each opened by a chunk with its
    id, type and name), how many pieces of arguments came, and the finish_reason."""
    calls: dict[int, dict] = {}
    pieces, finish = 0, None
    for chunk in stream:
        for part in chunk.choices[0].delta.tool_calls or []:
            if part.index not in calls:
                assert part.id and part.type == "function" and part.function.name and part.function.arguments == ""
                calls[part.index] = {"id": part.id, "name": part.function.name, "arguments": ""}
            elif part.function.arguments:
                calls[part.index]["arguments"] += part.function.arguments
                pieces += 1
        finish = chunk.choices[0].finish_reason or finish
    return [c for _, c in sorted(calls.items())], pieces, finish


def test_tool_calls_streamed(qwen_server):
    client = qwen_server.client()
    name = client.models.list().data[0].id
    plain = client.chat.completions.create(
        model=name, messages=[{"role": "user", "content": "Weather and time?"}], tools=[WEATHER, TIME],
        tool_choice="required", max_tokens=150, temperature=1.0, seed=7)
    calls, pieces, finish = _streamed_calls(client.chat.completions.create(
        model=name, messages=[{"role": "user", "content": "Weather and time?"}], tools=[WEATHER, TIME],
        tool_choice="required", max_tokens=150, temperature=1.0, seed=7, stream=True))
    assert finish == "tool_calls"
    assert pieces > len(calls)  # arguments come as the model writes them, not in one piece per call
    expected = plain.choices[0].message.tool_calls
    # tool_choice "auto": a reply that turns out to be free text streams as it comes
    messages = [{"role": "user", "content": "Say hello."}]
    whole = client.chat.completions.create(model=name, messages=messages, tools=[WEATHER], max_tokens=30,
                                           temperature=1.0, seed=2)
    pieces = [c.choices[0].delta.content for c in client.chat.completions.create(
        model=name, messages=messages, tools=[WEATHER], max_tokens=30, temperature=1.0, seed=2, stream=True)
        if c.choices and c.choices[0].delta.content]
    assert whole.choices[0].message.tool_calls is None  # this seed answers in text
    assert "".join(pieces) == whole.choices[0].message.content and len(pieces) > 1
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [
        (c.function.name, json.loads(c.function.arguments)) for c in expected]


ORDER = {"type": "function", "function": {"name": "order", "parameters": {
    "type": "object", "$defs": {"Item": {"type": "object", "properties": {
        "sku": {"enum": ["apple", "pear"]}, "count": {"type": "integer", "minimum": 1, "maximum": 9},
        "note": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/Note"}]}},
        "required": ["sku", "count", "note"], "additionalProperties": False},
        "Note": {"type": "string", "maxLength": 12}},
    "properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/Item"}, "minItems": 1, "maxItems": 3}},
    "required": ["items"], "additionalProperties": False}}}


def test_tool_parameters_with_refs_give_valid_calls(qwen_server):
    """A function's parameters that refer to their own $defs: the calls, whole and streamed, validate
    against those parameters (jsonschema resolving the references)."""
    client = qwen_server.client()
    name = client.models.list().data[0].id
    params = ORDER["function"]["parameters"]
    ask = dict(model=name, messages=[{"role": "user", "content": "Order fruit."}], tools=[ORDER, TIME],
               tool_choice={"type": "function", "function": {"name": "order"}}, max_tokens=200, temperature=1.0)
    for seed in range(2):
        r = client.chat.completions.create(**ask, seed=seed)
        assert r.choices[0].finish_reason == "tool_calls", r.choices[0].message
        for call in r.choices[0].message.tool_calls:
            jsonschema.validate(json.loads(call.function.arguments), params)
        calls, _, finish = _streamed_calls(client.chat.completions.create(**ask, seed=seed, stream=True))
        assert finish == "tool_calls" and calls
        for call in calls:
            assert call["name"] == "order"
            jsonschema.validate(json.loads(call["arguments"]), params)


def test_cli_run_with_a_schema_or_a_grammar(tiny_folder, tmp_path):
    import subprocess
    import sys

    schema = tmp_path / "point.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"x": {"type": "integer", "minimum": 0,
                                                                        "maximum": 9}},
                                  "required": ["x"], "additionalProperties": False}))
    grammar = tmp_path / "answer.gbnf"
    grammar.write_text('root ::= "yes" | "no"\n')

    def run(*args):
        return subprocess.run([sys.executable, "-m", "pyllm", "run", tiny_folder, "The wheel", *args],
                              capture_output=True, text=True, timeout=120)

    out = run("--json-schema", str(schema), "--max-tokens", "200")
    assert out.returncode == 0, out.stderr
    assert 0 <= json.loads(out.stdout)["x"] <= 9
    out = run("--grammar", str(grammar), "--temperature", "1", "--seed", "3")
    assert out.returncode == 0 and out.stdout.strip() in ("yes", "no"), out.stderr
    out = run("--grammar", str(tmp_path / "missing.gbnf"))
    assert out.returncode == 1 and "--grammar" in out.stderr and "Traceback" not in out.stderr
    # the options before the prompt, with speculation: the same answer as without it
    plain = run("--json-schema", str(schema), "--max-tokens", "200")
    out = subprocess.run([sys.executable, "-m", "pyllm", "run", tiny_folder, "--json-schema", str(schema),
                          "--speculative", "lookup", "--max-tokens", "200", "The wheel"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout == plain.stdout, out.stderr


def test_llama3_template_calls_are_constrained_and_parsed(tiny):
    """Llama 3.x's template asks for one {"name", "parameters"} object: the grammar writes it, the
    parser reads it back; the calls go back into the template as the next turn."""
    from pyllm import tool_calls

    template_dir = os.path.join(os.path.dirname(llama_cpp_converter()), "models", "templates")
    with open(os.path.join(template_dir, "meta-llama-Llama-3.2-3B-Instruct.jinja")) as f:
        template = f.read()
    fmt = tool_calls.template_format(template)
    assert fmt is tool_calls.LLAMA3
    messages = [{"role": "user", "content": "Weather?"}]
    prompt = tiny.render_chat(messages, chat_template=template, tools=[WEATHER, TIME])
    assert "get_weather" in prompt
    grammar = tool_calls.calls_grammar([WEATHER, TIME], fmt, "required", True)
    for seed in range(3):
        c = tiny.generate(prompt, grammar=grammar, max_tokens=200, temperature=1.0, seed=seed)
        assert c.finish_reason == "stop", c.text
        content, calls = tool_calls.parse_calls(c.text, fmt)
        assert content is None and len(calls) == 1
        params = {"get_weather": WEATHER, "get_time": TIME}[calls[0]["function"]["name"]]["function"]["parameters"]
        jsonschema.validate(json.loads(calls[0]["function"]["arguments"]), params)
    turn = tool_calls.template_message({"role": "assistant", "content": None, "tool_calls": calls})
    after = tiny.render_chat(messages + [turn, {"role": "tool", "tool_call_id": calls[0]["id"], "content": "sunny"}],
                             chat_template=template, tools=[WEATHER, TIME])
    assert f'"name": "{calls[0]["function"]["name"]}"' in after and "sunny" in after


def _tokenizer_with(folder: str, specials: list[str]):
    """A small byte-level BPE tokenizer with a family's control tokens, saved into a tiny checkpoint."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from conftest import english_text

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([english_text()[:20000]], trainers.BpeTrainer(
        vocab_size=320, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    tok.save(os.path.join(folder, "tokenizer.json"))
    return tok


def test_mistral_template_calls_start_with_its_control_token(tmp_path):
    """Mistral's [TOOL_CALLS] is a control token: the grammar emits that token (not its spelling),
    the calls are a JSON list after it, their ids 9 letters and digits as the template demands."""
    from pyllm import tool_calls

    folder = make_tiny_checkpoint(str(tmp_path / "mistral"), max_position_embeddings=2048)
    tok = _tokenizer_with(folder, ["<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]",
                                   "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"])
    template_dir = os.path.join(os.path.dirname(llama_cpp_converter()), "models", "templates")
    with open(os.path.join(template_dir, "mistralai-Mistral-Nemo-Instruct-2407.jinja")) as f:
        template = f.read()
    llm = pyllm.load(folder)
    fmt = tool_calls.template_format(template, llm.tokenizer)
    messages = [{"role": "user", "content": "Weather and time?"}]
    prompt = llm.tokenize(llm.render_chat(messages, chat_template=template, tools=[WEATHER, TIME]),
                          add_special=False)
    grammar = tool_calls.calls_grammar([WEATHER, TIME], fmt, "required", True)
    c = llm.generate(prompt, grammar=grammar, max_tokens=300, temperature=1.0, seed=0)
    assert c.finish_reason == "stop" and c.token_ids[0] == tok.token_to_id("[TOOL_CALLS]"), c.text
    content, calls = tool_calls.parse_calls(c.text, fmt)
    assert content is None and calls
    for call in calls:
        assert re.fullmatch(r"[0-9a-z]{9}", call["id"])
        params = {"get_weather": WEATHER, "get_time": TIME}[call["function"]["name"]]["function"]["parameters"]
        jsonschema.validate(json.loads(call["function"]["arguments"]), params)
    turn = tool_calls.template_message({"role": "assistant", "content": None, "tool_calls": calls})
    after = llm.render_chat(messages + [turn, {"role": "tool", "tool_call_id": calls[0]["id"], "content": "1"}],
                            chat_template=template, tools=[WEATHER, TIME])
    assert f'"id": "{calls[0]["id"]}"' in after and f'"call_id": "{calls[0]["id"]}"' in after


# Phi-4-mini-instruct's chat template, as its tokenizer_config.json on the hub has it (the llama.cpp
# sdist holds Phi-3.5-mini's alone, which has no tools)
PHI4_MINI_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'system' and 'tools' in message and message['tools'] "
    "is not none %}{{ '<|' + message['role'] + '|>' + message['content'] + '<|tool|>' + message['tools'] + "
    "'<|/tool|>' + '<|end|>' }}{% else %}{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% else %}{{ eos_token }}{% endif %}")


@pytest.fixture(scope="module")
def phi_server(tmp_path_factory):
    """A tiny model with Phi-4-mini's control tokens in its vocabulary and its real template."""
    folder = make_tiny_checkpoint(str(tmp_path_factory.mktemp("phi") / "model"), max_position_embeddings=2048)
    _tokenizer_with(folder, ["<|endoftext|>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>",
                             "<|/tool|>", "<|tool_call|>", "<|/tool_call|>"])
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<|endoftext|>", "eos_token": "<|end|>", "chat_template": PHI4_MINI_TEMPLATE}, f)
    s = ServerProcess(folder, "--parallel", "2")
    s.folder = folder
    yield s
    s.stop()


def test_phi4_mini_template_calls_between_its_control_tokens(phi_server):
    """Phi-4-mini's template takes the tools from the system message and writes calls as
    <|tool_call|>[...]<|/tool_call|> (control tokens): calls come back whole and streamed, and
    go back into the template, with a tool's answer, as those tokens."""
    from pyllm import tool_calls

    client = phi_server.client()
    name = client.models.list().data[0].id
    messages = [{"role": "user", "content": "Weather and time?"}]
    ask = dict(model=name, messages=messages, tools=[WEATHER, TIME], tool_choice="required", max_tokens=200,
               temperature=1.0, seed=3)
    r = client.chat.completions.create(**ask)
    assert r.choices[0].finish_reason == "tool_calls", r.choices[0].message
    for call in r.choices[0].message.tool_calls:
        _check_call(call)
    calls, _, finish = _streamed_calls(client.chat.completions.create(**ask, stream=True))
    assert finish == "tool_calls"
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [
        (c.function.name, json.loads(c.function.arguments)) for c in r.choices[0].message.tool_calls]
    turn = r.choices[0].message.model_dump(exclude_none=True)
    answer = {"role": "tool", "tool_call_id": turn["tool_calls"][0]["id"], "content": "sunny"}
    final = client.chat.completions.create(model=name, messages=messages + [turn, answer], tools=[WEATHER, TIME],
                                           tool_choice="none", max_tokens=8, seed=0)
    assert final.choices[0].message.tool_calls is None and final.choices[0].finish_reason in ("stop", "length")
    # the prompt the server renders: tools in the system turn, the calls as the model's control tokens
    llm = pyllm.load(phi_server.folder)
    fmt = tool_calls.template_format(PHI4_MINI_TEMPLATE, llm.tokenizer)
    history = [tool_calls.template_message(m) for m in messages + [turn, answer]]
    ids = llm.chat_ids(history, PHI4_MINI_TEMPLATE, prepare=lambda m: tool_calls.call_messages(m, fmt, [WEATHER]))
    text = llm.tokenizer.decode(ids)
    hf = llm.tokenizer.hf
    assert text.startswith(f"<|system|>{tool_calls.PHI_SYSTEM}<|tool|>[") and '"name": "get_weather"' in text
    assert ids.count(hf.token_to_id("<|tool_call|>")) == 1 and ids.count(hf.token_to_id("<|/tool_call|>")) == 1
    assert text.endswith("<|end|><|tool|>sunny<|end|><|assistant|>")


def test_tool_formats_are_recognised_and_refused(tiny_folder):
    from pyllm import tool_calls

    assert tool_calls.template_format("{% if tools %}<tool_call>{% endif %}") is tool_calls.QWEN
    with pytest.raises(tool_calls.ToolsUnsupported, match="TOOL_CALLS"):  # a vocabulary without the token
        tool_calls.template_format("{% if tools %}[TOOL_CALLS]{% endif %}", pyllm.load(tiny_folder).tokenizer)
    with pytest.raises(tool_calls.ToolsUnsupported, match="tool_call"):  # Phi's template, a vocabulary without
        tool_calls.template_format(PHI4_MINI_TEMPLATE, pyllm.load(tiny_folder).tokenizer)
    with pytest.raises(tool_calls.ToolsUnsupported, match="no tool support"):
        tool_calls.template_format(CHAT_TEMPLATE)
    text = 'Sure.<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
    content, calls = tool_calls.parse_calls(text, tool_calls.QWEN)
    assert content == "Sure." and calls[0]["function"] == {"name": "f", "arguments": '{"a": 1}'}
    assert tool_calls.parse_calls('<tool_call>\n{"name": "f", "argu', tool_calls.QWEN) == (
        '<tool_call>\n{"name": "f", "argu', [])
