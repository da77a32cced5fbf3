"""`pyllm batch` and pyllm.batch(): OpenAI Batch files through the engine `pyllm serve` runs.

A request is one line of JSON: {"custom_id", "method": "POST", "url", "body"}, url one of
/v1/chat/completions, /v1/completions, /v1/embeddings. Its result is one line in OpenAI's Batch output
shape: {"id": "batch_req_N", "custom_id", "response": {"status_code", "request_id", "body"}, "error": null},
or, for a line that cannot be run (not JSON, no custom_id, another method or url, a custom_id seen
before), {"id", "custom_id", "response": null, "error": {"code", "message"}}. N is the request's line
number in the input (its position, from 1, in an iterable).

Each body goes through the server's own app (server.create_app), called in this process without a
socket, so it gets exactly the validation, the errors and the response body `pyllm serve` gives it;
requests run together through the server's Scheduler (continuous batching, `parallel` at a time).

A file job writes each result as it finishes and flushes it. Started again with the same files it
skips the requests OUT already answers: a last line cut short by a kill is dropped and its request
run again, so every request ends with exactly one result line.

>>> for result in pyllm.batch(requests, "smollm2", parallel=8):  # doctest: +SKIP
...     print(result["custom_id"], result["response"]["body"]["choices"][0]["message"]["content"])
"""
from __future__ import annotations

import json
import os
import sys
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from .errors import PyllmError

URLS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
NO_QUEUE_LIMIT = 1 << 62  # a batch bounds what it has in flight itself: it never gets a 429


@dataclass
class Entry:
    """One request line: what to post, or why it cannot be run."""
    number: int                # its line number in the input, from 1
    custom_id: str | None
    url: str | None = None
    body: bytes | None = None  # the body's JSON, as a client would send it
    error: dict | None = None  # {"code", "message"} of a line that cannot be run


def parse_line(number: int, line) -> Entry:
    """A request line (its JSON text, or the dict it holds) as an Entry."""
    if isinstance(line, (str, bytes)):
        try:
            line = json.loads(line.strip())
        except ValueError as e:
            return Entry(number, None, error=_error("invalid_json_line", f"line {number} is not JSON: {e}"))
    if not isinstance(line, dict):
        return Entry(number, None, error=_error("invalid_json_line", f"line {number} is not a JSON object"))
    custom_id = line.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return Entry(number, None, error=_error("missing_custom_id", f"line {number} has no custom_id string"))
    if line.get("method") != "POST":
        return Entry(number, custom_id, error=_error("invalid_method", f"method must be \"POST\", got "
                                                                       f"{line.get('method')!r}"))
    if line.get("url") not in URLS:
        return Entry(number, custom_id, error=_error("invalid_url", f"url must be one of {', '.join(URLS)}, "
                                                                    f"got {line.get('url')!r}"))
    if "body" not in line:
        return Entry(number, custom_id, error=_error("missing_body", "the request has no body"))
    # ASCII JSON: a lone surrogate ("\ud800") stays an escape, for the server to refuse as it would
    return Entry(number, custom_id, line["url"], json.dumps(line["body"]).encode())


def read_entries(lines: Iterable) -> Iterator[Entry]:
    """Entries of request lines numbered from 1; blank lines are skipped (their numbers too), and a
    custom_id already used by an earlier line is an error, as in OpenAI's Batch API."""
    seen: set[str] = set()
    for number, line in enumerate(lines, 1):
        if isinstance(line, (str, bytes)) and not line.strip():
            continue
        entry = parse_line(number, line)
        if entry.error is None and entry.custom_id in seen:
            entry = Entry(number, entry.custom_id,
                          error=_error("duplicate_custom_id", f"custom_id {entry.custom_id!r} is used by an "
                                                              f"earlier line"))
        seen.add(entry.custom_id)
        yield entry


def _error(code: str, message: str) -> dict:
    return {"code": code, "message": message}


def result_line(entry: Entry, status: int | None = None, body: dict | None = None) -> dict:
    """The Batch output line of an entry: its response, or its error."""
    if entry.error is not None:
        return {"id": f"batch_req_{entry.number}", "custom_id": entry.custom_id, "response": None,
                "error": entry.error}
    return {"id": f"batch_req_{entry.number}", "custom_id": entry.custom_id,
            "response": {"status_code": status, "request_id": f"req_{uuid.uuid4().hex}", "body": body},
            "error": None}


