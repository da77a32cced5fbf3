"""`pyllm serve`: OpenAI's HTTP API over one model, its generations batched by the Scheduler.

    GET  /v1/models             the one model served
    POST /v1/completions        prompt: a str, a list of str, token ids or a list of token-id lists
    POST /v1/chat/completions   rendered with the model's chat template, as Model.chat does
    POST /v1/embeddings         Model.embed: mean pooling, unit length; float or base64
    GET  /health                {"status", "model", "active", "queued", "slots"}; never needs the key

Requests are validated by the pydantic models of server_api.py; every error has OpenAI's shape
{"error": {"message", "type", "param", "code"}}. The scheduler calls back on its own thread; each
request hands its events to the event loop through an asyncio.Queue, and a request that goes away
(a closed stream, a client that disconnects while waiting) cancels its jobs, freeing their slots.

One client must not stall the others: a body is read up to max_body bytes (413 past it); parsing,
template rendering, tokenizing and detokenizing run on worker threads, never on the event loop;
a text longer than the context could hold is refused before it is tokenized; embedding inputs wait
in the scheduler's queue like generations; a connection gets request_timeout seconds to send each
request (serve). At SIGTERM or SIGINT (serve) the server takes no new requests, lets the running
ones finish for shutdown_grace seconds and answers the rest with a 503.

>>> app = create_app(pyllm.load("smollm2"), "smollm2")  # doctest: +SKIP
>>> uvicorn.run(app, host="127.0.0.1", port=8000)  # doctest: +SKIP
"""
from __future__ import annotations

import asyncio
import base64
import hmac
import ipaddress
import json
import logging
import os
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from sse_starlette import EventSourceResponse
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from . import _core, constraints, hub
from .chat import ChatMessageError, ChatTemplateError
from .checks import check_text
from .constraints import output_grammar
from .errors import ContextLengthError, PyllmError, QueueFullError
from .generation import StopMatcher
from .sampling import SamplingParams, SamplingParamsError
from .scheduler import Embedded, Failed, Finished, Piece, Scheduler
from .server_api import ChatRequest, CompletionRequest, EmbeddingRequest, Sampling
from .tool_calls import (CallStream, ToolFormat, call_messages, calls_grammar, parse_calls, template_format,
                         template_message)

DISCONNECT_POLL_S = 0.5  # how often a request waiting for a whole answer checks that its client is there
MAX_BODY_BYTES = 8 * 2**20  # a request body larger than this is refused (413) before it is read
TRIM_AFTER_BYTES = 2**20  # after a body this large, the C heap's free pages go back to the system
REQUEST_TIMEOUT_S = 30.0  # the time a connection has to send a whole request, head and body (serve)
MAX_CONNECTIONS = 256  # connections and requests at once; more are answered 503 (serve)
SHUTDOWN_GRACE_S = 10.0  # how long requests in flight may run on after SIGTERM (serve)
TEXT_THREADS = 8  # worker threads for parsing, rendering and tokenizing (a slow template holds one)
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")
GIL_SWITCH_S = 0.001  # the Host names a server bound to loopback accepts

log = logging.getLogger("pyllm.server")


class APIError(Exception):
    """An error to answer in OpenAI's shape."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)


def model_names(source: str, path: str) -> set[str]:
    """The names a request may give for the served model: the name it was started with, the file
    or folder it loaded (full path and base name, with and without .gguf), and every alias of
    the same file."""
    names = {source, path, os.path.basename(path.rstrip("/"))}
    names |= {n[:-5] for n in names if n.endswith(".gguf")}
    package = hub.ALIASES.get(source.lower())
    names |= {a for a, p in hub.ALIASES.items() if package is not None and p == package}
    if package is None:
        names |= {a for a, p in hub.ALIASES.items() if hub.cached_path(p) == path}
    return names


def served_id(source: str) -> str:
    """The id /v1/models lists: the alias or Hugging Face id as given, a path's base name."""
    path = os.path.expanduser(source)
    return os.path.basename(path.rstrip("/")) if os.path.exists(path) else source


def _now() -> int:
    return int(time.time())


def _usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def _context_error(e: ContextLengthError, param: str) -> APIError:
    return APIError(400, str(e), param, "context_length_exceeded")


def shutting_down() -> APIError:
    return APIError(503, "The server is shutting down; retry on another instance or once it is back.",
                    code="server_shutting_down", type="server_error")


def internal_error() -> APIError:
    """The 500 a client sees: the exception's text stays in the server's log."""
    return APIError(500, "The server had an error while processing your request.", type="server_error")


def longest_token(tokenizer) -> int:
    """The most characters one token can stand for: the longest entry of the vocabulary (a token's
    text is at least as long in the vocabulary as in the text it decodes to: "Ġthe", "▁the",
    "<0x0A>")."""
    return max(map(len, tokenizer.hf.get_vocab(with_added_tokens=True)), default=1)


class Job:
    """One choice of a request: its prompt and the scheduler's job generating it (handle)."""

    def __init__(self, index: int, prompt: int, prompt_ids: list[int], prompt_text: str | None):
        self.index = index  # the choice's index in the response
        self.prompt = prompt  # which of the request's prompts
        self.prompt_ids = prompt_ids
        self.prompt_text = prompt_text  # for completions' text_offset
        self.handle = None


