"""`pyllm batch` and pyllm.batch(): a file of 200 OpenAI Batch requests (chat, completions,
embeddings, bad bodies and 5 malformed lines) gets, line for line, the bodies a `pyllm serve` process
returns for the same request bodies; a job killed with SIGKILL halfway and started again ends with
exactly one result per request; on a local Ray cluster (2 actors) the results are the same, and an
actor killed mid-run is replaced without a request lost or written twice."""
from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest

import pyllm
from pyllm import batch_jobs
from server_helpers import CHAT_TEMPLATE, ServerProcess, request
from tiny_generation import write_checkpoint

N_REQUESTS = 200
PROMPTS = ["The wheel is built once", "a", "Its core picks the widest vector instructions that the processor offers",
           "A small model made of random numbers cannot say anything true, but it can prove that every matrix"]
# Lines that cannot be run (the first is cut short and not UTF-8): each gets an error line with its
# code, and the job goes on.
MALFORMED = [(b'{"custom_id": "cut", "method": "POST", "url": "/v1/com\xff', "invalid_json_line", None),
             ({"method": "POST", "url": "/v1/completions", "body": {}}, "missing_custom_id", None),
             ({"custom_id": "get", "method": "GET", "url": "/v1/completions", "body": {}}, "invalid_method", "get"),
             ({"custom_id": "img", "method": "POST", "url": "/v1/images/generations", "body": {}}, "invalid_url",
              "img"),
             ({"custom_id": "req-0", "method": "POST", "url": "/v1/embeddings", "body": {}}, "duplicate_custom_id",
              "req-0")]


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory) -> str:
    """tiny_generation's numpy Llama (no torch needed), with a chat template."""
    folder = str(tmp_path_factory.mktemp("batch-model"))
    write_checkpoint(folder)
    path = os.path.join(folder, "tokenizer_config.json")
    with open(path) as f:
        config = json.load(f)
    with open(path, "w") as f:
        json.dump({**config, "chat_template": CHAT_TEMPLATE}, f)
    return folder


def request_bodies(model: str) -> list[tuple[str, dict]]:
    """(url, body) of 195 requests of every kind, greedy or seeded, with a few the server refuses."""
    rng = random.Random(38)
    out = []
    for i in range(N_REQUESTS - len(MALFORMED)):
        kind = rng.choice(["chat", "chat", "completion", "completion", "embedding"])
        prompt = rng.choice(PROMPTS)
        sampling = rng.choice([{"temperature": 0}] * 3 + [{"temperature": 0.9, "seed": i, "n": 2}])
        if kind == "chat":
            body = {"model": model, "messages": [{"role": "system", "content": "Be terse."},
                                                 {"role": "user", "content": prompt}],
                    "max_tokens": rng.choice([1, 4, 12]), **sampling}
            if rng.random() < 0.2:
                body.update(logprobs=True, top_logprobs=2)
            out.append(("/v1/chat/completions", body))
        elif kind == "completion":
            given = rng.choice([prompt, [prompt, "a b"], [5, 6, 7, 8]])
            body = {"model": model, "prompt": given, "max_tokens": rng.choice([2, 8, 16]), **sampling}
            if rng.random() < 0.2:
                body.update(logprobs=2, stop=[" the"])
            out.append(("/v1/completions", body))
        else:
            out.append(("/v1/embeddings", {"model": model, "input": rng.choice([prompt, [prompt, "x"]]),
                                           "encoding_format": rng.choice(["float", "base64"])}))
    # bodies `pyllm serve` refuses: the same 400s and 404 come back as responses
    out[10] = ("/v1/chat/completions", {"model": model, "messages": [], "max_tokens": 4})
    out[20] = ("/v1/completions", {"model": model, "prompt": "x", "temperature": "hot"})
    out[30] = ("/v1/completions", {"model": "gpt-4o", "prompt": "x"})
    out[40] = ("/v1/embeddings", {"model": model, "input": "x", "frobnicate": 1})
    out[50] = ("/v1/completions", {"model": model, "prompt": "a lone \ud800 surrogate"})
    return out


