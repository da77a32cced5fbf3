"""benchmarks/threads_table.py, the decode-by-threads table of issue 33: what it reports, not how fast."""
from __future__ import annotations

import importlib.util
import os
import sys

BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")


def threads_table():
    if BENCHMARKS not in sys.path:
        sys.path.insert(0, BENCHMARKS)
    spec = importlib.util.spec_from_file_location("threads_table", os.path.join(BENCHMARKS, "threads_table.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_each_count_is_judged_against_the_count_below_it():
    marks = threads_table().monotone([10.0, 12.0, 12.0, 9.0, None, 11.0])
    assert marks == ["-", "yes", "yes", "no (0.75x)", "-", "yes"]


def test_the_table_has_a_row_per_count_with_pyllm_s_own_choice(smollm2_gguf, tmp_path):
    out = tmp_path / "table.md"
    assert threads_table().main(["--model", smollm2_gguf, "--threads", "1,2", "--repeats", "1",
                                 "--decode-tokens", "4", "--prefill", "16", "--out", str(out)]) == 0
    rows = [line.split("|")[1:-1] for line in out.read_text().splitlines() if line.startswith("| ")]
    header, body = rows[0], rows[1:]
    assert [c.strip() for c in header][:3] == ["threads", "pyllm measured tok/s", "pyllm all N tok/s"]
    assert [int(r[0]) for r in body] == [1, 2]
    for r in body:
        n = int(r[0])
        measured, chosen = r[1].split()
        assert float(measured) > 0 and 1 <= int(chosen.strip("()")) <= n
        assert float(r[2]) > 0 and float(r[3]) > 0  # decode with every thread; the prefill
    first, second = body[0][-1].strip(), body[1][-1].strip()
    assert first == "-" and (second == "yes" or second.startswith("no ("))