class Mailbox:
    """Events from the scheduler's thread to the requests' queues on the event loop. A step emits a
    token for every running job; posting each with call_soon_threadsafe would wake the loop once per
    token, so posts made while a delivery is pending join it: one wake-up per step under load."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self._lock = threading.Lock()
        self._items: list = []

    def post(self, queue: asyncio.Queue, item) -> None:
        """Called on any thread; item reaches queue (put_nowait) on the loop."""
        with self._lock:
            self._items.append((queue, item))
            if len(self._items) > 1:
                return  # the delivery scheduled by the first post takes this one too
        try:
            self.loop.call_soon_threadsafe(self._deliver)
        except RuntimeError:  # the loop has closed: the server is shutting down
            with self._lock:
                self._items.clear()

    def _deliver(self) -> None:
        with self._lock:
            items, self._items = self._items, []
        for queue, item in items:
            queue.put_nowait(item)


class Server:
    """The app's state: the model, its scheduler and the names it answers to."""

    def __init__(self, model, source: str, max_queue: int = 64, max_body: int = MAX_BODY_BYTES,
                 shutdown_grace: float = SHUTDOWN_GRACE_S, chat_template: str | None = None):
        self.model = model
        self.chat_template = chat_template  # replaces the model's own (pyllm serve --chat-template)
        self.id = served_id(source)
        self.names = model_names(source, model.source) | {self.id}
        self.created = _now()
        self.scheduler = Scheduler(model, max_queue=max_queue)
        self.max_body = max_body
        self.shutdown_grace = shutdown_grace
        self.max_chars = model.n_ctx * longest_token(model.tokenizer)  # longer texts cannot fit
        self.text_threads = ThreadPoolExecutor(TEXT_THREADS, thread_name_prefix="pyllm-text")
        self.draining = False
        self.loop: asyncio.AbstractEventLoop | None = None
        self._drain_task: asyncio.Task | None = None
        self._mailbox: Mailbox | None = None

    @property
    def capacity(self) -> int:
        """The most jobs the scheduler can hold at once: every slot running and a full queue."""
        return self.scheduler.slots + self.scheduler.max_queue

    async def off_loop(self, fn, *args):
        """fn(*args) on a worker thread, so that the event loop goes on answering other clients."""
        return await asyncio.get_running_loop().run_in_executor(self.text_threads, fn, *args)

    async def parse(self, request: Request, kind):
        """The request body as a kind (a pydantic model), read and parsed off the event loop."""
        if self.draining:
            raise shutting_down()
        return await self.off_loop(parse_body, await read_body(request, self.max_body), kind, self.model.n_ctx)

    # ---- shutdown -----------------------------------------------------------------------------

    def begin_shutdown(self) -> None:
        """Called from a signal handler (on the loop's thread, between two callbacks): stop taking
        requests, and fail what is left once shutdown_grace has passed."""
        if self.loop is not None and self._drain_task is None:
            self.draining = True
            self._drain_task = self.loop.create_task(self._drain())

    async def _drain(self) -> None:
        deadline = time.monotonic() + self.shutdown_grace
        engine = self.scheduler.engine
        while engine.busy() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.wrap_future(self.scheduler.call(lambda: engine.fail_all(shutting_down())))

    def check_model(self, name: str) -> None:
        if name not in self.names:
            raise APIError(404, f"The model {name!r} does not exist: this server runs {self.id!r}",
                           "model", "model_not_found")

    # ---- settings -----------------------------------------------------------------------------

    def sampling(self, req: Sampling, choice: int) -> SamplingParams:
        """The request's sampling settings; with a seed, choice i of n samples with seed + i."""
        bias = None
        if req.logit_bias is not None:
            try:
                bias = {int(k): v for k, v in req.logit_bias.items()}
            except ValueError:
                raise APIError(400, "logit_bias keys must be token ids (integers as strings)", "logit_bias",
                               "invalid_value") from None
        try:
            params = SamplingParams(
                temperature=req.temperature, top_k=req.top_k, top_p=req.top_p, min_p=req.min_p,
                repetition_penalty=req.repetition_penalty, presence_penalty=req.presence_penalty,
                frequency_penalty=req.frequency_penalty, logit_bias=bias,
                seed=None if req.seed is None else req.seed + choice)
            params.validate(self.model.vocab_size)
        except SamplingParamsError as e:
            raise APIError(400, str(e), str(e).split()[0], "invalid_value") from None
        return params

    @staticmethod
    def stops(req: Sampling) -> list[str] | None:
        stop = [req.stop] if isinstance(req.stop, str) else req.stop
        try:
            for s in stop or []:
                check_text(s, "stop")
            StopMatcher(stop)
        except ValueError as e:
            raise APIError(400, str(e), "stop", "invalid_value") from None
        return stop or None

    def check_length(self, chars: int, param: str) -> None:
        """A 400 for text too long for the context to hold, before it is rendered or tokenized (50 MB
        of text takes the tokenizer most of a minute and gigabytes)."""
        if chars > self.max_chars:
            n_ctx = self.model.n_ctx
            has = "have" if param == "messages" else "has"  # "the messages have", "the prompt has"
            raise APIError(400, f"This model's maximum context length is {n_ctx} tokens, but the {param} {has} "
                                f"{chars} characters: more than {n_ctx} tokens of at most "
                                f"{self.max_chars // n_ctx} characters each can hold", param,
                           "context_length_exceeded")

    def tokenize(self, text: str, param: str, add_special: bool = True) -> list[int]:
        self.check_length(len(text), param)
        try:
            return self.model.tokenize(text, add_special=add_special)
        except ValueError as e:  # a lone surrogate ("\ud800" in the JSON) is not text
            raise APIError(400, str(e), param, "invalid_value") from None

    def token_ids(self, ids: list[int], param: str) -> list[int]:
        self.check_fits(ids, param)  # before looking at 2M ids one by one
        for i in ids:
            if i >= self.model.vocab_size:
                raise APIError(400, f"token id {i} is outside the vocabulary [0, {self.model.vocab_size})",
                               param, "invalid_value")
        return ids

    def check_fits(self, ids: list[int], param: str) -> None:
        has = "make" if param == "messages" else "has"  # "the messages make", "the prompt has"
        if not ids:
            raise APIError(400, f"the {param} {has} no tokens", param, "invalid_value")
        if len(ids) > self.model.n_ctx:
            raise APIError(400, f"This model's maximum context length is {self.model.n_ctx} tokens, but the "
                                f"{param} {has} {len(ids)} tokens", param, "context_length_exceeded")

    def check_room(self, prompt_tokens: int, max_tokens: int, param: str) -> None:
        """OpenAI's 400 when the prompt and max_tokens together exceed the context."""
        n_ctx = self.model.n_ctx
        if prompt_tokens + max_tokens > n_ctx:
            raise APIError(400, f"This model's maximum context length is {n_ctx} tokens. However, you requested "
                                f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the {param}, {max_tokens} "
                                f"in the completion). Please reduce the length of the {param} or completion.",
                           param, "context_length_exceeded")

    def check_capacity(self, jobs: int, param: str) -> None:
        """A 400, not a 429, for a request that no amount of waiting would let in."""
        if jobs > self.capacity:
            raise APIError(400, f"This request needs {jobs} jobs at once, but this server holds at most "
                                f"{self.capacity} ({self.scheduler.slots} running, {self.scheduler.max_queue} "
                                f"waiting); split it into smaller requests", param, "invalid_value")

    # ---- running jobs ---------------------------------------------------------------------------

    def submit(self, jobs: list[Job], req: Sampling, max_tokens: int, logprobs: int | None,
               events: asyncio.Queue, grammar: str | None = None) -> None:
        """Submits every job, or none: a full queue or a refused job cancels those already in."""
        stop = self.stops(req)
        settings = [self.sampling(req, j.index % req.n) for j in jobs]
        self.check_capacity(len(jobs), "n" if req.n > 1 else "prompt")
        self.enqueue(jobs, events, lambda job, sampling, on_event: self.scheduler.submit(
            job.prompt_ids, sampling=sampling, max_tokens=max_tokens, stop=stop, logprobs=logprobs,
            on_event=on_event, grammar=grammar), settings)

    def enqueue(self, jobs: list, events: asyncio.Queue, start, settings: list) -> None:
        """job.handle = start(job, setting, on_event) for every job, or none: a full queue or a
        refused job cancels those already in (at once: their places are free for the next request)."""
        if self.draining:
            raise shutting_down()
        mailbox = self.mailbox(asyncio.get_running_loop())

        def deliver(job):
            def on_event(event) -> None:  # on the scheduler's thread
                mailbox.post(events, (job, event))
            return on_event

        try:
            for job, setting in zip(jobs, settings):
                job.handle = start(job, setting, deliver(job))
        except BaseException as e:
            self.cancel(jobs)
            if isinstance(e, QueueFullError):
                slots = self.scheduler.slots
                raise APIError(429, f"The server is busy: {self.scheduler.queued} requests are waiting for "
                                    f"{'its one slot' if slots == 1 else f'one of its {slots} slots'}. "
                                    f"Retry later.",
                               None, "queue_full", "rate_limit_error") from None
            if isinstance(e, ContextLengthError):
                raise _context_error(e, "prompt") from None
            if isinstance(e, ValueError):
                raise APIError(400, str(e), None, "invalid_value") from None
            raise

    def mailbox(self, loop: asyncio.AbstractEventLoop) -> "Mailbox":
        if self._mailbox is None or self._mailbox.loop is not loop:
            self._mailbox = Mailbox(loop)
        return self._mailbox

    def cancel(self, jobs: list[Job]) -> None:
        for job in jobs:
            if job.handle is not None:
                self.scheduler.cancel(job.handle)

    async def results(self, request: Request, jobs: list, events: asyncio.Queue) -> dict:
        """job -> its Completion (or an embedding's vector), once every job has finished; a client
        that goes away meanwhile cancels them all (the answer, 499, goes nowhere)."""
        done: dict = {}
        checked = time.monotonic()
        try:
            while len(done) < len(jobs):
                try:
                    job, event = await asyncio.wait_for(events.get(), DISCONNECT_POLL_S)
                except asyncio.TimeoutError:
                    job = event = None
                if time.monotonic() - checked >= DISCONNECT_POLL_S:
                    checked = time.monotonic()
                    if await request.is_disconnected():
                        raise APIError(499, "the client closed the connection", code="client_closed")
                if isinstance(event, Finished):
                    done[job] = event.completion
                elif isinstance(event, Embedded):
                    done[job] = event.vector
                elif isinstance(event, Failed):
                    raise event.error
        finally:
            if len(done) < len(jobs):
                self.cancel(jobs)
        return done


