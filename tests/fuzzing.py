"""Seeded fuzzing: every case draws from its own random.Random(seed), so a failing case is replayed
from the seed the test prints, alone:

    PYLLM_FUZZ_SEEDS=2024017 python -m pytest tests/test_config_errors.py -k mutated

PYLLM_FUZZ_CASES=5000 runs more cases than the suite's default (a longer fuzzing session).
"""
from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable

import pytest


def seeds(base: int, count: int) -> list[int]:
    """The seeds a fuzz test runs: count from base, or only those PYLLM_FUZZ_SEEDS lists ("7,42")."""
    chosen = os.environ.get("PYLLM_FUZZ_SEEDS")
    if chosen:
        return [int(s) for s in chosen.split(",")]
    return list(range(base, base + int(os.environ.get("PYLLM_FUZZ_CASES", count))))


def run_cases(base: int, count: int, case: Callable[[int], str],
              describe: Callable[[int], str] | None = None) -> Counter:
    """Runs case(seed) for each seed and counts the outcomes it names ("ran", "refused", ...). Any
    exception a case lets out (a TypeError, a MemoryError, a Rust panic) fails the test, which lists
    every failing seed with describe(seed), what its case did."""
    outcomes: Counter = Counter()
    failures: dict[int, str] = {}
    start = time.perf_counter()
    for seed in seeds(base, count):
        try:
            outcomes[case(seed)] += 1
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # pyo3's PanicException is a BaseException
            what = f" ({describe(seed)})" if describe else ""
            failures[seed] = f"seed {seed}{what}: {type(e).__name__}: {str(e)[:300]}"
    print(f"{sum(outcomes.values()) + len(failures)} cases in {time.perf_counter() - start:.1f} s: "
          f"{dict(outcomes)}, {len(failures)} failed")
    if failures:
        test = os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0]
        replay = f"PYLLM_FUZZ_SEEDS={next(iter(failures))} python -m pytest {test}"
        pytest.fail(f"{len(failures)} cases raised what they must not (replay one: {replay}):\n"
                    + "\n".join(list(failures.values())[:20]), pytrace=False)
    return outcomes
