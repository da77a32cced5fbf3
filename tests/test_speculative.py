"""Speculative decoding is exact: greedy, every proposer gives the plain path's tokens, logprobs and
text (the verifying call's rows are the bits of one-token steps, and a rollback leaves the cache as
the plain path has it); sampled, rejection sampling keeps the target's distribution."""
from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import chisquare

import pyllm
from pyllm import _core, speculative
from pyllm.generation import Generation
from pyllm.sampling import SamplingParams

PROMPT = "the cat sat on the mat and the dog sat on the log. the cat sat on the mat and the dog"
# fewer tokens than a round runs: a draft model's first round does not catch up with a prompt
SHORT_PROMPT = "the cat sat on the mat"


def _same_run(plain, fast):
    assert fast.token_ids == plain.token_ids
    assert fast.text == plain.text
    assert fast.logprobs == plain.logprobs  # floats of every top alternative: the same logits
    assert fast.finish_reason == plain.finish_reason


@pytest.fixture(scope="module")
def tiny(checkpoint):
    """family -> (target, a draft that is the target itself)."""
    loaded = {}

    def get(family):
        if family not in loaded:
            folder = checkpoint(family)
            loaded[family] = pyllm.load(folder, threads=2), pyllm.load(folder, threads=2)
        return loaded[family]
    return get


@pytest.fixture(scope="module")
def other_draft(checkpoint):
    """A tiny llama with other weights and the same tokenizer: its guesses are mostly wrong."""
    return pyllm.load(checkpoint("llama", seed=1), threads=2)


@pytest.mark.parametrize("family", ["llama", pytest.param("qwen2", marks=pytest.mark.slow), "gemma3", "gpt2"])
def test_greedy_speculation_gives_the_plain_tokens_logprobs_and_text_with_every_proposer(tiny, other_draft, family,
                                                                                        monkeypatch, untimed_costs):
    target, same = tiny(family)
    # a draft as large as the target costs a step per token and is dropped after a round, and its
    # catch-up with the prompt is not paid back in 24 tokens: taken as free here for the whole test
    # (its rounds, once timed, price it at a step a token), it shows that a draft always right is used in full
    monkeypatch.setattr(speculative.Speculator, "drafting", lambda self, k: 0.0)
    monkeypatch.setattr(speculative.Speculator, "catch_up_cost", lambda self: 0.0)
    plain = target.generate(PROMPT, max_tokens=24, logprobs=3, speculative="off")
    drafts = [other_draft] if family == "llama" else []
    for proposer in ["lookup", f"self:{target.spec.n_layers - 1}", "self:1", same, *drafts]:
        fast = target.generate(PROMPT, max_tokens=24, logprobs=3, speculative=proposer)
        _same_run(plain, fast)
        counts = fast.usage["speculative"]
        assert 0 <= counts["accepted"] <= counts["proposed"]
        details = fast.usage["completion_tokens_details"]
        assert details["accepted_prediction_tokens"] + details["rejected_prediction_tokens"] == counts["proposed"]
        if proposer is same:  # the target's own greedy tokens: every one is taken, in fewer calls
            assert counts["proposed"] > 0 and counts["accepted"] == counts["proposed"]
            assert counts["steps"] < len(plain.token_ids) // 2


@pytest.mark.parametrize("family,dtype", [("gemma3", None), ("llama", "q4_1")])
def test_verified_rows_and_a_rollback_give_the_bits_of_one_token_steps(checkpoint, family, dtype):
    """gemma3: sliding windows of 8 positions, crossed by the verified chunks and the rollback."""
    folder = checkpoint(family, hidden_size=64, intermediate_size=192) if dtype else checkpoint(family)
    llm = pyllm.load(folder, threads=2, dtype=dtype)
    ids = list(np.random.default_rng(1).integers(3, 300, 30))
    plain = _core.CoreSequence(llm.core, 64)
    steps = [plain.forward(ids[:6])] + [plain.forward([t]) for t in ids[6:]]
    seq = _core.CoreSequence(llm.core, 64)
    seq.forward(ids[:5])
    pos = 5
    for chunk, keep in [(7, 3), (9, 9), (4, 1), (8, 5)]:
        rows = seq.forward(ids[pos:pos + chunk], all_logits=True)
        for i in range(chunk):
            np.testing.assert_array_equal(rows[i], steps[pos + i - 5])
        pos += keep
        seq.truncate(pos)  # the rest is proposed tokens the target turned down
    assert seq.exact_rows >= 9