async def read_body(request: Request, limit: int) -> bytearray:
    """The request's body, refused with a 413 as soon as it is known to be longer than limit."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise body_too_large(limit)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise body_too_large(limit)
    return body


def _check_id_lists(given, param: str, n_ctx: int) -> None:
    """A 400 for a list of token ids (or of such lists) with one longer than n_ctx: 2M ids take
    pydantic a second of the GIL to validate."""
    if not isinstance(given, list):
        return
    for ids in given if given and isinstance(given[0], list) else [given]:
        if isinstance(ids, list) and len(ids) > n_ctx:
            raise APIError(400, f"This model's maximum context length is {n_ctx} tokens, but the {param} has "
                                f"{len(ids)} tokens", param, "context_length_exceeded")


def body_too_large(limit: int) -> APIError:
    return APIError(413, f"The request body is larger than this server accepts ({limit} bytes); "
                         f"send less, or start pyllm serve with a larger --max-body-mb", None, "request_too_large")


def parse_body(body: bytearray, kind, n_ctx: int):
    """body as a kind (a pydantic model); JSON that cannot be read (not UTF-8, nested too deep,
    an integer of thousands of digits) is a 400 invalid_json, token ids longer than the context a
    400 before they are validated one by one. Runs on a worker thread."""
    try:
        data = json.loads(body)
    except RecursionError:
        raise APIError(400, "We could not parse the JSON body of your request: it is nested too deeply",
                       None, "invalid_json") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, an int past Python's digit limit
        raise APIError(400, f"We could not parse the JSON body of your request: {e}", None,
                       "invalid_json") from None
    if isinstance(data, dict):
        for param in ("prompt", "input"):
            _check_id_lists(data.get(param), param, n_ctx)
    try:
        return kind.model_validate(data)
    except ValidationError as e:
        raise validation_error(e.errors()) from None
    except RecursionError:
        raise APIError(400, "the request body is nested too deeply", None, "invalid_value") from None


# ---- response shapes -------------------------------------------------------------------------------


def _token_bytes(token: str) -> list[int]:
    return list(token.encode("utf-8"))


def chat_logprobs(entries: list[dict]) -> dict:
    def one(e: dict) -> dict:
        return {"token": e["token"], "logprob": e["logprob"], "bytes": _token_bytes(e["token"])}

    return {"content": [{**one(e), "top_logprobs": [one(t) for t in e["top_logprobs"]]} for e in entries],
            "refusal": None}


def completion_logprobs(entries: list[dict], offset: int) -> dict:
    """OpenAI's legacy logprobs; text_offset counts characters from the start of the prompt."""
    offsets = []
    for e in entries:
        offsets.append(offset)
        offset += len(e["token"])
    return {"tokens": [e["token"] for e in entries], "token_logprobs": [e["logprob"] for e in entries],
            "top_logprobs": [{t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in entries],
            "text_offset": offsets}


def _json(data: dict) -> str:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


# ---- the app ---------------------------------------------------------------------------------------


def create_app(model, source: str, *, api_key: str | None = None, max_queue: int = 64,
               max_body: int = MAX_BODY_BYTES, allowed_hosts=LOCAL_HOSTS,
               shutdown_grace: float = SHUTDOWN_GRACE_S, chat_template: str | None = None) -> FastAPI:
    """The FastAPI app serving model under the name source (an alias, id or path). It answers
    requests whose Host header names one of allowed_hosts (None: any), bodies up to max_body bytes,
    and lets requests run on for shutdown_grace seconds after serve() gets SIGTERM or SIGINT;
    chat_template replaces the model's own for chat requests."""
    server = Server(model, source, max_queue, max_body, shutdown_grace, chat_template)

    @asynccontextmanager
    async def lifespan(app):
        server.loop = asyncio.get_running_loop()
        server.scheduler.start()
        try:
            yield
        finally:
            server.scheduler.close()
            server.text_threads.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="pyllm", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = server

    @app.exception_handler(APIError)
    async def api_error(request, e: APIError):
        return e.response()

    @app.exception_handler(HTTPException)
    async def http_error(request, e: HTTPException):
        return APIError(e.status_code, str(e.detail), code=None).response()

    @app.exception_handler(ClientDisconnect)
    async def gone(request, e: ClientDisconnect):
        return APIError(499, "the client closed the connection", code="client_closed").response()

    @app.exception_handler(Exception)
    async def crashed(request, e: Exception):
        return internal_error().response()

    app.add_middleware(Guard, api_key=api_key, allowed_hosts=allowed_hosts)

    @app.get("/health")
    async def health():
        s = server.scheduler
        body = {"status": "shutting_down" if server.draining else "ok", "model": server.id, "active": s.active,
                "queued": s.queued, "slots": s.slots}
        return JSONResponse(body, status_code=503 if server.draining else 200)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [_model_card(server)]}

    @app.get("/v1/models/{name:path}")
    async def model_card(name: str):
        server.check_model(name)
        return _model_card(server)

    @app.post("/v1/completions")
    async def completions(request: Request):
        req = await server.parse(request, CompletionRequest)
        server.check_model(req.model)
        server.check_capacity(len(req.prompt if _is_list_of_prompts(req.prompt) else [0]) * req.n,
                              "n" if req.n > 1 else "prompt")
        prompts = await server.off_loop(_prompts, server, req.prompt)
        if req.max_tokens is not None:
            for ids, _ in prompts:
                server.check_room(len(ids), req.max_tokens, "prompt")
        jobs = [Job(p * req.n + i, p, ids, text) for p, (ids, text) in enumerate(prompts) for i in range(req.n)]
        max_tokens = 16 if req.max_tokens is None else req.max_tokens  # as OpenAI; the context's end may cut it
        output = Output(_format_grammar(req.response_format))
        return await _respond(server, request, req, jobs, max_tokens, req.logprobs, "text_completion", output)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        req = await server.parse(request, ChatRequest)
        server.check_model(req.model)
        ids, output = await server.off_loop(_chat_prompt, server, req)
        jobs = [Job(i, 0, ids, None) for i in range(req.n)]
        limit = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        if limit is not None:
            server.check_room(len(ids), limit, "messages")
        max_tokens = model.n_ctx - len(ids) if limit is None else limit
        if req.top_logprobs is not None and not req.logprobs:
            raise APIError(400, "top_logprobs needs logprobs set to true", "top_logprobs", "invalid_value")
        logprobs = (req.top_logprobs or 0) if req.logprobs else None
        return await _respond(server, request, req, jobs, max_tokens, logprobs, "chat.completion", output)

    @app.post("/v1/embeddings")
    async def embeddings(request: Request):
        req = await server.parse(request, EmbeddingRequest)
        server.check_model(req.model)
        if req.dimensions is not None and req.dimensions != model.spec.dim:
            raise APIError(400, f"dimensions: this model's embeddings have {model.spec.dim}; pyllm serve does "
                                f"not shorten them", "dimensions", "invalid_value")
        given = req.input if _is_list_of_prompts(req.input) else [req.input]
        if len(given) > server.scheduler.max_queue:  # every input waits in the queue; more can never fit
            raise APIError(400, f"This request has {len(given)} inputs, but this server queues at most "
                                f"{server.scheduler.max_queue}; split it into smaller requests", "input",
                           "invalid_value")
        inputs = await server.off_loop(_embedding_inputs, server, given)
        jobs = [Job(i, i, ids, None) for i, ids in enumerate(inputs)]
        events: asyncio.Queue = asyncio.Queue()
        server.enqueue(jobs, events, lambda job, _, on_event: server.scheduler.submit_embedding(
            job.prompt_ids, on_event=on_event), [None] * len(jobs))
        done = await server.results(request, jobs, events)
        data = []
        for job in jobs:
            v = done[job]
            value = (base64.b64encode(v.astype("<f4").tobytes()).decode() if req.encoding_format == "base64"
                     else v.tolist())
            data.append({"object": "embedding", "index": job.index, "embedding": value})
        n = sum(len(ids) for ids in inputs)
        return {"object": "list", "data": data, "model": server.id,
                "usage": {"prompt_tokens": n, "total_tokens": n}}

    return app


