"""A stand-in for the Hugging Face Hub on 127.0.0.1, for tests that run the real `huggingface_hub`
client end to end (HF_ENDPOINT pointed here). It serves the routes the client calls:

- GET  /api/models/{repo}[/revision/{rev}] repository info: sha, siblings
- GET  /api/models/{repo}/tree/{rev}       the file listing (recursive)
- HEAD /{repo}/resolve/{rev}/{path}        X-Repo-Commit, ETag, Content-Length (X-Linked-* for large files)
- GET  /{repo}/resolve/{rev}/{path}        the bytes, with Range requests (resumed downloads)

and the Hub's errors as it answers them (X-Error-Code RepoNotFound, RevisionNotFound,
EntryNotFound, GatedRepo). A repository may be private (a token is required), gated (files need a
token), and a file may be cut short once (the connection closes part-way, as a dropped network
does) or sent slowly. Every request is logged.
"""

import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

LFS_FROM = 1 << 10  # files at least this large are served as LFS files (X-Linked-Size / X-Linked-Etag)


@dataclass
class Repo:
    files: dict[str, bytes]
    revisions: dict[str, str] = field(default_factory=dict)  # name (branch or tag) -> commit sha
    private: bool = False
    gated: bool = False
    cut_once: dict[str, int] = field(default_factory=dict)  # path -> bytes to send before dropping, once
    slow: dict[str, float] = field(default_factory=dict)  # path -> seconds to wait before each 64 KiB sent

    def __post_init__(self):
        if not self.revisions:
            self.revisions = {"main": hashlib.sha1(json.dumps(sorted(self.files)).encode()
                                                   + b"".join(self.files[f] for f in sorted(self.files))).hexdigest()}

    def sha(self, rev: str) -> str | None:
        if rev in self.revisions:
            return self.revisions[rev]
        return rev if rev in self.revisions.values() else None


def folder_files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(Path(folder).iterdir()) if p.is_file()}


class HubStandIn:
    TOKEN = "hf_standin_token"

    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.log: list[tuple[str, str, str | None]] = []  # (method, path, Range header)
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_HEAD(self):
                hub.handle(self, head=True)

            def do_GET(self):
                hub.handle(self, head=False)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.handle_error = lambda request, address: None  # a client that hung up (a killed download)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def downloads(self) -> list[str]:
        """Paths of the files served with a body (GET .../resolve/...)."""
        return [p.split("/resolve/", 1)[1].split("/", 1)[1] for m, p, _ in self.log if m == "GET" and "/resolve/" in p]

    # -- routing -------------------------------------------------------------------------------
    def handle(self, h: BaseHTTPRequestHandler, head: bool) -> None:
        path = unquote(urlparse(h.path).path)
        self.log.append((h.command, path, h.headers.get("Range")))
        authorised = h.headers.get("Authorization") == f"Bearer {self.TOKEN}"
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) == 4:  # the default branch's info
            parts += ["revision", "main"]
        if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] in ("revision", "tree"):
            repo_id, what, rev = "/".join(parts[2:4]), parts[4], parts[5]
            found = self._revision(h, repo_id, rev, authorised)
            if found is None:
                return
            repo, sha = found
            if what == "revision":
                body = {"id": repo_id, "modelId": repo_id, "sha": sha, "private": repo.private,
                        "gated": "auto" if repo.gated else False, "siblings": [{"rfilename": f} for f in repo.files]}
            else:
                body = [self._entry(f, data) for f, data in repo.files.items()]
            return self._json(h, body, head)
        if len(parts) >= 5 and parts[2] == "resolve":
            repo_id, rev, file = "/".join(parts[:2]), parts[3], "/".join(parts[4:])
            found = self._revision(h, repo_id, rev, authorised)
            if found is None:
                return
            repo, sha = found
            if repo.gated and not authorised:
                return self._error(h, 403, "GatedRepo", "Access to this model is restricted")
            if file not in repo.files:
                return self._error(h, 404, "EntryNotFound", f"{file} does not exist")
            return self._file(h, repo, sha, file, head)
        return self._error(h, 404, None, "Not Found")

    def _revision(self, h, repo_id: str, rev: str, authorised: bool) -> tuple[Repo, str] | None:
        """The repository and the commit `rev` names, or None with the Hub's error answered."""
        repo = self.repos.get(repo_id)
        if repo is None or (repo.private and not authorised):
            self._error(h, 401, "RepoNotFound", "Repository not found")
            return None
        sha = repo.sha(rev)
        if sha is None:
            self._error(h, 404, "RevisionNotFound", f"Invalid rev id: {rev}")
            return None
        return repo, sha

    @staticmethod
    def _entry(f: str, data: bytes) -> dict:
        entry = {"type": "file", "path": f, "size": len(data), "oid": hashlib.sha1(data).hexdigest()}
        if len(data) >= LFS_FROM:
            entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
        return entry

    def _file(self, h, repo: Repo, sha: str, file: str, head: bool) -> None:
        data = repo.files[file]
        etag = hashlib.sha256(data).hexdigest() if len(data) >= LFS_FROM else hashlib.sha1(data).hexdigest()
        start = 0
        rng = h.headers.get("Range")
        if rng and rng.startswith("bytes=") and not head:
            start = int(rng[6:].split("-")[0] or 0)
        body = data[start:]
        h.send_response(206 if start else 200)
        h.send_header("X-Repo-Commit", sha)
        h.send_header("ETag", f'"{etag}"')
        if len(data) >= LFS_FROM:
            h.send_header("X-Linked-Etag", f'"{etag}"')
            h.send_header("X-Linked-Size", str(len(data)))
        h.send_header("Content-Length", str(len(body) if not head else len(data)))
        h.send_header("Accept-Ranges", "bytes")
        if start:
            h.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        h.end_headers()
        if head:
            return
        cut = repo.cut_once.pop(file, None)
        if cut is not None and cut < len(body):  # a dropped connection part-way through the file
            h.wfile.write(body[:cut])
            h.wfile.flush()
            h.close_connection = True
            h.connection.shutdown(2)
            return
        pause = repo.slow.get(file)
        step = 1 << 16 if pause else len(body) or 1
        for i in range(0, len(body), step):
            if pause:
                time.sleep(pause)
            h.wfile.write(body[i : i + step])
            h.wfile.flush()

    @staticmethod
    def _json(h, body, head: bool) -> None:
        raw = json.dumps(body).encode()
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(raw)))
        h.end_headers()
        if not head:
            h.wfile.write(raw)

    @staticmethod
    def _error(h, status: int, code: str | None, message: str) -> None:
        raw = json.dumps({"error": message}).encode()
        h.send_response(status)
        if code:
            h.send_header("X-Error-Code", code)
            h.send_header("X-Error-Message", message)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(raw)))
        h.end_headers()
        h.wfile.write(raw)