class _Never:
    """Proposes a token the target never picks: every proposal is turned down."""

    cost = 0.0

    def __init__(self, token):
        self.token = token
        self.single = speculative.Odds()

    def odds(self, context):
        return self.single, speculative.MAX_DRAFT

    def behind(self, context):
        return 0

    def propose(self, context, k, choose):
        return [self.token] * k, [None] * k


def test_a_proposer_that_is_never_right_changes_nothing(tiny):
    target = tiny("llama")[0]
    banned = 7
    params = SamplingParams(logit_bias={banned: -100.0})
    plain = target.generate(PROMPT, max_tokens=24, logprobs=2, sampling=params)
    gen = Generation(target, target.prompt_ids(PROMPT), params, 24, None, 2)
    gen.speculator = speculative.Speculator("never", _Never(banned), gen, target.vocab_size)
    text = "".join(speculative.decode(target.pool, gen))
    _, fast = gen.finish()
    _same_run(plain, fast)
    assert text == plain.text
    assert fast.usage["speculative"]["proposed"] > 0 and fast.usage["speculative"]["accepted"] == 0


def test_stream_chat_and_generate_over_a_list_speculate_too(tiny, monkeypatch, untimed_costs):
    target, same = tiny("llama")
    # an always-right draft, taken as free whatever it is timed at (as below)
    monkeypatch.setattr(speculative.Speculator, "drafting", lambda self, k: 0.0)
    monkeypatch.setattr(speculative.Speculator, "catch_up_cost", lambda self: 0.0)
    plain = target.generate(PROMPT, max_tokens=20)
    stream = target.stream(PROMPT, max_tokens=20, speculative=same)
    assert "".join(stream) == plain.text and stream.usage["speculative"]["accepted"] > 0
    [one] = target.generate([PROMPT], max_tokens=20, speculative=same)  # the engine: a job alone
    assert one.token_ids == plain.token_ids and one.usage["speculative"]["accepted"] > 0
    both = target.generate([PROMPT, "the dog"], max_tokens=20, speculative="lookup")
    assert both[0].token_ids == plain.token_ids
    assert both[1].token_ids == target.generate("the dog", max_tokens=20).token_ids
    template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    chat = target.chat([{"role": "user", "content": PROMPT}], chat_template=template, max_tokens=20,
                       speculative="lookup")
    assert chat.token_ids == target.chat([{"role": "user", "content": PROMPT}], chat_template=template,
                                         max_tokens=20).token_ids


@pytest.mark.parametrize("family", ["llama", "gemma3", "gpt2"])
def test_jobs_batched_together_speculate_in_one_call_and_each_gets_its_plain_tokens(tiny, family, monkeypatch,
                                                                                   untimed_costs):
    """Generate over a list: the jobs decode together and every one runs its rounds in the same call
    as the others' rows (pl_forward_batch, several tokens a sequence); each gets the tokens,
    logprobs and text it gets alone. A draft that is always right (the target itself, its drafting
    and its catch-up with each prompt taken as free whatever they are timed at) shows that rounds ran
    while the jobs were batched: far fewer calls than tokens."""
    target, same = tiny(family)
    monkeypatch.setattr(speculative.Speculator, "drafting", lambda self, k: 0.0)
    monkeypatch.setattr(speculative.Speculator, "catch_up_cost", lambda self: 0.0)
    speculative.costs_of(target).drafts[target.speculation(same).name] = 0.0
    prompts = [PROMPT, "the dog sat on the log and the cat", "the mat", PROMPT + " sat"]
    plain = [target.generate(p, max_tokens=24, logprobs=2) for p in prompts]
    for proposer in ["lookup", same]:
        fast = target.generate(prompts, max_tokens=24, logprobs=2, speculative=proposer)
        for alone, batched in zip(plain, fast):
            _same_run(alone, batched)
        if proposer is same:
            for batched in fast:
                counts = batched.usage["speculative"]
                if batched.finish_reason == "length":  # drafts after an end of sequence go unused
                    assert counts["accepted"] == counts["proposed"] > 0
                assert counts["steps"] < len(batched.token_ids) // 2


