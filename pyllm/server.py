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

>>> app = create_app(pyllm.load("smollm2"), "smollm2")  # doctest: +SKIP
>>> uvicorn.run(app, host="127.0.0.1", port=8000)  # doctest: +SKIP
"""
from __future__ import annotations

import asyncio
import base64
import hmac
import json
import os
import threading
import time
import uuid
from contextlib import asynccontextmanager

import numpy as np
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sse_starlette import EventSourceResponse
from starlette.exceptions import HTTPException

from . import hub
from .chat import ChatMessageError, ChatTemplateError
from .embedding import embed_ids
from .errors import ContextLengthError, QueueFullError
from .generation import StopMatcher
from .sampling import SamplingParams, SamplingParamsError
from .scheduler import Failed, Finished, Piece, Scheduler
from .server_api import ChatRequest, CompletionRequest, EmbeddingRequest, Sampling

DISCONNECT_POLL_S = 0.5  # how often a request waiting for a whole answer checks that its client is there


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

    def __init__(self, model, source: str, max_queue: int = 64):
        self.model = model
        self.id = served_id(source)
        self.names = model_names(source, model.source) | {self.id}
        self.created = _now()
        self.scheduler = Scheduler(model, max_queue=max_queue)
        self._mailbox: Mailbox | None = None

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
            StopMatcher(stop)
        except ValueError as e:
            raise APIError(400, str(e), "stop", "invalid_value") from None
        return stop or None

    def tokenize(self, text: str, param: str, add_special: bool = True) -> list[int]:
        try:
            return self.model.tokenize(text, add_special=add_special)
        except ValueError as e:  # a lone surrogate ("\ud800" in the JSON) is not text
            raise APIError(400, str(e), param, "invalid_value") from None

    def token_ids(self, ids: list[int], param: str) -> list[int]:
        for i in ids:
            if i >= self.model.vocab_size:
                raise APIError(400, f"token id {i} is outside the vocabulary [0, {self.model.vocab_size})",
                               param, "invalid_value")
        return ids

    def check_fits(self, ids: list[int], param: str) -> None:
        if not ids:
            raise APIError(400, f"the {param} has no tokens", param, "invalid_value")
        if len(ids) > self.model.n_ctx:
            raise APIError(400, f"This model's maximum context length is {self.model.n_ctx} tokens, but the "
                                f"{param} has {len(ids)} tokens", param, "context_length_exceeded")

    # ---- running jobs ---------------------------------------------------------------------------

    def submit(self, jobs: list[Job], req: Sampling, max_tokens: int, logprobs: int | None,
               events: asyncio.Queue) -> None:
        """Submits every job, or none: a full queue or a refused job cancels those already in."""
        mailbox = self.mailbox(asyncio.get_running_loop())
        stop = self.stops(req)
        settings = [self.sampling(req, j.index % req.n) for j in jobs]

        def deliver(job: Job):
            def on_event(event) -> None:  # on the scheduler's thread
                mailbox.post(events, (job, event))
            return on_event

        try:
            for job, sampling in zip(jobs, settings):
                job.handle = self.scheduler.submit(job.prompt_ids, sampling=sampling, max_tokens=max_tokens,
                                                   stop=stop, logprobs=logprobs, on_event=deliver(job))
        except BaseException as e:
            self.cancel(jobs)
            if isinstance(e, QueueFullError):
                raise APIError(429, f"The server is busy: {self.scheduler.queued} requests are waiting for "
                                    f"one of its {self.scheduler.slots} slots. Retry later.",
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

    async def results(self, request: Request, jobs: list[Job], events: asyncio.Queue) -> dict:
        """job -> its Completion, once every job has finished; a client that goes away meanwhile
        cancels them all (the answer, 499, goes nowhere)."""
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
                elif isinstance(event, Failed):
                    raise event.error
        finally:
            if len(done) < len(jobs):
                self.cancel(jobs)
        return done

    async def embed(self, inputs: list[list[int]]) -> np.ndarray:
        core = self.model.core
        return await asyncio.wrap_future(self.scheduler.call(
            lambda: np.stack([embed_ids(core, ids, "mean", True) for ids in inputs])))


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


def create_app(model, source: str, *, api_key: str | None = None, max_queue: int = 64) -> FastAPI:
    """The FastAPI app serving model under the name source (an alias, id or path)."""
    server = Server(model, source, max_queue)

    @asynccontextmanager
    async def lifespan(app):
        server.scheduler.start()
        try:
            yield
        finally:
            server.scheduler.close()

    app = FastAPI(title="pyllm", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = server

    @app.exception_handler(APIError)
    async def api_error(request, e: APIError):
        return e.response()

    @app.exception_handler(RequestValidationError)
    async def invalid(request, e: RequestValidationError):
        return validation_error(e.errors()).response()

    @app.exception_handler(HTTPException)
    async def http_error(request, e: HTTPException):
        return APIError(e.status_code, str(e.detail), code=None).response()

    @app.exception_handler(Exception)
    async def crashed(request, e: Exception):
        return APIError(500, f"internal error: {type(e).__name__}: {e}", type="server_error").response()

    if api_key is not None:
        app.add_middleware(RequireKey, api_key=api_key)

    @app.get("/health")
    async def health():
        s = server.scheduler
        return {"status": "ok", "model": server.id, "active": s.active, "queued": s.queued, "slots": s.slots}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [_model_card(server)]}

    @app.get("/v1/models/{name:path}")
    async def model_card(name: str):
        server.check_model(name)
        return _model_card(server)

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request):
        server.check_model(req.model)
        prompts = _prompts(server, req.prompt)
        jobs = [Job(p * req.n + i, p, ids, text) for p, (ids, text) in enumerate(prompts) for i in range(req.n)]
        max_tokens = 16 if req.max_tokens is None else req.max_tokens
        return await _respond(server, request, req, jobs, max_tokens, req.logprobs, "text_completion")

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatRequest, request: Request):
        server.check_model(req.model)
        try:
            ids = model.chat_ids([m.as_dict() for m in req.messages])  # contents as text, as Model.chat
        except (ChatTemplateError, ChatMessageError, ValueError) as e:  # ValueError: a lone surrogate, TokenizerError
            raise APIError(400, str(e), "messages", "invalid_value") from None
        server.check_fits(ids, "messages")
        jobs = [Job(i, 0, ids, None) for i in range(req.n)]
        limit = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        max_tokens = model.n_ctx - len(ids) if limit is None else limit
        if req.top_logprobs is not None and not req.logprobs:
            raise APIError(400, "top_logprobs needs logprobs set to true", "top_logprobs", "invalid_value")
        logprobs = (req.top_logprobs or 0) if req.logprobs else None
        return await _respond(server, request, req, jobs, max_tokens, logprobs, "chat.completion")

    @app.post("/v1/embeddings")
    async def embeddings(req: EmbeddingRequest):
        server.check_model(req.model)
        inputs = _embedding_inputs(server, req.input)
        if req.dimensions is not None and req.dimensions != model.spec.dim:
            raise APIError(400, f"dimensions: this model's embeddings have {model.spec.dim}; pyllm serve does "
                                f"not shorten them", "dimensions", "invalid_value")
        vectors = await server.embed(inputs)
        data = []
        for i, v in enumerate(vectors):
            value = (base64.b64encode(v.astype("<f4").tobytes()).decode() if req.encoding_format == "base64"
                     else v.tolist())
            data.append({"object": "embedding", "index": i, "embedding": value})
        n = sum(len(ids) for ids in inputs)
        return {"object": "list", "data": data, "model": server.id,
                "usage": {"prompt_tokens": n, "total_tokens": n}}

    return app


class RequireKey:
    """Answers 401 to any request but /health without `Authorization: Bearer KEY` (a plain ASGI
    middleware: Starlette's BaseHTTPMiddleware would hide a client's disconnect from the handlers)."""

    def __init__(self, app, api_key: str):
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] != "/health":
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                what = "no API key was given" if not given else "the API key is not valid"
                response = APIError(401, f"Incorrect API key: {what} (send Authorization: Bearer KEY)",
                                    code="invalid_api_key").response()
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _model_card(server: Server) -> dict:
    return {"id": server.id, "object": "model", "created": server.created, "owned_by": "pyllm"}


def validation_error(errors) -> APIError:
    """pydantic's errors as one 400 naming the first parameter at fault."""
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
    if not loc:
        return APIError(400, f"the request body must be a JSON object: {first['msg']}", None, "invalid_type")
    same = [e for e in errors if [str(x) for x in e["loc"] if x != "body"][:1] == loc[:1]]
    reasons = list(dict.fromkeys(e["msg"] for e in same))
    where = ".".join(loc)
    return APIError(400, f"Invalid value for '{where}': {'; or '.join(reasons)}", param, "invalid_value")


