"""A Hugging Face Hub on 127.0.0.1 for tests: the part of the Hub's HTTP API that huggingface_hub's client speaks when
it creates a repo, uploads a folder (``HfApi.create_repo``, ``upload_folder`` / ``create_commit`` with the git-LFS
basic transfer for large and binary files) and downloads files for ``from_pretrained`` (``hf_hub_download``,
``model_info``, ``list_repo_tree``), on Python's standard library only. Repos live in memory; each commit gets a fresh
40-hex sha. The client runs unchanged over real HTTP: point it here with the environment of :meth:`LocalHub.env`
(``HF_ENDPOINT`` is read when huggingface_hub is imported, so a subprocess is the honest way to use it).

    with local_hub() as hub:
        subprocess.run([...], env={**os.environ, **hub.env(tmp_path)})
        assert "model.safetensors" in hub.lfs_paths("user/tiny")

Every request is logged (``hub.requests``: method, path, status); a request this Hub does not know is answered 404
with a JSON ``{"error": ...}`` naming it, and a malformed one 400, as the Hub answers them.
"""

from __future__ import annotations

import base64
import contextlib
import fnmatch
import hashlib
import itertools
import json
import os
import re
import secrets
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

__all__ = ["TOKEN", "USER", "HubError", "LocalHub", "local_hub"]

USER = "user"
TOKEN = "hf_local_hub_token_for_tests"
# The Hub's default .gitattributes (the LFS patterns of a new repo), and its other reasons for LFS: a file over 10 MB,
# or a binary one (a NUL byte in its first 512 bytes), which the Hub would refuse as a regular git blob.
LFS_PATTERNS = (
    "*.7z *.arrow *.bin *.bz2 *.ckpt *.ftz *.gz *.h5 *.joblib *.lfs.* *.mlmodel *.model *.msgpack *.npy *.npz *.onnx "
    "*.ot *.parquet *.pb *.pickle *.pkl *.pt *.pth *.rar *.safetensors *.tar *.tflite *.tgz *.wasm *.xz *.zip *.zst "
    "*tfevents*"
).split()
GITATTRIBUTES = "".join(f"{pattern} filter=lfs diff=lfs merge=lfs -text\n" for pattern in LFS_PATTERNS).encode()
LFS_SIZE = 10 * 1024 * 1024


class HubError(Exception):
    """An HTTP error answer: status, message, and the ``X-Error-Code`` huggingface_hub maps to its exceptions."""

    def __init__(self, status: int, message: str, code: str | None = None, headers=None, extra=None):
        super().__init__(message)
        self.status, self.message, self.code = status, message, code
        self.headers, self.extra = headers or {}, extra or {}  # extra: more keys of the JSON answer


@dataclass(frozen=True)
class Blob:
    """A file's content and how it is stored: a git blob, or an LFS object behind a pointer file."""

    data: bytes
    lfs: bool

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @property
    def pointer(self) -> bytes:
        return f"version https://git-lfs.github.com/spec/v1\noid sha256:{self.sha256}\nsize {len(self.data)}\n".encode()

    @property
    def git_oid(self) -> str:
        """The git sha1 of what git stores: the content, or for an LFS file its pointer (the Hub's ETag)."""
        stored = self.pointer if self.lfs else self.data
        return hashlib.sha1(b"blob %d\0" % len(stored) + stored).hexdigest()


@dataclass(frozen=True)
class Commit:
    oid: str
    message: str
    files: dict[str, Blob]