def test_the_real_q4_1_file_speculates_in_a_batch_exactly(smollm2_gguf, untimed_costs):
    """Two editing requests and a free one at once, lookup: the copied text is proposed and taken
    while the three decode together."""
    llm = pyllm.load(smollm2_gguf, threads=2)
    code = "def area(width, height):\n    \"\"\"The area of a rectangle.\"\"\"\n    return width * height\n"
    prompts = [llm.render_chat([{"role": "user", "content": f"Rename {name} in this function:\n\n{code}"}])
               for name in ("width to w", "height to h")] + ["Once upon a time"]
    plain = [llm.generate(p, max_tokens=40, logprobs=2) for p in prompts]
    fast = llm.generate(prompts, max_tokens=40, logprobs=2, speculative="lookup")
    for alone, batched in zip(plain, fast):
        _same_run(alone, batched)
    assert all(f.usage["speculative"]["accepted"] > 5 for f in fast[:2]), [f.usage for f in fast]


def test_in_a_batch_a_draft_is_weighed_against_the_rows_of_the_whole_call(tiny):
    """A draft taken half the time pays alone where a row costs 0.3 of a step (1.5 tokens for 1.3
    steps), not beside eight rows in one call (8.5 tokens for 3.4 steps against 8 for 3.1): there
    the other jobs would wait on it. Where rows cost nothing (memory-bound), it pays in both."""
    target = tiny("llama")[0]
    gen = Generation(target, target.prompt_ids(PROMPT), SamplingParams(), 24, None, None)
    rng = np.random.default_rng(3)
    stretch = [int(t) for t in rng.integers(10, 300, 40)]
    context = stretch + stretch[:3]  # a match of 3 tokens
    for rows, alone, batched in [(lambda n: 1 + 0.3 * (n - 1), True, False), (lambda n: 1.0, True, True)]:
        costs = _costs({n: rows(n) for n in range(2, 40)})
        results = []
        for share in [None, speculative.Share(rows=8, tokens=8)]:
            planner = speculative.Speculator("lookup", speculative.PromptLookup(), gen, target.vocab_size, costs)
            odds, _ = planner.proposer.odds(context)
            odds.taken, odds.tries = 1.0, 2.0
            for later in planner.proposer.at_length:
                later.taken, later.tries = 1.0, 2.0
            results.append(planner._plan(context, 100, share) > 0)
        assert results == [alone, batched]
    share = speculative.Share(rows=8, tokens=8, capacity=10)
    share.add(2, 1.5, 0.25)
    assert (share.rows, share.tokens, share.drafting, share.room()) == (10, 8.5, 0.25, 0)


def test_costs_guess_a_step_from_a_batched_call_until_one_is_timed():
    costs = speculative.Costs()
    costs.record(4, 0.013)  # jobs batched from the start: no one-row step yet
    assert costs.guessed and costs.step == pytest.approx(0.013 / (1 + 3 * speculative.ROW_COST))
    costs.record(1, 0.004)
    assert not costs.guessed and costs.step == 0.004
    costs.record(1, 0.005)
    assert costs.step == pytest.approx(0.9 * 0.004 + 0.1 * 0.005)


def test_a_model_loaded_with_a_speculative_setting_uses_it(checkpoint):
    folder = checkpoint("llama")
    llm = pyllm.load(folder, threads=2, speculative=f"draft:{folder}")
    assert llm.speculative.name == f"draft:{folder}"
    out = llm.generate(SHORT_PROMPT, max_tokens=12)  # shorter than a round: no catch-up to weigh
    assert out.usage["speculative"]["accepted"] == out.usage["speculative"]["proposed"] > 0
    assert "speculative" not in llm.generate(PROMPT, max_tokens=12, speculative="off").usage
    with pytest.raises(ValueError, match="self:N"):
        llm.generate(PROMPT, speculative="self:99")
    with pytest.raises(ValueError, match="speculative"):
        llm.generate(PROMPT, speculative="guess")


