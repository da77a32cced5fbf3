"""How many threads to run (physical cores available to this process, unless the user says), and
which of them a decode step runs on (DecodeThreads).

Hyper-threads share a core's FMA units and its memory bandwidth; a second thread per core only adds
synchronisation. OMP_NUM_THREADS is honoured as other numeric libraries honour it.
"""
from __future__ import annotations

import os
import statistics


def _available_cpus() -> set[int]:
    if hasattr(os, "sched_getaffinity"):
        return set(os.sched_getaffinity(0))
    return set(range(os.cpu_count() or 1))


def _cgroup_limit() -> int | None:
    """CPUs a container's CFS quota allows (cgroup v2, then v1), or None."""
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            return max(1, int(int(quota) / int(period)))
    except (OSError, ValueError):
        pass
    try:
        with open("/sys/fs/cgroup/cpu/cpu.cfs_quota_us") as f:
            quota = int(f.read())
        with open("/sys/fs/cgroup/cpu/cpu.cfs_period_us") as f:
            period = int(f.read())
        if quota > 0:
            return max(1, quota // period)
    except (OSError, ValueError):
        pass
    return None


def physical_cores() -> int:
    cpus = _available_cpus()
    cores = set()
    for cpu in cpus:
        try:
            with open(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list") as f:
                cores.add(f.read().strip())
        except OSError:
            cores.add(str(cpu))
    n = len(cores) or 1
    limit = _cgroup_limit()
    return min(n, limit) if limit else n


def default_threads() -> int:
    env = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    if env.isdigit() and int(env) > 0:
        return int(env)
    return physical_cores()


DECODE_BLOCK = 4  # consecutive decode steps on one count: the first pays the switch and is not scored
DECODE_PASSES = 2  # blocks of each count, in turn: a noisy moment hits one block, not a count's every step
DECODE_DROP = 1.25  # after a pass, a count this much slower than the best (medians) is tried no more
DECODE_RECHECK = 1024  # one-row decode steps on a chosen count before the counts are measured again


def decode_candidates(n_threads: int) -> list[int]:
    """The thread counts a pool of n_threads tries for decode steps, most first: all of them, three
    quarters, half and a quarter, rounded up (16: 16, 12, 8, 4; 2: 2, 1)."""
    n = max(1, n_threads)
    return sorted({n, -(-3 * n // 4), -(-n // 2), -(-n // 4)}, reverse=True)


class DecodeThreads:
    """The threads a model's decode calls (a step of one row, a speculative round, a few jobs' rows:
    csrc/pyllm.h's PL_DECODE_ROWS) run on: of its pool's n, the count measured fastest. A decode
    step reads every weight once; past the cores that saturate the memory bus more threads add
    only their barriers' cost (a 16-core Xeon decoded SmolLM2 slower at 16 threads than at 8), and
    prefill, compute-bound, keeps all n. The first one-row steps take the candidate counts in
    blocks of DECODE_BLOCK, in turn (a block's first step, which wakes or parks threads, unscored),
    DECODE_PASSES times, a count far behind the best dropped after a pass (where one count is left,
    as where 1 thread of 2 is far slower, one pass decides); the least median decides, and is
    measured again after DECODE_RECHECK one-row steps: the machine's other work comes and goes (a
    model loaded while another process held a core would keep 1 thread of 2 for good); calls of
    several rows keep the last choice meanwhile, as only one-row steps advance a measure. The bits do
    not depend on the count (every task reduces in the same order whatever the split), only the
    time. fixed: a count chosen beforehand (tests, benchmarks), never measured."""

    def __init__(self, n_threads: int, fixed: int | None = None):
        self.candidates = decode_candidates(n_threads)
        self.measured = 0  # measures completed
        self.chosen: int | None = None
        self.last: int | None = None  # the choice before the measure under way
        self._fixed = len(self.candidates) == 1  # nothing to measure
        self._measure()
        if self._fixed:
            self.chosen = self.candidates[0]
        if fixed is not None:
            self.fix(fixed)

    def _measure(self) -> None:
        """Starts measuring every candidate afresh."""
        if self.chosen is not None:
            self.last, self.chosen = self.chosen, None
        self.times: dict[int, list[float]] = {c: [] for c in self.candidates}
        self._trying = list(self.candidates)  # the counts still in the running
        self._passes = 0
        self._since = 0  # decode calls since the choice
        self._start_pass()

    def _start_pass(self) -> None:
        # (count, scored) of the steps left in this pass
        self._plan: list[tuple[int, bool]] = [(c, i > 0) for c in self._trying for i in range(DECODE_BLOCK)]

    def fix(self, count: int) -> None:
        """Decode calls run on count threads from now on, never measured again."""
        if not 1 <= count <= self.candidates[0]:
            raise ValueError(f"decode threads must be in [1, {self.candidates[0]}], got {count}")
        self.chosen, self._fixed = count, True

    def next(self, rows: int = 1) -> int:
        """The count the next decode call, of rows rows, runs on."""
        if self.chosen is not None and not self._fixed and rows == 1:
            self._since += 1
            if self._since > DECODE_RECHECK:
                self._measure()
        if self.chosen is not None:
            return self.chosen
        return self.last if rows != 1 and self.last is not None else self._plan[0][0]

    def record(self, count: int, seconds: float) -> None:
        """A one-row decode step on count threads (next()'s) took seconds."""
        if self.chosen is not None or count != self._plan[0][0]:
            return
        if self._plan.pop(0)[1]:
            self.times[count].append(seconds)
        if self._plan:
            return
        self._passes += 1
        median = {c: statistics.median(self.times[c]) for c in self._trying}
        best = min(median.values())
        self._trying = [c for c in self._trying if median[c] <= DECODE_DROP * best]
        if self._passes == DECODE_PASSES or len(self._trying) == 1:
            self.chosen = min(self._trying, key=lambda c: (median[c], -c))
            self.measured += 1
        else:
            self._start_pass()