def _prompts(server: Server, prompt) -> list[tuple[list[int], str]]:
    """(token ids, text) of each prompt a completions request holds."""
    model = server.model
    if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
        prompt = [prompt]
    out = []
    for p in prompt:
        if isinstance(p, str):
            ids, text = server.tokenize(p, "prompt"), p
        else:
            ids = server.token_ids(p, "prompt")
            text = model.tokenizer.decode(ids)
        server.check_fits(ids, "prompt")
        out.append((ids, text))
    return out


def _embedding_inputs(server: Server, given) -> list[list[int]]:
    if isinstance(given, str) or (given and isinstance(given[0], int)):
        given = [given]
    inputs = [server.tokenize(x, "input") if isinstance(x, str) else server.token_ids(x, "input") for x in given]
    for ids in inputs:
        server.check_fits(ids, "input")
    return inputs


async def _respond(server: Server, request: Request, req: Sampling, jobs: list[Job], max_tokens: int,
                   logprobs: int | None, kind: str):
    events: asyncio.Queue = asyncio.Queue()
    server.submit(jobs, req, max_tokens, logprobs, events)
    rid = ("chatcmpl-" if kind == "chat.completion" else "cmpl-") + uuid.uuid4().hex
    created = _now()
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return EventSourceResponse(_stream(server, jobs, events, rid, created, kind, logprobs is not None,
                                           include_usage), ping=15)
    try:
        done = await server.results(request, jobs, events)
    except ContextLengthError as e:
        raise _context_error(e, "prompt") from None
    choices = []
    for job in jobs:
        c = done[job]
        if kind == "chat.completion":
            choices.append({"index": job.index, "message": {"role": "assistant", "content": c.text, "refusal": None},
                            "logprobs": chat_logprobs(c.logprobs) if logprobs is not None else None,
                            "finish_reason": c.finish_reason})
        else:
            choices.append({"index": job.index, "text": c.text, "finish_reason": c.finish_reason,
                            "logprobs": (completion_logprobs(c.logprobs, len(job.prompt_text))
                                         if logprobs is not None else None)})
    return {"id": rid, "object": kind, "created": created, "model": server.id, "choices": choices,
            "usage": _request_usage(jobs, done), "system_fingerprint": None}