def test_a_draft_with_another_tokenizer_is_refused(checkpoint):
    with pytest.raises(ValueError, match="tokenizer"):
        pyllm.load(checkpoint("llama"), n_ctx=128, speculative=f"draft:{checkpoint('gpt2')}")


def _gen(model, params):
    return Generation(model, model.prompt_ids(PROMPT), params, 100, None, None)


@pytest.mark.parametrize("point_mass", [True, False])
def test_rejection_sampling_follows_the_target_s_distribution(tiny, point_mass):
    """Drafts drawn from a q unlike p (or a fixed token), judged by the rule: the tokens taken follow
    p, the target's distribution after temperature, top-k and the repetition penalty."""
    target = tiny("llama")[0]
    params = SamplingParams(temperature=0.8, top_k=12, repetition_penalty=1.3, seed=5)
    gen = _gen(target, params)
    spec = speculative.Speculator("test", speculative.PromptLookup(), gen, target.vocab_size)
    rng = np.random.default_rng(0)
    row = (rng.standard_normal(target.vocab_size) * 2).astype(np.float32)
    draft_row = (row + rng.standard_normal(target.vocab_size) * 1.5).astype(np.float32)
    ids, p = gen.sampler.distribution(row, gen.ids, gen.generated)
    counts = dict.fromkeys(ids.tolist(), 0)
    for _ in range(6000):
        if point_mass:
            draft, q = int(ids[np.argmax(p)]), None
        else:
            draft, q = spec._choose(draft_row, [])
        token = spec._test(row, draft, q)
        counts[token] += 1  # a KeyError here: a token p gives no mass
    observed = np.array([counts[i] for i in ids.tolist()])
    assert chisquare(observed, p * observed.sum()).pvalue > 1e-3


def test_sampled_speculation_gives_the_same_tokens_on_any_thread_count(checkpoint, other_draft):
    folder = checkpoint("llama")
    runs = []
    for threads in (1, 3):
        llm = pyllm.load(folder, threads=threads)
        draft = pyllm.load(other_draft.source, threads=threads)
        runs.append([llm.generate(PROMPT, max_tokens=30, temperature=0.9, top_p=0.95, seed=s,
                                  speculative=spec).token_ids for s in (1, 2) for spec in ("lookup", draft)])
    assert runs[0] == runs[1]


def test_the_cli_runs_with_speculation(checkpoint, capsys):
    from pyllm.cli import main

    folder = checkpoint("llama")
    expected = pyllm.load(folder).generate(PROMPT, max_tokens=16).text
    assert main(["run", folder, PROMPT, "--max-tokens", "16", "--speculative", "lookup"]) == 0
    assert capsys.readouterr().out == expected + "\n"
    # options between the model and the prompt, as people type them
    assert main(["run", folder, "--speculative", "lookup", "--max-tokens", "16", PROMPT]) == 0
    assert capsys.readouterr().out == expected + "\n"


def test_the_real_q4_1_file_speculates_exactly(smollm2_gguf, untimed_costs):
    llm = pyllm.load(smollm2_gguf, threads=2)
    code = "def area(width, height):\n    \"\"\"The area of a rectangle.\"\"\"\n    return width * height\n"
    messages = [{"role": "user", "content": f"Rename width to w in this function:\n\n{code}"}]
    plain = llm.chat(messages, max_tokens=48, logprobs=2)
    for proposer in ["lookup", "self:20"]:
        _same_run(plain, llm.chat(messages, max_tokens=48, logprobs=2, speculative=proposer))
    assert llm.chat(messages, max_tokens=48, speculative="lookup").usage["speculative"]["accepted"] > 10