def line_number(result: dict) -> int:
    return int(result["id"].removeprefix("batch_req_"))


# ---- the server's app, in process ------------------------------------------------------------------


async def post(app, path: str, body: bytes) -> tuple[int, dict]:
    """(status, JSON body) of one POST to an ASGI app, called directly: the request's body comes at
    once, and the client stays connected until the answer is complete. An app that fails without
    answering gives the 500 `pyllm serve` would send, so one request cannot stop a job."""
    import asyncio  # here, not at the top: `import pyllm` (which names batch) stays as quick as it was

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"",
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
             "client": ("127.0.0.1", 0), "server": ("127.0.0.1", 0)}
    answered = asyncio.Event()
    state = {"sent": False, "status": 500}
    chunks: list[bytes] = []

    async def receive() -> dict:
        if not state["sent"]:
            state["sent"] = True
            return {"type": "http.request", "body": body, "more_body": False}
        await answered.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        if message["type"] == "http.response.start":
            state["status"] = message["status"]
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                answered.set()

    try:
        await app(scope, receive, send)
    except Exception as e:  # noqa: BLE001 — Starlette re-raises a crash after its 500 has been sent
        if not answered.is_set():
            return 500, {"error": {"message": f"internal error: {type(e).__name__}: {e}", "type": "server_error",
                                   "param": None, "code": None}}
    return state["status"], json.loads(b"".join(chunks))


class Runner:
    """`pyllm serve`'s app and scheduler over one model, answering Entries without HTTP."""

    def __init__(self, model, source: str | None = None):
        try:
            from .server import create_app
        except ImportError as e:
            raise PyllmError(f'pyllm batch runs the server\'s engine, which needs FastAPI ({e.name} is not '
                             f'installed): pip install "pyllm[server]"') from None

        # in process, no socket: there is no Host header to check (allowed_hosts=None)
        self.app = create_app(model, source or model.source, max_queue=NO_QUEUE_LIMIT, allowed_hosts=None)
        self.scheduler = self.app.state.server.scheduler
        # as many requests wait as run: a slot that frees is taken at the engine's next step
        self.in_flight = 2 * self.scheduler.slots
        self.scheduler.start()

    def close(self) -> None:
        """Stops the engine; jobs of a run stopped early give back their KV caches (the model may
        be used again: by another batch, or by the caller)."""
        self.scheduler.close()
        self.scheduler.engine.fail_all(PyllmError("the batch was stopped"))

    async def answer(self, entry: Entry) -> dict:
        if entry.error is not None:
            return result_line(entry)
        body = json.loads(entry.body)
        if isinstance(body, dict) and body.get("stream") is True:
            return result_line(entry, 400, {"error": {
                "message": "stream is not supported in a batch: each result is written whole",
                "type": "invalid_request_error", "param": "stream", "code": "unsupported_parameter"}})
        status, answer = await post(self.app, entry.url, entry.body)
        return result_line(entry, status, answer)

    def run(self, entries: Iterable[Entry]) -> Iterator[dict]:
        """The result line of every entry, as each finishes; entries are taken from the iterable as
        room frees, so it may be a long stream."""
        import asyncio

        loop = asyncio.new_event_loop()
        pending: set = set()
        entries = iter(entries)
        try:
            while True:
                for entry in entries:
                    pending.add(loop.create_task(self.answer(entry)))
                    if len(pending) >= self.in_flight:
                        break
                if not pending:
                    return
                done, pending = loop.run_until_complete(asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED))
                for task in done:
                    yield task.result()
        finally:  # a consumer that stops early (or a Ctrl-C) cancels what is running: slots are freed
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.wait(pending))
            loop.close()