@dataclass
class Repo:
    repo_id: str
    commits: list[Commit] = field(default_factory=list)
    refs: dict[str, str] = field(default_factory=dict)  # branch -> commit oid
    lfs_objects: dict[str, bytes] = field(default_factory=dict)  # sha256 -> content, PUT by the LFS basic transfer

    def commit(self, revision: str) -> Commit:
        """The commit a branch name or a commit oid (full, or a prefix of 7 or more) names."""
        oid = self.refs.get(revision, revision)
        found = [c for c in self.commits if len(oid) >= 7 and c.oid.startswith(oid)]
        if len(found) != 1:
            raise HubError(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        return found[0]

    def add_commit(self, branch: str, message: str, files: dict[str, Blob]) -> Commit:
        commit = Commit(secrets.token_hex(20), message, dict(files))
        self.commits.append(commit)
        self.refs[branch] = commit.oid
        return commit


def needs_lfs(path: str, size: int, sample: bytes) -> bool:
    """The Hub's preupload answer: LFS for the .gitattributes patterns, files over 10 MB and binary files."""
    name = path.rpartition("/")[2]
    return any(fnmatch.fnmatch(name, p) for p in LFS_PATTERNS) or size > LFS_SIZE or b"\0" in sample


def _json_body(handler) -> dict:
    try:
        body = json.loads(handler.body() or b"null")
    except ValueError as err:
        raise HubError(400, f"request body is not JSON: {err}") from None
    if not isinstance(body, dict):
        raise HubError(400, "request body must be a JSON object")
    return body


def _need(body: dict, key: str, kind: type):
    """``body[key]``, a 400 answer if it is missing or not a ``kind``."""
    if not isinstance(body, dict) or not isinstance(body.get(key), kind):
        raise HubError(400, f"{key!r} must be a {kind.__name__}, got {body.get(key)!r}")
    return body[key]


class LocalHub:
    """The Hub's state (repos, LFS objects waiting for a commit, the request log) and its HTTP server."""

    def __init__(self):
        self.repos: dict[str, Repo] = {}
        self.requests: list[tuple[str, str, int]] = []
        self.errors: list[str] = []  # exceptions raised inside this Hub's code (answered 500)
        self.lock = threading.Lock()
        self._homes = itertools.count()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.server.daemon_threads = True
        self.server.hub = self
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, name="local-hub", daemon=True)

    # --- what tests use -------------------------------------------------------------------------------------------
    def env(self, tmp_path) -> dict[str, str]:
        """Environment variables that point huggingface_hub (and transformers) at this Hub, with the test token and
        a fresh HF_HOME (caches, modules) under ``tmp_path`` on every call; Xet off, so uploads take the LFS route."""
        home = Path(tmp_path) / f"hf_home_{next(self._homes)}"
        home.mkdir(parents=True)
        return {
            "HF_ENDPOINT": self.endpoint,
            "HF_TOKEN": TOKEN,
            "HF_HOME": str(home),
            "HF_HUB_CACHE": str(home / "hub"),
            "HF_MODULES_CACHE": str(home / "modules"),
            "HF_XET_CACHE": str(home / "xet"),
            "HF_HUB_DISABLE_XET": "1",
            "HF_HUB_OFFLINE": "0",
            "TRANSFORMERS_OFFLINE": "0",
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "HF_HUB_DISABLE_PROGRESS_BARS": "1",
            "NO_PROXY": "127.0.0.1,localhost",
            "no_proxy": "127.0.0.1,localhost",
        }

    def repo(self, repo_id: str) -> Repo:
        """The repo ``repo_id``; a 404 RepoNotFound answer if there is none."""
        if repo_id not in self.repos:
            raise HubError(404, f"Repository not found: {repo_id}", "RepoNotFound")
        return self.repos[repo_id]

    def uploads(self, repo_id: str, revision: str = "main") -> dict[str, bytes]:
        """{path: content} of the repo's files at ``revision`` (the head of main)."""
        return {path: blob.data for path, blob in self.repo(repo_id).commit(revision).files.items()}

    def lfs_paths(self, repo_id: str, revision: str = "main") -> set[str]:
        """The repo's files committed as LFS pointers (uploaded by the LFS transfer, not inline in the commit)."""
        return {path for path, blob in self.repo(repo_id).commit(revision).files.items() if blob.lfs}

    def commits(self, repo_id: str) -> list[Commit]:
        """The repo's commits, oldest first (the first is the Hub's own, with .gitattributes)."""
        return list(self.repo(repo_id).commits)

    def served(self, method: str, pattern: str) -> list[tuple[str, str, int]]:
        """The logged requests of ``method`` whose path matches the regex ``pattern``."""
        return [r for r in self.requests if r[0] == method and re.search(pattern, r[1])]

    # --- the API, one method per route ----------------------------------------------------------------------------
    def whoami(self, request) -> dict:
        """``HfApi.whoami`` (GET /api/whoami-v2)."""
        request.authorized()
        return {"type": "user", "name": USER, "fullname": USER, "orgs": [], "auth": {"type": "access_token"}}

    def create_repo(self, request) -> dict:
        """``HfApi.create_repo`` (POST /api/repos/create): 409 with the url if it exists, as the Hub (exist_ok)."""
        request.authorized()
        body = _json_body(request)
        if body.get("type", "model") != "model":
            raise HubError(400, f"this local Hub holds model repos only, not {body['type']!r}")
        repo_id = f"{body.get('organization') or USER}/{_need(body, 'name', str)}"
        url = f"{self.endpoint}/{repo_id}"
        with self.lock:
            if repo_id in self.repos:
                raise HubError(409, "You already created this model repo", extra={"url": url})
            repo = self.repos[repo_id] = Repo(repo_id)
            repo.add_commit("main", "initial commit", {".gitattributes": Blob(GITATTRIBUTES, lfs=False)})
        return {"url": url, "name": repo_id, "id": repo_id}

    def validate_yaml(self, request) -> dict:
        """``HfApi._validate_yaml`` of a README.md in a commit (POST /api/validate-yaml)."""
        _need(_json_body(request), "content", str)
        return {"errors": [], "warnings": []}

    def preupload(self, request, repo_id: str, revision: str) -> dict:
        """``_fetch_upload_modes`` of ``preupload_lfs_files`` (POST /api/models/{repo}/preupload/{rev}): each file's
        upload mode ("lfs" or "regular") and the oid of the file already there, if any."""
        request.authorized()
        files = self.repo(repo_id).commit(revision).files
        answers = []
        for item in _need(_json_body(request), "files", list):
            path, size = _need(item, "path", str), _need(item, "size", int)
            lfs = needs_lfs(path, size, base64.b64decode(_need(item, "sample", str)))
            old = files.get(path)
            oid = None if old is None or old.lfs != lfs else (old.sha256 if lfs else old.git_oid)
            answers.append({"path": path, "uploadMode": "lfs" if lfs else "regular", "shouldIgnore": False, "oid": oid})
        return {"files": answers}

    def lfs_batch(self, request, repo_id: str) -> dict:
        """``lfs.post_lfs_batch_info`` (POST /{repo}.git/info/lfs/objects/batch): a basic-transfer upload href and
        a verify href per object the repo does not hold yet."""
        request.authorized()
        stored = self.repo(repo_id).lfs_objects
        body = _json_body(request)
        if body.get("operation") != "upload" or "basic" not in body.get("transfers", ["basic"]):
            raise HubError(400, f"LFS batch: only the basic upload transfer is served, got {body!r:.200}")
        objects = []
        for item in _need(body, "objects", list):
            oid, size = _need(item, "oid", str), _need(item, "size", int)
            if not re.fullmatch("[0-9a-f]{64}", oid):
                raise HubError(400, f"LFS batch: oid {oid!r} is not a sha256")
            actions = {
                "upload": {"href": f"{self.endpoint}/lfs/{repo_id}/{oid}?size={size}"},
                "verify": {"href": f"{self.endpoint}/lfs/{repo_id}/{oid}/verify"},
            }
            objects.append({"oid": oid, "size": size, **({} if oid in stored else {"actions": actions})})
        return {"transfer": "basic", "objects": objects, "hash_algo": "sha256"}

    def lfs_put(self, request, repo_id: str, oid: str) -> dict:
        """The basic transfer's upload (PUT to the batch's href): the content must hash to its oid."""
        repo, data = self.repo(repo_id), request.body()
        expected = request.query.get("size", [None])[0]
        if hashlib.sha256(data).hexdigest() != oid or (expected is not None and int(expected) != len(data)):
            raise HubError(400, f"LFS upload: {len(data)} bytes do not hash to oid {oid} of size {expected}")
        with self.lock:
            repo.lfs_objects[oid] = data
        return {}

    def lfs_verify(self, request, repo_id: str, oid: str) -> dict:
        """The basic transfer's verify (POST to the batch's verify href)."""
        stored, body = self.repo(repo_id).lfs_objects, _json_body(request)
        if oid not in stored or len(stored[oid]) != body.get("size"):
            raise HubError(404, f"LFS verify: object {oid} of size {body.get('size')} was not uploaded")
        return {}

    def commit(self, request, repo_id: str, revision: str) -> dict:
        """``create_commit`` (POST /api/models/{repo}/commit/{rev}, an NDJSON body of a header then header, file,
        lfsFile, deletedFile and deletedFolder lines) on a branch."""
        request.authorized()
        if request.query.get("create_pr"):
            raise HubError(400, "this local Hub does not open pull requests (create_pr)")
        repo = self.repo(repo_id)
        try:
            lines = [json.loads(line) for line in request.body().splitlines() if line.strip()]
        except ValueError as err:
            raise HubError(400, f"commit: the body is not NDJSON: {err}") from None
        if not lines or lines[0].get("key") != "header":
            raise HubError(400, "commit: the first NDJSON line must be the header")
        header = _need(lines[0], "value", dict)
        with self.lock:
            parent = repo.commit(revision)
            if revision not in repo.refs:
                raise HubError(400, f"commit: revision {revision!r} is not a branch")
            if header.get("parentCommit") and not parent.oid.startswith(header["parentCommit"]):
                raise HubError(412, f"commit: {revision} is at {parent.oid}, not {header['parentCommit']}")
            files = self._apply(repo, dict(parent.files), lines[1:])
            commit = repo.add_commit(revision, _need(header, "summary", str), files)
        return {"commitUrl": f"{self.endpoint}/{repo_id}/commit/{commit.oid}", "commitOid": commit.oid}

    @staticmethod
    def _apply(repo: Repo, files: dict[str, Blob], operations: list[dict]) -> dict[str, Blob]:
        """The files after a commit's operations (the NDJSON lines after its header)."""
        for line in operations:
            key, value = line.get("key"), _need(line, "value", dict)
            path = _need(value, "path", str)
            if key == "file":
                if value.get("encoding") != "base64":
                    raise HubError(400, f"commit: file {path}: encoding must be base64")
                files[path] = Blob(base64.b64decode(_need(value, "content", str)), lfs=False)
            elif key == "lfsFile":
                data = repo.lfs_objects.get(_need(value, "oid", str))
                if data is None or value.get("size", len(data)) != len(data):
                    raise HubError(400, f"commit: lfsFile {path}: LFS object {value['oid']} was not uploaded")
                files[path] = Blob(data, lfs=True)
            elif key == "deletedFile":
                if files.pop(path, None) is None:
                    raise HubError(404, f"commit: A file with this name doesn't exist: {path}", "EntryNotFound")
            elif key == "deletedFolder":
                files = {p: b for p, b in files.items() if not p.startswith(path.rstrip("/") + "/")}
            else:
                raise HubError(400, f"commit: unknown operation {key!r}")
        return files

    def model_info(self, request, repo_id: str, revision: str = "main") -> dict:
        """``HfApi.model_info`` / ``repo_info`` (GET /api/models/{repo}[/revision/{rev}])."""
        commit = self.repo(repo_id).commit(revision)
        return {
            **{"_id": repo_id, "id": repo_id, "modelId": repo_id, "sha": commit.oid},
            **{"private": False, "disabled": False, "gated": False, "downloads": 0, "likes": 0, "tags": []},
            "siblings": [{"rfilename": path} for path in sorted(commit.files)],
            **{"lastModified": "2025-01-01T00:00:00.000Z", "createdAt": "2025-01-01T00:00:00.000Z"},
        }

    def tree(self, request, repo_id: str, revision: str, path: str = "") -> list[dict]:
        """``HfApi.list_repo_tree`` / ``list_repo_files`` (GET /api/models/{repo}/tree/{rev}[/{path}])."""
        files = self.repo(repo_id).commit(revision).files
        prefix = path.strip("/") + "/" if path.strip("/") else ""
        recursive = request.query.get("recursive", ["false"])[0].lower() in ("1", "true")
        entries, folders = [], set()
        for name, blob in sorted(files.items()):
            if not name.startswith(prefix):
                continue
            rest = name[len(prefix) :]
            if "/" in rest and not recursive:
                folders.add(prefix + rest.partition("/")[0])
                continue
            entry = {"type": "file", "oid": blob.git_oid, "size": len(blob.data), "path": name}
            if blob.lfs:
                entry["lfs"] = {"oid": blob.sha256, "size": len(blob.data), "pointerSize": len(blob.pointer)}
            entries.append(entry)
        if prefix and not entries and not folders:
            raise HubError(404, f"{path} does not exist at {revision}", "EntryNotFound")
        return [{"type": "directory", "oid": "0" * 40, "size": 0, "path": f} for f in sorted(folders)] + entries

    def resolve(self, request, repo_id: str, revision: str, path: str) -> tuple[bytes, dict]:
        """``hf_hub_download`` (HEAD for the metadata, then GET, of /{repo}/resolve/{rev}/{path}): the content with
        X-Repo-Commit, ETag (the git oid) and, for an LFS file, X-Linked-Etag (its sha256) and X-Linked-Size."""
        commit = self.repo(repo_id).commit(revision)
        blob = commit.files.get(path)
        if blob is None:
            raise HubError(404, f"Entry not found: {path}", "EntryNotFound", {"X-Repo-Commit": commit.oid})
        headers = {"X-Repo-Commit": commit.oid, "ETag": f'"{blob.git_oid}"', "Accept-Ranges": "bytes"}
        if blob.lfs:
            headers.update({"X-Linked-Etag": f'"{blob.sha256}"', "X-Linked-Size": str(len(blob.data))})
        return blob.data, headers