def test_on_the_real_q4_1_file_a_draft_sits_out_what_its_catch_up_does_not_pay_back(smollm2_gguf, monkeypatch):
    """The file as its own draft (always right), its drafting taken as free: with its catch-up free
    it speculates on a long prompt, alone and beside other jobs; once that record is kept and its
    catch-up priced at a step a token, a long prompt with 16 tokens to make runs no round, alone or in
    a batch, and every job's tokens are the plain ones."""
    llm = pyllm.load(smollm2_gguf, threads=2)
    draft = pyllm.load(smollm2_gguf, threads=2)
    monkeypatch.setattr(speculative.Speculator, "drafting", lambda self, k: 0.0)
    price = {"catch_up": 0.0}
    monkeypatch.setattr(speculative.Speculator, "catch_up_cost", lambda self: price["catch_up"])
    code = "def area(width, height):\n    \"\"\"The area of a rectangle.\"\"\"\n    return width * height\n"
    prompts = [llm.render_chat([{"role": "user", "content": f"Rename {name} in this function:\n\n{code}"}])
               for name in ("width to w", "height to h")]
    assert all(len(llm.prompt_ids(p)) > speculative.CATCH_UP for p in prompts)
    plain = [llm.generate(p, max_tokens=16) for p in prompts]
    used = [llm.generate(prompts[0], max_tokens=16, speculative=draft)] + llm.generate(prompts, max_tokens=16,
                                                                                        speculative=draft)
    for alone, fast in zip(plain[:1] + plain, used):
        assert fast.token_ids == alone.token_ids and fast.usage["speculative"]["accepted"] > 0
    assert speculative.costs_of(llm).taken[llm.speculation(draft).name].rate > 0.9  # the record
    price["catch_up"] = 1.0
    left_out = [llm.generate(prompts[0], max_tokens=16, speculative=draft)] + llm.generate(prompts, max_tokens=16,
                                                                                            speculative=draft)
    for alone, fast in zip(plain[:1] + plain, left_out):
        assert fast.token_ids == alone.token_ids and fast.usage["speculative"]["proposed"] == 0


def test_the_real_gemma3_file_speculates_exactly(gemma3_gguf):
    """Five sliding-window layers of 512 positions in six."""
    llm = pyllm.load(gemma3_gguf, threads=2)
    text = "The river runs past the old mill. " * 4
    plain = llm.generate(text, max_tokens=32, logprobs=2)
    _same_run(plain, llm.generate(text, max_tokens=32, logprobs=2, speculative="lookup"))


@pytest.mark.slow  # a server process: ~10 s
def test_the_server_speculates_with_its_flag_and_reports_the_counts(tmp_path):
    from server_helpers import ServerProcess, make_tiny_chat_checkpoint, request

    folder = make_tiny_chat_checkpoint(str(tmp_path / "chat"))
    llm = pyllm.load(folder)
    expected = llm.generate(SHORT_PROMPT, max_tokens=24)
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string", "maxLength": 6}},
              "required": ["a", "b"], "additionalProperties": False}
    messages = [{"role": "user", "content": SHORT_PROMPT}]
    constrained = llm.chat(messages, json_schema=schema, max_tokens=40)
    server = ServerProcess(folder, "--speculative", f"draft:{folder}", "--parallel", "1")  # takes every draft
    try:
        status, body = request(server.url, "POST", "/v1/completions",
                               {"model": "chat", "prompt": SHORT_PROMPT, "max_tokens": 24, "temperature": 0})
        # a response_format's constraint judges the drafts as it does plain steps
        fmt = {"type": "json_schema", "json_schema": {"name": "ab", "schema": schema}}
        status_json, body_json = request(server.url, "POST", "/v1/chat/completions",
                                         {"model": "chat", "messages": messages, "max_tokens": 40, "temperature": 0,
                                          "response_format": fmt})
    finally:
        server.stop()
    assert status == 200, body
    assert body["choices"][0]["text"] == expected.text
    details = body["usage"]["completion_tokens_details"]
    assert details["accepted_prediction_tokens"] > 0 and details["rejected_prediction_tokens"] == 0
    assert status_json == 200, body_json
    assert body_json["choices"][0]["message"]["content"] == constrained.text
    assert body_json["usage"]["completion_tokens_details"]["accepted_prediction_tokens"] > 0