def _request_usage(jobs: list[Job], done: dict) -> dict:
    """A request's usage: each prompt counted once (its n choices share it), every choice's tokens."""
    prompts = {job.prompt: len(job.prompt_ids) for job in jobs}
    return _usage(sum(prompts.values()), sum(len(done[job].token_ids) for job in jobs))


async def _stream(server: Server, jobs: list[Job], events: asyncio.Queue, rid: str, created: int, kind: str,
                  want_logprobs: bool, include_usage: bool):
    """Server-sent events of one request: chunks as text arrives, a last chunk per choice with its
    finish_reason, the usage chunk if asked for, then [DONE]. Closing the stream cancels the jobs."""
    chat = kind == "chat.completion"
    obj = "chat.completion.chunk" if chat else "text_completion"
    pending = {job: [] for job in jobs}  # logprob entries not yet sent
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
                if event.text:
                    entries, pending[job] = pending[job], []
                    yield {"data": _json(chunk(job, event.text, None, entries if want_logprobs else None))}
            elif isinstance(event, Finished):
                done[job] = event.completion
                entries, pending[job] = pending[job], []
                yield {"data": _json(chunk(job, None if chat else "", event.completion.finish_reason,
                                           entries if want_logprobs else None))}
            elif isinstance(event, Failed):
                raise event.error
        if include_usage:
            yield {"data": _json({"id": rid, "object": obj, "created": created, "model": server.id,
                                  "choices": [], "usage": _request_usage(jobs, done),
                                  "system_fingerprint": None})}
        yield {"data": "[DONE]"}
    except Exception as error:  # the headers are sent: the error goes as an event, as OpenAI's do
        e = (_context_error(error, "prompt") if isinstance(error, ContextLengthError)
             else APIError(500, f"internal error: {type(error).__name__}: {error}", type="server_error"))
        yield {"data": _json(e.body())}
    finally:
        if len(done) < len(jobs):
            server.cancel(jobs)


def serve(model, source: str, *, host: str = "127.0.0.1", port: int = 8000, api_key: str | None = None,
          max_queue: int = 64, log_level: str = "info") -> None:
    """Serves model until interrupted (Ctrl-C or SIGTERM)."""
    import uvicorn

    app = create_app(model, source, api_key=api_key, max_queue=max_queue)
    # open streams are closed after a few seconds at shutdown instead of running to their end
    uvicorn.run(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=3)