REPO = r"(?P<repo_id>[^/]+/[^/]+)"
REVISION = r"(?P<revision>[^/]+)"
ROUTES = [  # method, regex of the URL's path (each group URL-decoded once matched: a revision may hold "/"), method
    ("GET", r"/api/whoami-v2", "whoami"),
    ("POST", r"/api/repos/create", "create_repo"),
    ("POST", r"/api/validate-yaml", "validate_yaml"),
    ("POST", rf"/api/models/{REPO}/preupload/{REVISION}", "preupload"),
    ("POST", rf"/{REPO}\.git/info/lfs/objects/batch", "lfs_batch"),
    ("PUT", rf"/lfs/{REPO}/(?P<oid>[0-9a-f]{{64}})", "lfs_put"),
    ("POST", rf"/lfs/{REPO}/(?P<oid>[0-9a-f]{{64}})/verify", "lfs_verify"),
    ("POST", rf"/api/models/{REPO}/commit/{REVISION}", "commit"),
    ("GET", rf"/api/models/{REPO}(?:/revision/{REVISION})?", "model_info"),
    ("GET", rf"/api/models/{REPO}/tree/{REVISION}(?:/(?P<path>.*))?", "tree"),
    ("GET", rf"/{REPO}/resolve/{REVISION}/(?P<path>.+)", "resolve"),
    ("HEAD", rf"/{REPO}/resolve/{REVISION}/(?P<path>.+)", "resolve"),
]