def test_the_planner_drafts_long_along_a_long_match_and_passes_up_what_cannot_pay(tiny):
    """The round planner with costs given (not timed): a lookup match of 16 tokens whose kind was
    always taken gets a long draft where rows are cheap, none where they cost too much; a proposer
    whose drafted token costs most of a step is passed up for LONGEST_PAUSE chances."""
    target = tiny("llama")[0]
    gen = Generation(target, target.prompt_ids(PROMPT), SamplingParams(), 24, None, None)
    costs = speculative.Costs()
    costs.step, costs.row = 1.0, 0.05
    planner = speculative.Speculator("lookup", speculative.PromptLookup(), gen, target.vocab_size, costs)
    planner.missed = True  # past the trusted rounds
    stretch = list(range(10, 50))
    context = stretch + stretch[:20]  # its last 20 tokens repeat its first: a match of 16 or more
    odds, most = planner.proposer.odds(context)
    assert odds is planner.proposer.by_length[-1] and most == 40
    for _ in range(10):
        odds.record(8, 8)
    assert planner._plan(context, 100) >= 12
    costs.by_rows = {n: float(n) for n in range(2, 20)}  # a row costs a step
    assert planner._plan(context, 100) == 0 and odds.passing == speculative.FIRST_PAUSE
    drafter = speculative.Speculator("self:1", speculative.SelfDraft(1, 0.9), gen, target.vocab_size, costs)
    drafter.missed = True
    assert drafter._plan(context, 100) == 0 and drafter.proposer.single.passing == speculative.LONGEST_PAUSE


def test_a_lookup_proposes_from_the_occurrence_the_context_matches_furthest_back():
    """The 4-gram 10 11 12 13 occurs twice, followed by 70 after 1 2 and by 80 (the latest) after 3 4:
    a context ending 1 2 10 11 12 13 matches the first occurrence six tokens back, the latest four,
    so the lookup proposes 70 with the odds of a match of six; ending 3 4 ..., 80."""
    lookup = speculative.PromptLookup()
    first, second = [1, 2, 10, 11, 12, 13, 70, 71], [3, 4, 10, 11, 12, 13, 80, 81]
    context = first + second + [1, 2, 10, 11, 12, 13]
    odds, most = lookup.odds(context)
    assert lookup.propose(context, 2, None)[0] == [70, 71]
    assert odds is lookup.at_length[6] and lookup.length == 6 and most == len(context) - 6
    other = first + second + [3, 4, 10, 11, 12, 13]
    later = speculative.PromptLookup()
    later.odds(other)
    assert later.propose(other, 2, None)[0] == [80, 81] and later.length == 6


def test_a_proposer_timed_hopeless_is_passed_up_across_generations_not_tried_in_each(checkpoint):
    """A self-draft whose drafted token was timed at two steps (not even drafts always taken would
    pay): the next generation runs its one trusted round, and from then on the model's generations
    pass it up together for LONGEST_PAUSE chances: the one after it proposes nothing. The tokens are
    the plain ones."""
    target = pyllm.load(checkpoint("llama"), threads=1)  # one thread: nothing to measure, calls timed
    plain = target.generate(PROMPT, max_tokens=12)
    costs = speculative.costs_of(target)
    costs.drafts["self:1"] = 2.0
    first = target.generate(PROMPT, max_tokens=12, speculative="self:1")
    second = target.generate(PROMPT, max_tokens=12, speculative="self:1")
    assert first.token_ids == plain.token_ids and second.token_ids == plain.token_ids
    assert first.usage["speculative"]["proposed"] == 1
    assert second.usage["speculative"]["proposed"] == 0
    assert second.usage["speculative"]["steps"] == len(plain.token_ids) - 1
    assert 0 < costs.taken["self:1"].passing < speculative.LONGEST_PAUSE


def test_on_the_real_q4_1_file_a_self_draft_timed_hopeless_is_not_tried_in_each_generation(smollm2_gguf):
    """The default quantized model: self:24 with its drafted token timed at two steps runs one round
    in its first generation and none in the next; the tokens are the plain ones."""
    llm = pyllm.load(smollm2_gguf, threads=1)  # one thread: nothing to measure, calls timed
    plain = llm.generate(PROMPT, max_tokens=10)
    speculative.costs_of(llm).drafts["self:24"] = 2.0
    first = llm.generate(PROMPT, max_tokens=10, speculative="self:24")
    second = llm.generate(PROMPT, max_tokens=10, speculative="self:24")
    assert first.token_ids == plain.token_ids and second.token_ids == plain.token_ids
    assert first.usage["speculative"]["proposed"] == 1
    assert second.usage["speculative"]["proposed"] == 0