class Guard:
    """The checks every request passes before the app sees it (a plain ASGI middleware: Starlette's
    BaseHTTPMiddleware would hide a client's disconnect from the handlers):
    - its Host header names an allowed host (a web page whose name was rebound to 127.0.0.1 sends
      its own name, and is refused);
    - with an API key, `Authorization: Bearer KEY` (the scheme in any case), except for /health;
    - after a large body, the heap's free pages go back to the system once the answer is sent."""

    def __init__(self, app, api_key: str | None, allowed_hosts):
        self.app = app
        self.key = api_key.encode() if api_key is not None else None
        self.hosts = None if allowed_hosts is None else {h.lower().strip("[]") for h in allowed_hosts}

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        refusal = self.refusal(scope["path"], headers)
        if refusal is not None:
            return await refusal.response()(scope, receive, send)
        size = 0

        async def counted():
            nonlocal size
            message = await receive()
            size += len(message.get("body", b""))
            return message

        try:
            await self.app(scope, counted, send)
        finally:
            if size >= TRIM_AFTER_BYTES:
                await asyncio.get_running_loop().run_in_executor(None, _core.trim_heap)

    def refusal(self, path: str, headers: dict) -> APIError | None:
        host = host_name(headers.get(b"host", b"").decode("latin-1"))
        if self.hosts is not None and host not in self.hosts:
            return APIError(400, f"This server does not answer for the host {host!r} (start pyllm serve with "
                                 f"--allowed-hosts to add it)", None, "invalid_host")
        if self.key is None or path == "/health":
            return None
        scheme, _, given = headers.get(b"authorization", b"").strip().partition(b" ")
        if scheme.lower() != b"bearer" or not hmac.compare_digest(given.strip(), self.key):
            what = "no API key was given" if not scheme else "the API key is not valid"
            return APIError(401, f"Incorrect API key: {what} (send Authorization: Bearer KEY)",
                            code="invalid_api_key")
        return None


