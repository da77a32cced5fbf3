"""OpenAI Batch requests through Ray Data: a pool of actors, each with one pyllm model and the
Runner of batch_jobs (the engine of `pyllm serve`), its threads the CPUs Ray gives the actor.

    pip install "pyllm[ray]"

    import ray
    from pyllm.batch_ray import map_requests

    with open("requests.jsonl") as f:
        ds = ray.data.from_items([{"number": n, "text": line} for n, line in enumerate(f, 1)])
    results = map_requests(ds, "smollm2", actors=4, cpus_per_actor=8)
    results.write_json("results/")  # rows {"number", "result"}: the result line's JSON

`pyllm batch IN OUT --ray` does the same from the command line, writing one JSONL file that a
second run completes (batch_jobs.run_file).

Ray restarts an actor that dies (a killed process, a lost node) and runs its batch again on the new
one (Ray Data's defaults for actors: max_restarts and max_task_retries -1); the file job keeps one
result per request (batch_jobs.run_file), so a batch run twice is written once.
"""
from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import numpy as np

from .batch_jobs import Entry, Runner, line_number, parse_line, result_line
from .errors import PyllmError

ROWS_PER_SLOT = 4  # a Ray batch holds this many requests per slot: the engine stays full between batches
ACTOR_CPUS = 8  # an actor's CPUs unless told: as many as most nodes have to give one actor


class BatchActor:
    """One model on one Ray actor: map_batches calls it with rows {"number": a request's line number,
    "text": the request line} and gets rows {"number", "result": the result line's JSON}."""

    def __init__(self, source: str, parallel: int, load_settings: dict):
        import ray

        from .loader import load

        cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 1)
        self.model = load(source, threads=max(1, int(cpus)), parallel=parallel, **load_settings)
        self.runner = Runner(self.model, source)

    def __call__(self, rows: dict) -> dict:
        entries = [parse_line(int(n), t) for n, t in zip(rows["number"], rows["text"])]
        results = list(self.runner.run(entries))
        return {"number": np.array([line_number(r) for r in results], dtype=np.int64),
                "result": np.array([json.dumps(r) for r in results], dtype=object)}


def map_requests(ds, source: str, *, actors: int | None = None, cpus_per_actor: int | None = None,
                 parallel: int = 4, batch_size: int | None = None, **load_settings):
    """The Ray dataset of results of ds, a dataset of request lines ("text") and their line numbers
    ("number", the N of the result's id batch_req_N).

    actors: the pool's size (default: as many as the cluster's CPUs hold); cpus_per_actor: each
    actor's CPUs, its model's threads (default: the cluster's CPUs shared by the actors, else
    ACTOR_CPUS). The model source must load on every node (an alias, a hub id, or a path they share)."""
    import ray

    cpus = int(ray.cluster_resources().get("CPU", 1))
    if cpus_per_actor is None:
        cpus_per_actor = max(1, cpus // actors) if actors else min(cpus, ACTOR_CPUS)
    actors = actors or max(1, cpus // cpus_per_actor)
    return ds.map_batches(BatchActor, fn_constructor_kwargs={"source": source, "parallel": parallel,
                                                             "load_settings": load_settings},
                          batch_size=batch_size or ROWS_PER_SLOT * parallel, batch_format="numpy",
                          compute=ray.data.ActorPoolStrategy(size=actors), num_cpus=cpus_per_actor)


def ray_results(source: str, *, address: str | None = None, **settings):
    """A results function for batch_jobs.run_file: the entries run on Ray (ray.init(address) unless
    Ray is already initialized), their result lines streamed back as the actors finish them. Lines
    that cannot be run are answered here, without a trip to the cluster."""
    try:
        import ray
    except ImportError:
        raise PyllmError('pyllm batch --ray needs Ray Data: pip install "pyllm[ray]"') from None

    def results(entries: list[Entry]) -> Iterator[dict]:
        if not ray.is_initialized():
            ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
        ray.data.DataContext.get_current().enable_progress_bars = False  # pyllm's own bar says it all
        runnable = []
        for e in entries:
            if e.error is not None:
                yield result_line(e)
            else:
                runnable.append({"number": e.number, "text": json.dumps(
                    {"custom_id": e.custom_id, "method": "POST", "url": e.url, "body": json.loads(e.body)})})
        if not runnable:
            return
        ds = ray.data.from_items(runnable)
        for row in map_requests(ds, source, **settings).iter_rows():
            yield json.loads(row["result"])
    return results