def test_a_proposer_whose_record_does_not_pay_waits_over_generations_then_probes(checkpoint):
    """A cheap self-draft (a drafted token timed at 0.1 of a step) whose record over the model's
    generations is drafts never taken: a new generation gives it no trusted rounds; the generations
    pass it up FIRST_PAUSE chances together, and the chance after them probes it with one round."""
    target = pyllm.load(checkpoint("llama"), threads=1)
    plain = target.generate(PROMPT, max_tokens=12)
    costs = speculative.costs_of(target)
    costs.drafts["self:1"] = 0.1
    costs.by_rows = {n: 1 + 0.1 * (n - 1) for n in range(2, 18)}  # not timed until a round runs
    record = costs.taken["self:1"] = speculative.Odds(0.0)  # 0 of 2 tries taken
    first = target.generate(PROMPT, max_tokens=12, speculative="self:1")
    chances = first.usage["speculative"]["steps"] - 1  # the first call is a plain step: its time the unit
    assert first.usage["speculative"]["proposed"] == 0
    assert record.passing == speculative.FIRST_PAUSE - (chances - 1) and record.probe  # the first starts it
    assert record.passing < chances  # the next generation's chances see the pause out
    second = target.generate(PROMPT, max_tokens=12, speculative="self:1")
    assert second.usage["speculative"]["proposed"] >= 1  # the probe (then what its outcome decides)
    assert first.token_ids == plain.token_ids and second.token_ids == plain.token_ids


class _Behind(_Never):
    """A proposer whose cache lacks the whole context, as a draft model's lacks the prompt before
    its first round."""

    def behind(self, context):
        return len(context)


def test_a_draft_that_must_catch_up_with_a_long_prompt_is_used_only_where_its_rounds_pay_it_back(tiny):
    """The planner with costs given: 200 tokens of prompt to run in the draft at 0.05 of a step each
    (10 steps). Alone, where a row adds 0.1 of a step and a drafted token costs 0.1, a round of 3
    drafts taken at 0.7 saves ~0.93 of a step for ~2.5 tokens: 8 tokens left do not pay the catch-up
    back, 100 do. Beside eight rows of other jobs a round of 2 cheaper drafts still pays (the call
    makes more tokens per step with it) but saves ~0.05 of a step: 100 tokens do not pay it back."""
    target = tiny("llama")[0]
    context = list(np.random.default_rng(0).integers(3, 200, 200))

    def planner(left: int, catch_up: float = 0.05, row: float = 0.1, draft: float = 0.1) -> speculative.Speculator:
        gen = Generation(target, context, SamplingParams(), left, None, None)
        costs = _costs({n: 1 + row * (n - 1) for n in range(2, 40)})
        costs.catch_up["behind"], costs.drafts["behind"] = catch_up, draft
        costs.taken["behind"] = speculative.Odds(0.7)  # its record: drafts taken at 0.7
        plan = speculative.Speculator("behind", _Behind(7), gen, target.vocab_size, costs)
        plan.missed = True  # past the trusted rounds: planned from the odds (0.7)
        return plan

    few = planner(8)
    assert few._plan(context, 8) == 0 and few.proposer.single.passing == speculative.LONGEST_PAUSE
    assert planner(100)._plan(context, 16) == 3
    assert planner(100, catch_up=0.5)._plan(context, 16) == 0  # 100 steps to catch up
    first = planner(8)
    del first.costs.taken["behind"]  # no record yet: given its chance, as in its trusted rounds
    assert first._plan(context, 8) == 3
    for catch_up, k in [(0.0, 2), (0.05, 0)]:
        share = speculative.Share(rows=9, tokens=9.0)  # eight other jobs' rows and this one's
        assert planner(100, catch_up, row=0.05, draft=0.02)._plan(context, 16, share) == k