def host_name(host: str) -> str:
    """The name a Host header gives, without its port: "[::1]:8000" -> "::1"."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    return host.rpartition(":")[0] if host.count(":") == 1 else host.rstrip(".")


def allowed_hosts_for(bind: str, given: list[str] | None):
    """The Host names a server bound to bind answers: given ("*": any), else the localhost names when
    bind is a loopback address, else any (a server bound to every address cannot know its names)."""
    if given:
        return None if "*" in given else tuple(given)
    try:
        loopback = bind == "localhost" or ipaddress.ip_address(bind).is_loopback
    except ValueError:
        loopback = False
    return LOCAL_HOSTS if loopback else None


def _model_card(server: Server) -> dict:
    return {"id": server.id, "object": "model", "created": server.created, "owned_by": "pyllm"}


def _content_part_error(errors) -> APIError | None:
    """A chat content part of a type other than text (an image, audio, a file), said plainly rather
    than as pydantic's account of each form of content it is not."""
    for e in errors:
        loc = [x for x in e["loc"] if x != "body"]
        if (len(loc) == 6 and loc[0] == "messages" and loc[2] == "content" and loc[5] == "type"
                and e["type"] == "literal_error"):
            return APIError(400, f"messages[{loc[1]}].content[{loc[4]}] is a part of type {e['input']!r}: this "
                                 f"server runs a text-only model, whose messages hold text (a string, or "
                                 f"parts of type 'text')", "messages", "invalid_value")
    return None


