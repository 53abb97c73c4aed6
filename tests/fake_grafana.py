"""A loopback stand-in for the parts of Grafana's HTTP API that guardian.grafana uses.

No Grafana server can be installed here (see shared/docs/observability-notes.md §3), so this one
speaks the same wire format: routes, status codes and bodies follow Grafana's HTTP API docs and the
handlers in grafana/grafana ``pkg/api`` (folders, dashboards, annotations). Every answer is
``Content-Type: application/json`` (niquests decodes nothing else). State lives in memory, one org.

Behaviour modelled on Grafana's code, not only its docs:
- A bad or missing bearer token gets 401 on every ``/api`` route except ``/api/health``; the
  viewer token reads but gets 403 on writes.
- ``POST /api/dashboards/db``: without ``overwrite`` a stored uid whose ``version`` differs from the
  posted one is 412 ``version-mismatch``; a title used by another uid in the same folder is 412
  ``name-exists``; each save bumps the version; a missing ``folderUid`` moves the dashboard to the
  root; an unknown ``folderUid`` is 400.
- ``POST /api/folders``: a used uid or title is 409.
- ``POST /api/annotations``: empty text is 400; an unknown ``dashboardUID`` is dropped (org-wide);
  ``timeEnd`` null/0 means a point (timeEnd = time).
- ``PATCH /api/annotations/{id}``: a present ``tags`` replaces the tags (even ``[]``); ``text`` ""/null
  and ``time``/``timeEnd`` 0/null leave the field alone.

Test knobs: ``fail_next(n, status)`` answers the next n requests with a 5xx; ``delay_s`` delays every
answer (for timeouts); ``requests`` records method, path, query, headers and JSON body of each call.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

TOKEN = "glsa_fake_editor_token_4f1d"
VIEWER_TOKEN = "glsa_fake_viewer_token_9c2e"

Answer = tuple[int, Any]


@dataclass(frozen=True)
class Recorded:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: Any


def _slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


def _denied(permission: str) -> Answer:
    return 403, {
        "accessErrorId": "ACE0000000001",
        "message": f"You'll need additional permissions to perform this action. Permissions needed: {permission}",
        "title": "Access denied",
    }


class FakeGrafana:
    """The server and its state. ``url`` is ``http://127.0.0.1:<port>`` once started."""

    def __init__(self, token: str = TOKEN, viewer_token: str = VIEWER_TOKEN, version: str = "11.6.0") -> None:
        self.token = token
        self.viewer_token = viewer_token
        self.version = version
        self.delay_s = 0.0
        self.requests: list[Recorded] = []
        self.folders: dict[str, dict[str, Any]] = {}
        self.dashboards: dict[str, dict[str, Any]] = {}  # uid -> {"dashboard", "folderUid", "version", "id"}
        self.annotations: dict[int, dict[str, Any]] = {}
        self._failures: list[int] = []
        self._next_id = 1
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._server: ThreadingHTTPServer | None = None

    # ----------------------------------------------------------------- lifecycle and knobs
    def start(self) -> FakeGrafana:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                fake._handle_http(self)

            do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _serve

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

        class Server(ThreadingHTTPServer):
            def handle_error(self, request: Any, client_address: Any) -> None:  # client gave up (timeouts)
                pass

        self._server = Server(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    @property
    def url(self) -> str:
        assert self._server is not None, "start() first"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def fail_next(self, n: int, status: int = 500) -> None:
        with self._lock:
            self._failures.extend([status] * n)

    def calls(self, method: str, path_prefix: str = "") -> list[Recorded]:
        return [r for r in self.requests if r.method == method and r.path.startswith(path_prefix)]

    # ----------------------------------------------------------------- HTTP plumbing
    def _handle_http(self, h: BaseHTTPRequestHandler) -> None:
        split = urlsplit(h.path)
        raw = h.rfile.read(int(h.headers.get("Content-Length") or 0))
        try:
            body: Any = json.loads(raw) if raw else None
            bad_json = False
        except ValueError:
            body, bad_json = raw.decode("utf-8", "replace"), True
        with self._lock:
            self.requests.append(Recorded(h.command, split.path, parse_qs(split.query), dict(h.headers.items()), body))
            failure = self._failures.pop(0) if self._failures else None
        if self.delay_s:
            self._stop.wait(self.delay_s)
        if failure is not None:
            status, answer = failure, {"message": "Internal Server Error"}
        elif bad_json:
            status, answer = 400, {"message": "bad request data"}
        else:
            with self._lock:
                status, answer = self.handle(
                    h.command, split.path, parse_qs(split.query), h.headers.get("Authorization"), body
                )
        payload = json.dumps(answer).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(payload)))
        h.end_headers()
        h.wfile.write(payload)

    # ----------------------------------------------------------------- the API
    def handle(self, method: str, path: str, query: dict[str, list[str]], auth: str | None, body: Any) -> Answer:
        """One request -> (status, JSON body). Routes as Grafana registers them (trailing slash optional)."""
        path = path.rstrip("/")
        if method == "GET" and path == "/api/health":
            return 200, {"commit": "fake", "database": "ok", "version": self.version}
        if auth not in (f"Bearer {self.token}", f"Bearer {self.viewer_token}"):
            return 401, {"message": "Unauthorized"}
        viewer = auth == f"Bearer {self.viewer_token}"
        if method != "GET" and viewer:
            return _denied({"/api/folders": "folders:create"}.get(path, "dashboards:write"))
        if method == "GET" and path == "/api/frontend/settings":
            return 200, {"buildInfo": {"version": self.version, "commit": "fake", "env": "production"}}
        if path == "/api/folders":
            if method == "POST":
                return self._create_folder(body)
            return 200, [{"id": f["id"], "uid": f["uid"], "title": f["title"]} for f in self.folders.values()]
        if method == "GET" and (m := re.fullmatch(r"/api/folders/([^/]+)", path)):
            folder = self.folders.get(m[1])
            return (200, folder) if folder else (404, {"status": "not-found", "message": "folder not found"})
        if method == "POST" and path == "/api/dashboards/db":
            return self._save_dashboard(body)
        if method == "GET" and (m := re.fullmatch(r"/api/dashboards/uid/([^/]+)", path)):
            return self._get_dashboard(m[1])
        if method == "POST" and path == "/api/annotations":
            return self._add_annotation(body)
        if method == "GET" and path == "/api/annotations":
            return self._find_annotations(query)
        if method == "PATCH" and (m := re.fullmatch(r"/api/annotations/(\d+)", path)):
            return self._patch_annotation(int(m[1]), body)
        return 404, {"message": "Not found"}

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id - 1

    def _create_folder(self, body: Any) -> Answer:
        if not isinstance(body, dict) or not isinstance(body.get("title"), str) or not body["title"]:
            return 400, {"message": "folder title cannot be empty"}
        uid = body.get("uid") or f"f{self._next_id:09d}"
        if uid in self.folders or uid in self.dashboards:
            return 409, {"message": "A folder/dashboard with the same uid already exists"}
        if any(f["title"] == body["title"] for f in self.folders.values()):
            return 409, {"message": "a folder with the same name already exists"}
        folder = {
            "id": self._new_id(),
            "uid": uid,
            "title": body["title"],
            "url": f"/dashboards/f/{uid}/{_slug(body['title'])}",
            "hasAcl": False,
            "canSave": True,
            "canEdit": True,
            "canAdmin": True,
            "createdBy": "sa-guardian",
            "created": "2026-01-01T00:00:00Z",
            "updatedBy": "sa-guardian",
            "updated": "2026-01-01T00:00:00Z",
            "version": 1,
        }
        self.folders[uid] = folder
        return 200, folder

    def _save_dashboard(self, body: Any) -> Answer:
        if not isinstance(body, dict) or not isinstance(body.get("dashboard"), dict):
            return 400, {"message": "bad request data"}
        dash = dict(body["dashboard"])
        title = dash.get("title")
        if not isinstance(title, str) or not title.strip():
            return 400, {"message": "Dashboard title cannot be empty"}
        folder_uid = body.get("folderUid") or ""
        if folder_uid and folder_uid not in self.folders:
            return 400, {"message": "folder not found"}
        if not dash.get("uid") and dash.get("id"):  # the docs' update example names the dashboard by id
            by_id = [u for u, d in self.dashboards.items() if d["id"] == dash["id"]]
            if not by_id:
                return 404, {"status": "not-found", "message": "Dashboard not found"}
            dash["uid"] = by_id[0]
        uid = dash.get("uid") or f"d{self._next_id:09d}"
        if not isinstance(uid, str) or len(uid) > 40:
            return 400, {"message": "uid too long, max 40 characters"}
        overwrite = bool(body.get("overwrite"))
        old = self.dashboards.get(uid)
        if old and not overwrite and dash.get("version") != old["version"]:
            return 412, {"status": "version-mismatch", "message": "The dashboard has been changed by someone else"}
        same_title = [
            u
            for u, d in self.dashboards.items()
            if u != uid and d["folderUid"] == folder_uid and d["dashboard"]["title"].lower() == title.lower()
        ]
        if same_title and not overwrite:
            return 412, {
                "status": "name-exists",
                "message": "A dashboard with the same name in the folder already exists",
            }
        version = old["version"] + 1 if old else 1
        dash_id = old["id"] if old else self._new_id()
        dash.update(id=dash_id, uid=uid, version=version)
        self.dashboards[uid] = {"dashboard": dash, "folderUid": folder_uid, "version": version, "id": dash_id}
        slug = _slug(title)
        return 200, {
            "id": dash_id,
            "uid": uid,
            "url": f"/d/{uid}/{slug}",
            "status": "success",
            "version": version,
            "slug": slug,
            "folderUid": folder_uid,
        }

    def _get_dashboard(self, uid: str) -> Answer:
        stored = self.dashboards.get(uid)
        if stored is None:
            return 404, {"message": "Dashboard not found"}
        folder = self.folders.get(stored["folderUid"])
        slug = _slug(stored["dashboard"]["title"])
        meta = {
            "isStarred": False,
            "type": "db",
            "slug": slug,
            "url": f"/d/{uid}/{slug}",
            "version": stored["version"],
            "folderId": folder["id"] if folder else 0,
            "folderUid": stored["folderUid"],
            "folderTitle": folder["title"] if folder else "General",
        }
        return 200, {"dashboard": stored["dashboard"], "meta": meta}

    def _add_annotation(self, body: Any) -> Answer:
        if not isinstance(body, dict):
            return 400, {"message": "bad request data"}
        if not body.get("text"):
            return 400, {"message": "Failed to save annotation"}
        start = body.get("time") or int(time.time() * 1000)
        dash_uid = body.get("dashboardUID")
        known = dash_uid in self.dashboards
        item = {
            "id": self._new_id(),
            "alertId": 0,
            "dashboardId": self.dashboards[dash_uid]["id"] if known else 0,
            "dashboardUID": dash_uid if known else None,
            "panelId": body.get("panelId") or 0,
            "userId": 1,
            "newState": "",
            "prevState": "",
            "time": start,
            "timeEnd": body.get("timeEnd") or start,
            "tags": list(body.get("tags") or []),
            "text": body["text"],
            "metric": "",
            "data": {},
        }
        self.annotations[item["id"]] = item
        return 200, {"message": "Annotation added", "id": item["id"]}

    def _find_annotations(self, query: dict[str, list[str]]) -> Answer:
        wanted = query.get("tags", [])
        match_any = query.get("matchAny", ["false"])[0] == "true"
        items = list(self.annotations.values())
        if wanted:
            test = any if match_any else all
            items = [a for a in items if test(t in a["tags"] for t in wanted)]
        if "dashboardUID" in query:
            items = [a for a in items if a["dashboardUID"] == query["dashboardUID"][0]]
        items.sort(key=lambda a: a["time"], reverse=True)
        return 200, items[: int(query.get("limit", ["100"])[0])]

    def _patch_annotation(self, annotation_id: int, body: Any) -> Answer:
        item = self.annotations.get(annotation_id)
        if item is None:
            return 404, {"message": "Annotation not found"}
        if not isinstance(body, dict):
            return 400, {"message": "bad request data"}
        if body.get("tags") is not None:
            item["tags"] = list(body["tags"])
        if body.get("text"):
            item["text"] = body["text"]
        if body.get("time"):
            item["time"] = body["time"]
        if body.get("timeEnd"):
            item["timeEnd"] = body["timeEnd"]
        return 200, {"message": "Annotation patched"}


@pytest.fixture(name="fake_grafana")
def fake_grafana_fixture() -> Iterator[FakeGrafana]:
    """A started fake (registered for every test module by conftest.py)."""
    server = FakeGrafana().start()
    try:
        yield server
    finally:
        server.stop()