def test_a_draft_model_passed_up_for_its_catch_up_gives_the_plain_tokens(tiny):
    """A draft as large as the target, its catch-up priced at a step a token, its record drafts taken
    at 0.7: with 44 tokens of prompt and 12 to make it never runs (no rounds, one call a token); the
    tokens are the plain ones."""
    target, same = tiny("llama")
    name = target.speculation(same).name
    costs = speculative.costs_of(target)
    tables = (costs.drafts, costs.catch_up, costs.taken)
    saved = [table.get(name) for table in tables]
    costs.drafts[name], costs.catch_up[name], costs.taken[name] = 0.0, 1.0, speculative.Odds(0.7)
    try:
        plain = target.generate(PROMPT, max_tokens=12)
        fast = target.generate(PROMPT, max_tokens=12, speculative=same)
    finally:
        for table, value in zip(tables, saved):
            table.pop(name, None) if value is None else table.__setitem__(name, value)
    assert fast.token_ids == plain.token_ids
    assert fast.usage["speculative"]["proposed"] == 0 and fast.usage["speculative"]["steps"] == len(plain.token_ids) - 1


# SmolLM2 Q4_1's verifying calls against a step on 2 threads (benchmarks/RESULTS.md), as given costs
SMOLLM2_CALLS = {2: 1.07, 3: 1.19, 4: 1.37, 5: 1.73, 6: 1.95, 7: 2.2, 8: 2.6, 9: 3.0}


def _costs(rows: dict[int, float]) -> speculative.Costs:
    costs = speculative.Costs()
    costs.step, costs.by_rows = 1.0, dict(rows)
    return costs


def test_a_lookup_learns_its_odds_from_tokens_it_did_not_propose():
    """What a match predicted is judged by the token that came, proposed or not: a hit raises the
    odds of matches of its length, a miss lowers them, and the hits along a match count at the
    lengths the match grows to."""
    lookup = speculative.PromptLookup()
    context = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3, 4]  # its last 4 tokens match its first: 5 comes next
    odds, most = lookup.odds(context)
    assert odds is lookup.by_length[2] and most == 9
    prior = odds.rate
    assert lookup.odds(context + [5])[0] is lookup.by_length[2]  # a match of 5 now
    after_hit = odds.rate
    assert after_hit > prior
    lookup.odds(context + [5, 6, 7, 0])  # 6 and 7 hit at 5 and 6 tokens, 0 missed at 7 (8 predicted)
    assert odds.rate < after_hit and odds.tries > 0.9 ** 3 * (0.9 * speculative.PRIOR_TRIES + 1) + 2
    short = lookup.by_length[0]
    lookup.odds([1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3, 4, 5, 6, 7, 0, 6])  # a match of 1 (6 -> 7)...
    lookup.odds([1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3, 4, 5, 6, 7, 0, 6, 2])  # ...that missed
    assert short.rate < speculative.LOOKUP_PRIORS[0]


def test_the_planner_stays_quiet_where_the_lookup_keeps_missing_and_copies_long_where_it_hits():
    """Given SmolLM2's measured costs: on text whose matches never predict the next token (free
    chat), lookup proposes a few drafts while its odds are priors, then none; on a copy of the
    prompt (editing), long drafts from the first round on, taken in full."""
    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.integers(0, 40, 60)]
    lookup = speculative.PromptLookup()
    output = []
    for _ in range(300):  # each token one the lookup's match did not predict
        context = prompt + output
        odds, _ = lookup.odds(context)
        predicted = context[lookup.at] if odds is not None else -1
        output.append(next(int(t) for t in rng.integers(0, 40, 8) if t != predicted))
    rounds = speculative.lookup_rounds(prompt, output, _costs(SMOLLM2_CALLS), made=0)
    assert sum(taken for _, taken in rounds) == 0
    assert sum(proposed for proposed, _ in rounds) <= 16  # odds of 0.7 before any judged: 32
    assert not any(proposed for proposed, _ in rounds[150:])

    text = [int(t) for t in rng.integers(100, 5000, 200)]
    rounds = speculative.lookup_rounds(text, text[:150], _costs(SMOLLM2_CALLS), made=0)
    assert rounds[0][0] == 0 and rounds[1][0] >= 2  # the copy's first token is the first to match
    assert len(rounds) < 150 / 3