def validation_error(errors) -> APIError:
    """pydantic's errors as one 400 naming the first parameter at fault."""
    part = _content_part_error(errors)
    if part is not None:
        return part
    first = errors[0]
    if first["type"] == "json_invalid":
        return APIError(400, "We could not parse the JSON body of your request: "
                             f"{first.get('ctx', {}).get('error', 'invalid JSON')}", None, "invalid_json")
    loc = [str(x) for x in first["loc"] if x != "body"]
    ctx = first.get("ctx") or {}
    param = ctx.get("param") or (loc[0] if loc else None)
    if first["type"] in ("unsupported", "unknown"):
        return APIError(400, first["msg"], param, first["type"] == "unsupported" and "unsupported_parameter"
                        or "unknown_parameter")
    if not loc and ctx.get("param"):  # a check across fields, naming the parameter at fault
        return APIError(400, first["msg"], param, "invalid_value")
    if not loc:
        return APIError(400, f"the request body must be a JSON object: {first['msg']}", None, "invalid_type")
    same = [e for e in errors if [str(x) for x in e["loc"] if x != "body"][:1] == loc[:1]]
    reasons = list(dict.fromkeys(e["msg"] for e in same))
    where = ".".join(loc)
    return APIError(400, f"Invalid value for '{where}': {'; or '.join(reasons)}", param, "invalid_value")


def _is_list_of_prompts(prompt) -> bool:
    """Whether a prompt or input field holds several (a list of texts or of token-id lists)."""
    return isinstance(prompt, list) and not isinstance(prompt[0], int)


def _prompts(server: Server, prompt) -> list[tuple[list[int], str]]:
    """(token ids, text) of each prompt a completions request holds. Runs on a worker thread."""
    out = []
    for p in prompt if _is_list_of_prompts(prompt) else [prompt]:
        if isinstance(p, str):
            ids, text = server.tokenize(p, "prompt"), p
        else:
            ids = server.token_ids(p, "prompt")
            text = server.model.tokenizer.decode(ids)
        server.check_fits(ids, "prompt")
        out.append((ids, text))
    return out


def _chat_prompt(server: Server, req: ChatRequest) -> tuple[list[int], "Output"]:
    """The token ids of the messages (and tools) rendered by the chat template, and what the reply
    is constrained to. Runs on a worker thread."""
    template = server.chat_template or server.model.tokenizer.chat_template
    if not template:
        raise APIError(400, f"the model {server.id} has no chat template, so chat messages cannot be "
                            f"rendered: send a prompt to /v1/completions, or start the server with "
                            f"`pyllm serve --chat-template FILE`", "messages", "invalid_value")
    output = _chat_output(server.model, template, req)
    messages = [template_message(m.as_dict()) for m in req.messages]
    server.check_length(sum(len(m.get("content") or "") for m in messages), "messages")
    try:  # the messages' contents are text, as in Model.chat: no forged turns
        tools = server.model.tokenizer.shield(output.tools)
        ids = server.model.chat_ids(messages, template, tools=output.tools,
                                    prepare=lambda shielded: call_messages(shielded, output.template_format, tools))
    except (ChatTemplateError, ChatMessageError, ValueError) as e:  # ValueError: a lone surrogate, TokenizerError
        raise APIError(400, str(e), "messages", "invalid_value") from None
    server.check_fits(ids, "messages")
    return ids, output


def _embedding_inputs(server: Server, given: list) -> list[list[int]]:
    """The token ids of each input. Runs on a worker thread."""
    inputs = [server.tokenize(x, "input") if isinstance(x, str) else server.token_ids(x, "input") for x in given]
    for ids in inputs:
        server.check_fits(ids, "input")
    return inputs


