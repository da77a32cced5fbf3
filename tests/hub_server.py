"""Servers on 127.0.0.1 that stand in for the places pyllm downloads from, for its fetch tests.

StandInHub answers the requests huggingface_hub makes for snapshot_download and hf_hub_download
(read from its source, version 2.x), the way the Hugging Face Hub answers them:

    GET       /api/agent-harnesses                   the registry huggingface_hub's telemetry reads (empty)
    GET       /api/models/{repo}[/revision/{rev}]   model info: id, sha (the commit), siblings
    GET       /api/models/{repo}/tree/{rev}[/{dir}]  the file listing (?recursive=true), paginated with
                                                     a Link header and a cursor
    HEAD|GET  /{repo}/resolve/{rev}/{path}           a small file: 200 with ETag (its git blob id),
                                                     X-Repo-Commit and Content-Length; a large (LFS) one:
                                                     302 to the file store with X-Linked-Etag (its
                                                     sha256), X-Linked-Size and X-Repo-Commit
    HEAD|GET  {store}/{sha256}                       the file store, on a port of its own as the Hub's
                                                     CDN is another host; Range requests answered 206

Errors carry the Hub's X-Error-Code (RepoNotFound, RevisionNotFound, EntryNotFound), which
huggingface_hub turns into its exceptions. A private repository wants `Authorization: Bearer <token>`
and otherwise answers 401 RepoNotFound, as the Hub does. Every request is recorded; one for anything
else is recorded as unexpected and answered 404.

PackageServer serves a folder of wheels as a find-links page for pip, at a set speed, so that pip
downloads them over HTTP (and reports its progress) as it would from an index.

Both stop themselves after `lifetime` seconds if a test never closes them.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, quote, unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".gguf", ".bin")  # the Hub's .gitattributes sends these to LFS
CHUNK = 1 << 16


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass(frozen=True)
class Request:
    server: str  # "hub" or "store"
    method: str
    path: str
    headers: dict[str, str]  # lower-case names


class _Repo:
    def __init__(self, private: bool):
        self.private = private
        self.commits: dict[str, dict[str, bytes]] = {}  # commit -> path -> contents
        self.branches: dict[str, str] = {}  # branch or tag -> commit


def _send_bytes(handler: BaseHTTPRequestHandler, data: bytes, headers: dict[str, str],
                drop_after: int | None = None, bytes_per_s: float | None = None) -> None:
    """data as a 200, or the part a Range header asks for as a 206; drop_after closes the connection
    after that many body bytes, as a network failing mid-download would."""
    start = 0
    match = re.fullmatch(r"bytes=(\d+)-", handler.headers.get("Range", ""))
    if match and int(match[1]) < len(data):
        start = int(match[1])
        handler.send_response(206)
        handler.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
    else:
        handler.send_response(200)
    for name, value in headers.items():
        handler.send_header(name, value)
    handler.send_header("Accept-Ranges", "bytes")
    handler.send_header("Content-Length", str(len(data) - start))
    handler.end_headers()
    if handler.command == "HEAD":
        return
    body = memoryview(data)[start:]
    if drop_after is not None:
        handler.wfile.write(body[:drop_after])
        handler.wfile.flush()
        handler.close_connection = True
        handler.connection.shutdown(socket.SHUT_RDWR)
        return
    step = 4096 if bytes_per_s else CHUNK
    for i in range(0, len(body), step):
        handler.wfile.write(body[i:i + step])
        if bytes_per_s:
            time.sleep(step / bytes_per_s)


class _Quiet(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # noqa: A002 (the base class's name)
        pass

    def record(self, server: str) -> None:
        hub: StandInHub = self.server.owner
        with hub.lock:
            hub.requests.append(Request(server, self.command, self.path,
                                        {k.lower(): v for k, v in self.headers.items()}))

    def error(self, status: int, code: str | None, message: str, extra: dict[str, str] | None = None) -> None:
        body = json.dumps({"error": message}).encode()
        self.send_response(status)
        if code:
            self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        for name, value in (extra or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


class _HubHandler(_Quiet):
    def do_GET(self):
        self.record("hub")
        hub: StandInHub = self.server.owner
        url = urlsplit(self.path)
        if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)(?:/(.*))?", url.path):
            return self.tree(hub, unquote(m[1]), unquote(m[2]), unquote(m[3] or ""), parse_qs(url.query))
        if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?", url.path):
            return self.model_info(hub, unquote(m[1]), unquote(m[2] or "main"))
        if url.path == "/api/agent-harnesses":
            return self.json({"standardEnvVars": [], "harnesses": {}})
        return self.do_HEAD(recorded=True)

    def do_HEAD(self, recorded: bool = False):
        if not recorded:
            self.record("hub")
        hub: StandInHub = self.server.owner
        url = urlsplit(self.path)
        if m := re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", url.path):
            return self.resolve(hub, unquote(m[1]), unquote(m[2]), unquote(m[3]))
        with hub.lock:
            hub.unexpected.append(f"{self.command} {self.path}")
        self.error(404, None, "not a route of the stand-in hub")

    def lookup(self, hub: StandInHub, repo_id: str, revision: str) -> tuple[str, dict[str, bytes]] | None:
        """The commit and files of repo_id at revision, or None once an error has been sent."""
        repo = hub.repos.get(repo_id)
        if repo is None:
            self.error(404, "RepoNotFound", "Repository not found")
            return None
        if repo.private and self.headers.get("Authorization") not in {f"Bearer {t}" for t in hub.tokens}:
            self.error(401, "RepoNotFound", "Invalid username or password.")
            return None
        commit = revision if revision in repo.commits else repo.branches.get(revision)
        if commit is None:
            self.error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
            return None
        return commit, repo.commits[commit]

    def model_info(self, hub: StandInHub, repo_id: str, revision: str) -> None:
        found = self.lookup(hub, repo_id, revision)
        if found is None:
            return
        commit, files = found
        self.json({"id": repo_id, "modelId": repo_id, "sha": commit, "private": hub.repos[repo_id].private,
                   "siblings": [{"rfilename": p} for p in sorted(files)], "tags": []})

    def tree(self, hub: StandInHub, repo_id: str, revision: str, folder: str, query: dict) -> None:
        found = self.lookup(hub, repo_id, revision)
        if found is None:
            return
        commit, files = found
        recursive = query.get("recursive", ["false"])[0] == "true"
        prefix = folder.rstrip("/") + "/" if folder else ""
        entries, folders = [], set()
        for path in sorted(files):
            if not path.startswith(prefix):
                continue
            rest = path[len(prefix):]
            parts = rest.split("/")
            for i in range(1, len(parts)):  # the folders on the way, once each
                sub = prefix + "/".join(parts[:i])
                if (recursive or i == 1) and sub not in folders:
                    folders.add(sub)
                    entries.append({"type": "directory", "oid": git_blob_id(sub.encode()), "size": 0, "path": sub})
            if recursive or len(parts) == 1:
                data = files[path]
                entry = {"type": "file", "oid": git_blob_id(data), "size": len(data), "path": path}
                if path.endswith(LFS_SUFFIXES):
                    entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
                entries.append(entry)
        if folder and not entries:
            return self.error(404, "EntryNotFound", f"{folder} does not exist on {revision}",
                              {"X-Repo-Commit": commit})
        cursor = int(query.get("cursor", ["0"])[0])
        page = entries[cursor:cursor + hub.page_size]
        links = {}
        if cursor + hub.page_size < len(entries):
            base = f"{hub.url}{urlsplit(self.path).path}"
            links["Link"] = (f'<{base}?recursive={str(recursive).lower()}&expand=false'
                             f'&cursor={cursor + hub.page_size}>; rel="next"')
        self.json(page, links)

    def resolve(self, hub: StandInHub, repo_id: str, revision: str, path: str) -> None:
        found = self.lookup(hub, repo_id, revision)
        if found is None:
            return
        commit, files = found
        if path not in files:
            return self.error(404, "EntryNotFound", "Entry not found", {"X-Repo-Commit": commit})
        data = files[path]
        if path.endswith(LFS_SUFFIXES):
            sha256 = hashlib.sha256(data).hexdigest()
            with hub.lock:
                hub.blobs[sha256] = data
            body = b""
            self.send_response(302)
            self.send_header("Location", f"{hub.store_url}/{sha256}?repo={quote(repo_id, safe='')}")
            self.send_header("ETag", f'"{git_blob_id(sha256.encode())}"')
            self.send_header("X-Linked-Etag", f'"{sha256}"')
            self.send_header("X-Linked-Size", str(len(data)))
            self.send_header("X-Repo-Commit", commit)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            return
        _send_bytes(self, data, {"ETag": f'"{git_blob_id(data)}"', "X-Repo-Commit": commit,
                                 "Content-Type": "application/octet-stream"})

    def json(self, value, headers: dict[str, str] | None = None) -> None:
        body = json.dumps(value).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        for name, v in (headers or {}).items():
            self.send_header(name, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _StoreHandler(_Quiet):
    def do_GET(self):
        self.record("store")
        hub: StandInHub = self.server.owner
        sha256 = urlsplit(self.path).path.lstrip("/")
        with hub.lock:
            data = hub.blobs.get(sha256)
            drop = hub.drops.pop(sha256, None) if self.command == "GET" else None
        if data is None:
            return self.error(404, None, "no such blob")
        _send_bytes(self, data, {"ETag": f'"{sha256}"', "Content-Type": "application/octet-stream"}, drop,
                    hub.bytes_per_s)

    do_HEAD = do_GET


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, owner, handler):
        super().__init__(("127.0.0.1", 0), handler)
        self.owner = owner


class _Serving:
    """Starts servers in threads; stops them on close() or after lifetime seconds."""

    def __init__(self, servers: list[_Server], lifetime: float):
        self._servers = servers
        self._threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in servers]
        for t in self._threads:
            t.start()
        self._timer = threading.Timer(lifetime, self.close)
        self._timer.daemon = True
        self._timer.start()
        self._closed = False

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._timer.cancel()
        for s in self._servers:
            s.shutdown()
            s.server_close()


class StandInHub:
    """A Hugging Face Hub with the repositories given to add_commit, listening on 127.0.0.1.

    >>> with StandInHub() as hub:                                       # doctest: +SKIP
    ...     hub.add_commit("owner/tiny", {"config.json": b"{}"})
    ...     os.environ["HF_ENDPOINT"] = hub.url
    """

    def __init__(self, page_size: int = 1000, lifetime: float = 600.0):
        self.lock = threading.Lock()
        self.repos: dict[str, _Repo] = {}
        self.blobs: dict[str, bytes] = {}  # sha256 -> contents, for the store
        self.drops: dict[str, int] = {}  # sha256 -> bytes the next GET sends before it hangs up
        self.tokens: set[str] = set()  # tokens that open private repositories
        self.bytes_per_s: float | None = None  # the store's speed (None: as fast as it goes)
        self.requests: list[Request] = []
        self.unexpected: list[str] = []
        self.page_size = page_size
        self._hub = _Server(self, _HubHandler)
        self._store = _Server(self, _StoreHandler)
        self.url = f"http://127.0.0.1:{self._hub.server_port}"
        self.store_url = f"http://127.0.0.1:{self._store.server_port}"
        self._serving = _Serving([self._hub, self._store], lifetime)

    def add_commit(self, repo_id: str, files: dict[str, bytes], branch: str = "main",
                   private: bool = False) -> str:
        """Makes files the contents of branch (a new commit); returns the commit's hash."""
        with self.lock:
            repo = self.repos.setdefault(repo_id, _Repo(private))
            repo.private = private
            digest = hashlib.sha1(repo_id.encode() + str(len(repo.commits)).encode())
            for path in sorted(files):
                digest.update(path.encode() + b"\0" + git_blob_id(files[path]).encode())
            commit = digest.hexdigest()
            repo.commits[commit] = dict(files)
            repo.branches[branch] = commit
            return commit

    def drop_first_get(self, data: bytes, after: int) -> None:
        """The next GET of the file whose contents are data hangs up after `after` bytes."""
        with self.lock:
            self.drops[hashlib.sha256(data).hexdigest()] = after

    def gets(self, server: str | None = None) -> list[Request]:
        with self.lock:
            return [r for r in self.requests if r.method == "GET" and server in (None, r.server)]

    def close(self) -> None:
        self._serving.close()

    def __enter__(self) -> "StandInHub":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def lay_out_hf_cache(cache: str | os.PathLike, repo_id: str, files: dict[str, str | bytes],
                     revision: str = "main") -> str:
    """Puts files (contents, or the path of a file to link to) into an HF cache folder as
    huggingface_hub lays out a download: blobs/<etag> (the sha256 of an LFS file, the git blob id of
    another), snapshots/<commit>/<path> a relative link to its blob, refs/<revision> the commit.
    Returns the snapshot folder."""
    storage = os.path.join(os.fspath(cache), "models--" + repo_id.replace("/", "--"))
    ids = {}
    for path, value in files.items():
        digest = hashlib.sha256() if path.endswith(LFS_SUFFIXES) else None
        if isinstance(value, bytes):
            ids[path] = hashlib.sha256(value).hexdigest() if digest else git_blob_id(value)
            continue
        if digest is None:
            with open(value, "rb") as f:
                ids[path] = git_blob_id(f.read())
            continue
        with open(value, "rb") as f:
            while chunk := f.read(1 << 22):
                digest.update(chunk)
        ids[path] = digest.hexdigest()
    commit = hashlib.sha1(json.dumps(sorted(ids.items())).encode()).hexdigest()
    snapshot = os.path.join(storage, "snapshots", commit)
    os.makedirs(os.path.join(storage, "blobs"), exist_ok=True)
    for path, value in files.items():
        blob = os.path.join(storage, "blobs", ids[path])
        if isinstance(value, bytes):
            with open(blob, "wb") as f:
                f.write(value)
        elif not os.path.lexists(blob):
            os.symlink(os.path.abspath(value), blob)
        pointer = os.path.join(snapshot, *path.split("/"))
        os.makedirs(os.path.dirname(pointer), exist_ok=True)
        os.symlink(os.path.relpath(blob, os.path.dirname(pointer)), pointer)
    os.makedirs(os.path.join(storage, "refs"), exist_ok=True)
    with open(os.path.join(storage, "refs", revision), "w") as f:
        f.write(commit)
    return snapshot


class _SlowFolderHandler(SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002
        pass

    def copyfile(self, source, outputfile):
        rate = self.server.owner.bytes_per_s
        while chunk := source.read(CHUNK):
            outputfile.write(chunk)
            time.sleep(CHUNK / rate)


class PackageServer:
    """A folder served over HTTP on 127.0.0.1 at bytes_per_s: pip's --find-links takes its listing."""

    def __init__(self, folder: str | os.PathLike, bytes_per_s: float = 4e6, lifetime: float = 600.0):
        self.bytes_per_s = bytes_per_s
        folder = os.fspath(folder)

        class Handler(_SlowFolderHandler):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, directory=folder, **kwargs)

        self._server = _Server(self, Handler)
        self.url = f"http://127.0.0.1:{self._server.server_port}/"
        self._serving = _Serving([self._server], lifetime)

    def close(self) -> None:
        self._serving.close()

    def __enter__(self) -> "PackageServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