@pytest.fixture(scope="module")
def job(tiny_folder, tmp_path_factory):
    """The request file (the malformed lines spread through it) and, by line number, what a `pyllm
    serve` process answers each request that can be run: (custom_id, status, body), or None."""
    model = os.path.basename(tiny_folder)
    lines = [(json.dumps({"custom_id": f"req-{i}", "method": "POST", "url": url, "body": body}).encode(), (url, body))
             for i, (url, body) in enumerate(request_bodies(model))]
    for k, (line, _, _) in enumerate(MALFORMED):
        lines.insert(25 + 37 * k, (line if isinstance(line, bytes) else json.dumps(line).encode(), None))
    path = tmp_path_factory.mktemp("batch-job") / "requests.jsonl"
    path.write_bytes(b"".join(line + b"\n" for line, _ in lines))

    server = ServerProcess(tiny_folder, "--parallel", "4", "--threads", "1")
    try:
        def answer(line_request):
            line, sent = line_request
            if sent is None:
                return None
            return (json.loads(line)["custom_id"], *request(server.url, "POST", *sent))
        with ThreadPoolExecutor(8) as pool:
            answers = dict(enumerate(pool.map(answer, lines), 1))
    finally:
        server.stop()
    return str(path), answers


def comparable(result: dict):
    """A result without what differs from run to run: the ids and creation times of the bodies."""
    if result["response"] is None:
        return result["custom_id"], None, result["error"]["code"]
    body = {k: v for k, v in result["response"]["body"].items() if k not in ("id", "created")}
    return result["custom_id"], result["response"]["status_code"], body


def read_results(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f]


def assert_results_are_the_servers(results: list[dict], job) -> None:
    """One result per request line, each the server's answer, or the malformed line's error."""
    _, answers = job
    by_number = {batch_jobs.line_number(r): r for r in results}
    assert len(results) == len(by_number) == N_REQUESTS
    assert set(by_number) == set(range(1, N_REQUESTS + 1))
    errors = []
    for number, r in sorted(by_number.items()):
        if answers[number] is None:
            errors.append((r["custom_id"], r["error"]["code"]))
            assert r["response"] is None
        else:
            custom_id, status, body = answers[number]
            expected = {"custom_id": custom_id, "response": {"status_code": status, "body": body}}
            assert comparable(r) == comparable(expected), number
            assert r["error"] is None and r["response"]["request_id"].startswith("req_")
    assert errors == [(custom_id, code) for _, code, custom_id in MALFORMED]
    statuses = [a[1] for a in answers.values() if a is not None]
    assert statuses.count(200) == N_REQUESTS - len(MALFORMED) - 5