class Output:
    """What a request constrains its reply to (llguidance's grammar, or None) and, when it gives
    tools, the template's call format: to parse the reply's calls back out of (calls: None when
    tool_choice is "none") and to write the tools and earlier calls into the messages."""

    def __init__(self, grammar: str | None, tools: list[dict] | None = None, calls: ToolFormat | None = None,
                 template_format: ToolFormat | None = None):
        self.grammar = grammar
        self.tools = tools
        self.calls = calls
        self.template_format = template_format or calls

    def message(self, completion) -> tuple[dict, str]:
        """The chat reply's message and finish_reason: parsed tool calls end it with "tool_calls"."""
        content, calls = (parse_calls(completion.text, self.calls) if self.calls is not None
                          else (completion.text, []))
        message = {"role": "assistant", "content": content, "refusal": None}
        if not calls:
            return message, completion.finish_reason
        return {**message, "tool_calls": calls}, "tool_calls"


def _format_grammar(response_format) -> str | None:
    """The grammar of a response_format (None for text)."""
    schema = response_format.schema() if response_format is not None else None
    if schema is None:
        return None
    try:
        return output_grammar(json_schema=schema)
    except (ValueError, PyllmError) as e:
        raise APIError(400, f"response_format: {e}", "response_format", "invalid_value") from None


def _chat_output(model, template: str, req: ChatRequest) -> Output:
    """A chat request's constraint: its tools in the call format of the model's template, or its
    response_format (also beside tools that tool_choice "none" keeps from being called)."""
    if not req.tools:
        return Output(_format_grammar(req.response_format))
    tools = [t.model_dump(exclude_none=True) for t in req.tools]
    choice = req.tool_choice.model_dump() if hasattr(req.tool_choice, "model_dump") else req.tool_choice or "auto"
    try:
        fmt = template_format(template, model.tokenizer)
        grammar = calls_grammar(tools, fmt, choice, req.parallel_tool_calls)
    except (ValueError, PyllmError) as e:
        raise APIError(400, str(e), "tools", "invalid_value") from None
    if choice == "none":
        return Output(_format_grammar(req.response_format), tools, template_format=fmt)
    return Output(grammar, tools, fmt)


async def _respond(server: Server, request: Request, req: Sampling, jobs: list[Job], max_tokens: int,
                   logprobs: int | None, kind: str, output: Output):
    events: asyncio.Queue = asyncio.Queue()
    if output.grammar is not None:  # seconds the first time: not on the event loop
        await asyncio.to_thread(constraints.prepare, server.model)
    server.submit(jobs, req, max_tokens, logprobs, events, output.grammar)
    rid = ("chatcmpl-" if kind == "chat.completion" else "cmpl-") + uuid.uuid4().hex
    created = _now()
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        # at shutdown, sse-starlette would cut the stream at once: the stream ends itself (503 event)
        return EventSourceResponse(_stream(server, jobs, events, rid, created, kind, logprobs is not None,
                                           include_usage, output), ping=15,
                                   shutdown_grace_period=server.shutdown_grace + 5)
    try:
        done = await server.results(request, jobs, events)
    except ContextLengthError as e:
        raise _context_error(e, "prompt") from None
    choices = []
    for job in jobs:
        c = done[job]
        if kind == "chat.completion":
            message, finish_reason = output.message(c)
            choices.append({"index": job.index, "message": message,
                            "logprobs": chat_logprobs(c.logprobs) if logprobs is not None else None,
                            "finish_reason": finish_reason})
        else:
            choices.append({"index": job.index, "text": c.text, "finish_reason": c.finish_reason,
                            "logprobs": (completion_logprobs(c.logprobs, len(job.prompt_text))
                                         if logprobs is not None else None)})
    return {"id": rid, "object": kind, "created": created, "model": server.id, "choices": choices,
            "usage": _request_usage(jobs, done), "system_fingerprint": None}


def _request_usage(jobs: list[Job], done: dict) -> dict:
    """A request's usage: each prompt counted once (its n choices share it), every choice's tokens."""
    prompts = {job.prompt: len(job.prompt_ids) for job in jobs}
    usage = _usage(sum(prompts.values()), sum(len(done[job].token_ids) for job in jobs))
    predicted = [done[job].usage["completion_tokens_details"] for job in jobs
                 if "completion_tokens_details" in done[job].usage]  # speculative decoding's counts
    if predicted:
        usage["completion_tokens_details"] = {k: sum(p[k] for p in predicted) for k in predicted[0]}
    return usage