def batch(requests: Iterable, model, *, parallel: int | None = None, progress: bool = False,
          **load_settings) -> Iterator[dict]:
    """Runs OpenAI Batch requests (dicts, or lines of JSON) through the engine of `pyllm serve`,
    yielding each result line (a dict in OpenAI's Batch output shape) as it finishes.

    model is a loaded Model (its `parallel` caches are the requests run at once) or what pyllm.load
    takes, loaded with parallel (default 4) and load_settings. Results come in the order they
    finish; their "id" is batch_req_N for the N-th request, and custom_id is the request's.

    >>> rows = [{"custom_id": "a", "method": "POST", "url": "/v1/completions",
    ...          "body": {"model": "smollm2", "prompt": "Hi", "max_tokens": 8, "temperature": 0}}]
    >>> [r["response"]["body"]["choices"][0]["text"] for r in pyllm.batch(rows, "smollm2")]  # doctest: +SKIP
    """
    if isinstance(model, str):
        from .loader import load

        source, model = model, load(model, parallel=parallel or 4, **load_settings)
    else:
        if parallel is not None or load_settings:
            raise ValueError("parallel and load settings apply to a model batch loads; this one is loaded "
                             "(pass them to pyllm.load)")
        source = model.source
    runner = Runner(model, source)
    entries = list(read_entries(requests)) if progress else read_entries(requests)
    bar = Progress(len(entries), 0) if progress else None
    results = runner.run(entries)
    try:
        for result in results:
            if bar is not None:
                bar.update(result)
            yield result
    finally:  # a caller that stops early: what runs is cancelled before the engine stops
        results.close()
        runner.close()
        if bar is not None:
            bar.close()


# ---- files -----------------------------------------------------------------------------------------


class Progress:
    """A bar on stderr: requests done of all, requests/s, time left, tokens/s in and out."""

    def __init__(self, total: int, done: int):
        from tqdm import tqdm

        self.bar = tqdm(total=total, initial=done, unit="req", file=sys.stderr, dynamic_ncols=True,
                        mininterval=0.5, smoothing=0.1)
        self.start = time.monotonic()
        self.tokens_in = self.tokens_out = 0

    def update(self, result: dict) -> None:
        response = result.get("response") or {}
        usage = (response.get("body") or {}).get("usage") or {}
        self.tokens_in += usage.get("prompt_tokens", 0)
        self.tokens_out += usage.get("completion_tokens", 0)
        elapsed = max(time.monotonic() - self.start, 1e-9)
        self.bar.set_postfix_str(f"in {self.tokens_in / elapsed:.0f} tok/s, out {self.tokens_out / elapsed:.0f} tok/s",
                                 refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


def read_done(out_path: str) -> dict[int, str | None]:
    """line number -> custom_id of every result OUT holds. A last line without its newline was cut
    short (the job was killed while writing it): it is removed, and its request runs again."""
    done: dict[int, str | None] = {}
    if not os.path.exists(out_path):
        return done
    with open(out_path, "rb+") as f:
        end = 0
        for k, line in enumerate(f, 1):
            if not line.endswith(b"\n"):
                break
            try:
                result = json.loads(line)
                done[line_number(result)] = result["custom_id"]
            except (ValueError, KeyError, TypeError, AttributeError):
                raise PyllmError(f"{out_path}, line {k}: not a result line of pyllm batch") from None
            end += len(line)
        f.truncate(end)
    return done


def pending_entries(in_path: str, done: dict[int, str | None]) -> tuple[list[Entry], int]:
    """(the entries of IN that OUT does not answer yet, how many IN holds in all); OUT must answer
    requests of this IN: the same custom_id at each line number it answers."""
    with open(in_path, "rb") as f:  # a line that is not UTF-8 is an invalid_json_line, not altered
        entries = list(read_entries(f))
    numbers = {e.number: e.custom_id for e in entries}
    for number, custom_id in done.items():
        if numbers.get(number, "") != custom_id:
            raise PyllmError(f"the results already in OUT are not those of {in_path} (batch_req_{number} is "
                             f"{custom_id!r} there): give another OUT, or remove it to start again")
    return [e for e in entries if e.number not in done], len(entries)


def run_file(in_path: str, out_path: str, results, progress: bool = True) -> int:
    """Answers the requests of IN that OUT lacks, appending each result to OUT as it finishes.
    results(entries) yields their result lines (a Runner's run, or Ray's). Returns how many were run."""
    done = read_done(out_path)
    todo, total = pending_entries(in_path, done)
    bar = Progress(total, len(done)) if progress else None
    written = set()
    try:
        with open(out_path, "ab") as out:
            for result in results(todo):
                number = line_number(result)
                if number in written:  # a retried task's second answer: one line per request
                    continue
                written.add(number)
                out.write(json.dumps(result).encode() + b"\n")  # ASCII: any custom_id can be written
                out.flush()
                if bar is not None:
                    bar.update(result)
    finally:
        if bar is not None:
            bar.close()
    missing = len(todo) - len(written)
    if missing:
        raise PyllmError(f"{missing} requests got no result (run the same command again to run them)")
    return len(todo)
