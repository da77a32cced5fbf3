"""How many threads to run: physical cores available to this process, unless the user says.

Hyper-threads share a core's FMA units and its memory bandwidth; a second thread per core only adds
synchronisation. OMP_NUM_THREADS is honoured as other numeric libraries honour it.
"""
from __future__ import annotations

import os


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