class _Handler(BaseHTTPRequestHandler):
    """Routes each request to a :class:`LocalHub` method and writes its answer, or a :class:`HubError`, as JSON."""

    protocol_version = "HTTP/1.1"  # keep-alive, as the client's connection pool expects: every answer has a length

    def do_GET(self):
        self._serve()

    do_HEAD = do_POST = do_PUT = do_DELETE = do_GET

    def log_message(self, format, *args):  # the request log is hub.requests, not stderr
        pass

    def authorized(self) -> None:
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            raise HubError(401, "Invalid credentials in Authorization header")

    def body(self) -> bytes:
        """The request body, whole (Content-Length, or chunked as a streamed upload sends it)."""
        if not hasattr(self, "_body"):
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                self._body = b"".join(iter(self._chunk, b""))
            else:
                self._body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        return self._body

    def _chunk(self) -> bytes:
        size = int(self.rfile.readline().split(b";")[0].strip(), 16)
        data = self.rfile.read(size)
        self.rfile.readline()  # the CRLF after each chunk (after the last, empty one: the end of the trailers)
        return data

    def _route(self, path: str):
        for method, pattern, name in ROUTES:
            match = re.fullmatch(pattern, path)
            if match and method == self.command:
                kwargs = {k: unquote(v) for k, v in match.groupdict().items() if v is not None}
                return getattr(self.server.hub, name), kwargs
        raise HubError(404, f"this local Hub serves no {self.command} {path} (tests/hub_server.py ROUTES)")

    def _serve(self):
        url = urlsplit(self.path)
        self.query = parse_qs(url.query)
        self.__dict__.pop("_body", None)  # one handler serves every request of a kept-alive connection
        try:
            method, kwargs = self._route(url.path)
            answer = method(self, **kwargs)
            self.body()  # read what the client sent, even if unused, so the connection stays in step
            if isinstance(answer, tuple):  # a file's content and its headers
                self._answer(200, answer[0], {"Content-Type": "application/octet-stream", **answer[1]})
            else:
                self._answer(200, json.dumps(answer).encode(), {"Content-Type": "application/json"})
        except Exception as err:  # a bug of this Hub: a 500 the test sees, not a dropped connection
            if not isinstance(err, HubError):
                self.server.hub.errors.append(f"{self.command} {self.path}: {err!r}")
                err = HubError(500, f"local Hub error: {err!r}")
            self.body()
            headers = {"Content-Type": "application/json", "X-Error-Message": err.message, **err.headers}
            if err.code:
                headers["X-Error-Code"] = err.code
            self._answer(err.status, json.dumps({"error": err.message, **err.extra}).encode(), headers)

    def _answer(self, status: int, data: bytes, headers: dict) -> None:
        with self.server.hub.lock:
            self.server.hub.requests.append((self.command, urlsplit(self.path).path, status))
        start, end = self._range(len(data)) if status == 200 and self.command == "GET" else (0, len(data))
        self.send_response(206 if (start, end) != (0, len(data)) else status)
        for key, value in headers.items():
            self.send_header(key, value)
        if (start, end) != (0, len(data)):
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
        self.send_header("Content-Length", str(end - start))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data[start:end])

    def _range(self, size: int) -> tuple[int, int]:
        """The bytes a ``Range: bytes=a-[b]`` header asks for (a resumed download), else the whole."""
        match = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        if not match:
            return 0, size
        return int(match[1]), min(size, int(match[2]) + 1) if match[2] else size


@contextlib.contextmanager
def local_hub():
    """A :class:`LocalHub` serving on a free port of 127.0.0.1 in a background thread, stopped on exit."""
    hub = LocalHub()
    hub.thread.start()
    try:
        yield hub
    finally:
        hub.server.shutdown()
        hub.server.server_close()
        hub.thread.join(timeout=10)


if __name__ == "__main__":  # a Hub to try by hand: HF_ENDPOINT=<printed> HF_TOKEN=... HF_HUB_DISABLE_XET=1
    with local_hub() as running:
        print(running.endpoint, "token", TOKEN, flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait(float(os.environ.get("LOCAL_HUB_SECONDS", "inf")))