def run_batch(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "pyllm", "batch", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def lines_in(path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def test_pyllm_batch_over_an_iterable_gets_what_the_server_returns(tiny_folder, job):
    """Dicts and lines of JSON alike; the server and this run both on one thread, as a thread count
    changes the last bits of an embedding or a logprob (never a greedy token)."""
    with open(job[0], "rb") as f:
        lines = f.read().splitlines()
    requests = [line if n % 2 or answer is None else json.loads(line)
                for n, (line, answer) in enumerate(zip(lines, job[1].values()))]
    results = list(pyllm.batch(requests, tiny_folder, parallel=4, threads=1))
    assert_results_are_the_servers(results, job)


def test_killed_halfway_and_started_again_it_ends_with_the_servers_200_results(tiny_folder, job, tmp_path):
    out = tmp_path / "results.jsonl"
    args = (job[0], str(out), "--model", tiny_folder, "--parallel", "2", "--threads", "1")
    proc = run_batch(*args)
    while proc.poll() is None and lines_in(out) < N_REQUESTS // 2:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    data = out.read_bytes()
    written = data.count(b"\n")
    assert N_REQUESTS // 2 <= written < N_REQUESTS, "the job ended before it was killed"
    # a kill in the middle of a write leaves the start of a line: the last one cut so
    out.write_bytes(data[:data.rstrip(b"\n").rfind(b"\n") + 40])
    again = run_batch(*args)
    _, err = again.communicate(timeout=300)
    assert again.returncode == 0, err
    assert f"{N_REQUESTS - written + 1} requests run" in err
    assert f"{N_REQUESTS}/{N_REQUESTS}" in err and "tok/s" in err  # the progress bar on stderr
    assert_results_are_the_servers(read_results(str(out)), job)
    finished = run_batch(*args)
    _, err = finished.communicate(timeout=120)
    assert "0 requests run" in err and lines_in(out) == N_REQUESTS


def test_results_of_another_input_are_not_taken_for_done(tmp_path):
    source = tmp_path / "requests.jsonl"
    source.write_text(json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/embeddings", "body": {}}) + "\n")
    out = tmp_path / "results.jsonl"
    out.write_text(json.dumps({"id": "batch_req_1", "custom_id": "b", "response": None, "error": None}) + "\n")
    with pytest.raises(pyllm.PyllmError, match="are not those of"):
        batch_jobs.run_file(str(source), str(out), lambda entries: iter(()), progress=False)


def test_a_caller_that_stops_early_leaves_every_cache_free_and_the_model_to_run_again(tiny_folder):
    llm = pyllm.load(tiny_folder, parallel=4)
    body = {"model": os.path.basename(tiny_folder), "prompt": "The wheel", "max_tokens": 40, "temperature": 0,
            "logit_bias": {"1": -100}}  # no end of sequence: each runs its 40 tokens
    requests = [{"custom_id": str(i), "method": "POST", "url": "/v1/completions", "body": body} for i in range(16)]
    for _ in range(3):
        results = pyllm.batch(requests, llm)
        next(results)
        results.close()  # the others were running or waiting
        assert all(cache.owner is None for cache in llm.pool.caches)
    texts = {r["response"]["body"]["choices"][0]["text"] for r in pyllm.batch(requests[:3], llm)}
    assert texts == {llm.generate("The wheel", max_tokens=40, logit_bias={1: -100}).text}


def test_an_app_that_crashes_gives_a_500_in_the_servers_shape_and_the_job_goes_on():
    async def answers_then_raises(scope, receive, send):  # Starlette's way: its 500 sent, then re-raised
        await send({"type": "http.response.start", "status": 500, "headers": []})
        await send({"type": "http.response.body", "body": b'{"error": {"message": "sent"}}'})
        raise RuntimeError("logged by the server")

    async def raises(scope, receive, send):
        raise RuntimeError("boom")

    assert asyncio.run(batch_jobs.post(answers_then_raises, "/v1/completions", b"{}")) == (
        500, {"error": {"message": "sent"}})
    assert asyncio.run(batch_jobs.post(raises, "/v1/completions", b"{}")) == (500, {"error": {
        "message": "internal error: RuntimeError: boom", "type": "server_error", "param": None, "code": None}})


# ---- Ray ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray cluster of 2 CPUs (it takes seconds to start); its address."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


def map_workers() -> list[psutil.Process]:
    """The processes of Ray Data's actors (titled ray::MapWorker(...))."""
    return [p for p in psutil.process_iter(["cmdline"]) if "MapWorker" in " ".join(p.info["cmdline"] or [])]


def test_on_ray_the_same_200_results_with_an_actor_killed_mid_run(tiny_folder, job, ray_cluster, tmp_path):
    """Two actors of one CPU each; one is killed a third of the way in: the job still ends well and
    the file holds each result once. Whatever batch the killed actor held runs again, on the actor
    Ray starts in its place; where it held none, the other actor may finish the job before Ray's
    replacement shows (a race that failed this test when it also asked for the replacement)."""
    out = tmp_path / "results.jsonl"
    proc = run_batch(job[0], str(out), "--model", tiny_folder, "--parallel", "4", "--ray", ray_cluster,
                     "--actors", "2", "--cpus-per-actor", "1")
    while proc.poll() is None and lines_in(out) < N_REQUESTS // 3:
        time.sleep(0.01)
    workers = map_workers()
    assert proc.poll() is None and len(workers) == 2
    workers[0].send_signal(signal.SIGKILL)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert not workers[0].is_running()
    assert_results_are_the_servers(read_results(str(out)), job)