async def _stream(server: Server, jobs: list[Job], events: asyncio.Queue, rid: str, created: int, kind: str,
                  want_logprobs: bool, include_usage: bool, output: Output):
    """Server-sent events of one request: chunks as text arrives, a last chunk per choice with its
    finish_reason, the usage chunk if asked for, then [DONE]. Closing the stream cancels the jobs.
    A reply that may call tools is held while it may still be calls: once it is free text it
    streams as any other; once it is calls, as delta.tool_calls chunks (each call's id and name,
    then its arguments piece by piece)."""
    chat = kind == "chat.completion"
    obj = "chat.completion.chunk" if chat else "text_completion"
    pending = {job: [] for job in jobs}  # logprob entries not yet sent
    held = {job: "" for job in jobs} if output.calls is not None else {}  # replies that may be calls
    calls: dict[Job, CallStream] = {}  # replies that are calls
    offsets = {job: len(job.prompt_text or "") for job in jobs}

    def chunk(job: Job, text: str | None, finish: str | None, entries: list[dict] | None) -> dict:
        lp = None
        if entries is not None:
            if chat:
                lp = chat_logprobs(entries)
            else:
                lp = completion_logprobs(entries, offsets[job])
                offsets[job] += sum(len(e["token"]) for e in entries)
        if chat:
            delta = {} if text is None else {"content": text}
            choice = {"index": job.index, "delta": delta, "logprobs": lp, "finish_reason": finish}
        else:
            choice = {"index": job.index, "text": text or "", "logprobs": lp, "finish_reason": finish}
        out = {"id": rid, "object": obj, "created": created, "model": server.id, "choices": [choice],
               "system_fingerprint": None}
        if include_usage:
            out["usage"] = None
        return out

    done: dict = {}
    try:
        if chat:
            for job in jobs:
                first = chunk(job, "", None, None)
                first["choices"][0]["delta"] = {"role": "assistant", "content": ""}
                yield {"data": _json(first)}
        while len(done) < len(jobs):
            job, event = await events.get()
            if isinstance(event, Piece):
                if event.logprob is not None:
                    pending[job].append(event.logprob)
                text = event.text
                if job in held:
                    held[job] += text
                    if held[job].startswith(output.calls.marker):
                        parts = calls.setdefault(job, CallStream(output.calls)).deltas(held[job])
                        for part in parts:
                            yield {"data": _json(_delta_chunk(chunk(job, "", None, None), {"tool_calls": [part]}))}
                    if output.calls.may_call(held[job]):
                        continue
                    text = held.pop(job)  # free text: sent from here on as it comes
                if text:
                    entries, pending[job] = pending[job], []
                    yield {"data": _json(chunk(job, text, None, entries if want_logprobs else None))}
            elif isinstance(event, Finished):
                done[job] = event.completion
                entries, pending[job] = pending[job], []
                finish_reason = event.completion.finish_reason
                if job in held:  # calls sent as they came, or text held back until its end
                    message, finish_reason = output.message(event.completion)
                    if job not in calls and message["content"]:
                        yield {"data": _json(_delta_chunk(chunk(job, "", None, None), {"content": message["content"]}))}
                yield {"data": _json(chunk(job, None if chat else "", finish_reason,
                                           entries if want_logprobs else None))}
            elif isinstance(event, Failed):
                raise event.error
        if include_usage:
            yield {"data": _json({"id": rid, "object": obj, "created": created, "model": server.id,
                                  "choices": [], "usage": _request_usage(jobs, done),
                                  "system_fingerprint": None})}
        yield {"data": "[DONE]"}
    except Exception as error:  # the headers are sent: the error goes as an event, as OpenAI's do
        if isinstance(error, APIError):
            e = error
        elif isinstance(error, ContextLengthError):
            e = _context_error(error, "prompt")
        else:
            log.error("a stream failed", exc_info=error)
            e = internal_error()
        yield {"data": _json(e.body())}
        yield {"data": "[DONE]"}
    finally:
        if len(done) < len(jobs):
            server.cancel(jobs)


def _delta_chunk(out: dict, delta: dict) -> dict:
    """A chat chunk whose delta is delta."""
    out["choices"][0]["delta"] = delta
    return out


def serve(model, source: str, *, host: str = "127.0.0.1", port: int = 8000, api_key: str | None = None,
          max_queue: int = 64, log_level: str = "info", max_body: int = MAX_BODY_BYTES,
          allowed_hosts: list[str] | None = None, request_timeout: float = REQUEST_TIMEOUT_S,
          max_connections: int = MAX_CONNECTIONS, shutdown_grace: float = SHUTDOWN_GRACE_S,
          chat_template: str | None = None) -> None:
    """Serves model until interrupted (Ctrl-C or SIGTERM: requests in flight get shutdown_grace
    seconds to finish, the rest a 503). A connection has request_timeout seconds to send each
    request; past max_connections, requests are answered 503."""
    import uvicorn

    # A thread running Python (a slow chat template) hands the GIL over after this long to the event
    # loop or the scheduler that asks for it (default 5 ms: a step that takes it back a few times
    # waited tens of ms)
    sys.setswitchinterval(GIL_SWITCH_S)
    app = create_app(model, source, api_key=api_key, max_queue=max_queue, max_body=max_body,
                     allowed_hosts=allowed_hosts_for(host, allowed_hosts), shutdown_grace=shutdown_grace,
                     chat_template=chat_template)
    server = app.state.server

    class Uvicorn(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            server.begin_shutdown()  # before uvicorn closes the idle connections and waits for the others
            super().handle_exit(sig, frame)

    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, http=timed_protocol(request_timeout),
                            limit_concurrency=max_connections, timeout_graceful_shutdown=shutdown_grace + 10)
    Uvicorn(config).run()


def timed_protocol(timeout: float):
    """uvicorn's h11 protocol, closing a connection that has not sent a whole request (head and
    body) within timeout seconds of opening or of its last answer (uvicorn times out only idle
    connections that have had an answer)."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class TimedH11Protocol(H11Protocol):
        _deadline = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()

        def connection_lost(self, exc) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
            super().connection_lost(exc)

        def _arm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
            self._deadline = self.loop.call_later(timeout, self._expire)

        def _expire(self) -> None:
            waiting = self.cycle is None or self.cycle.response_complete or self.cycle.more_body
            if waiting and not self.transport.is_closing():
                self.transport.close()

    return TimedH11Protocol
