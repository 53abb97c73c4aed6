"""guardian.dashboards.grafana through the real grafana-client (niquests) against the loopback fake Grafana."""

from __future__ import annotations

import http.client
import json
import logging
import threading
import time
import traceback
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
from conftest import free_port
from fake_grafana import TOKEN, VIEWER_TOKEN, FakeGrafana
from grafana_client.api import GrafanaApi

from guardian.dashboards import grafana as g

FOLDER = "RL Guardian"
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z in ms


def dashboard(uid: str = "rlguard-overview", title: str = "RL guardian overview", **extra: Any) -> dict[str, Any]:
    return {"uid": uid, "title": title, "schemaVersion": 41, "panels": [], **extra}


@pytest.fixture
def api(fake_grafana: FakeGrafana) -> Iterator[GrafanaApi]:
    client = g.connect(fake_grafana.url, g.Secret(TOKEN), timeout_s=5)
    yield client
    g.close(client)


def client_for(fake: FakeGrafana, token: str, timeout_s: float = 5) -> GrafanaApi:
    return g.connect(fake.url, token, timeout_s=timeout_s)


def assert_no_secret(secret: str, *texts: str) -> None:
    for text in texts:
        assert secret not in text


# --------------------------------------------------------------------------- token handling
def test_secret_never_shows_its_value() -> None:
    s = g.Secret("glsa_abc")
    assert repr(s) == str(s) == f"{s}" == "***"
    assert "glsa_abc" not in repr([s]) and "glsa_abc" not in repr({"token": s})
    assert s.reveal() == "glsa_abc"


def test_load_token_from_file_strips_whitespace(tmp_path: Path) -> None:
    f = tmp_path / "token"
    f.write_text("  glsa_file_token\n")
    assert g.load_token(f, {"GRAFANA_TOKEN": "glsa_env"}).reveal() == "glsa_file_token"  # the file wins


def test_load_token_from_env() -> None:
    assert g.load_token(None, {"GRAFANA_TOKEN": " glsa_env\n"}).reveal() == "glsa_env"


@pytest.mark.parametrize(
    ("setup", "expected"),
    [
        ("missing", "does not exist"),
        ("empty", "is empty"),
        ("directory", "cannot read Grafana token file"),
        ("binary", "not UTF-8"),
        ("inner_space", "whitespace inside"),
    ],
)
def test_load_token_file_errors_name_the_file(tmp_path: Path, setup: str, expected: str) -> None:
    f = tmp_path / "grafana.token"
    if setup == "empty":
        f.write_text(" \n")
    elif setup == "directory":
        f.mkdir()
    elif setup == "binary":
        f.write_bytes(b"\xff\xfe\x00")
    elif setup == "inner_space":
        f.write_text("glsa_part1 part2\n")
    with pytest.raises(g.GrafanaError, match=expected) as info:
        g.load_token(f, {"GRAFANA_TOKEN": "glsa_env"})  # never falls back to the environment
    assert str(f) in str(info.value)
    assert_no_secret("part1", str(info.value))


def test_load_token_neither_source() -> None:
    with pytest.raises(g.GrafanaError, match="GRAFANA_TOKEN"):
        g.load_token(None, {})


# --------------------------------------------------------------------------- connect / version
def test_connect_and_version_sends_bearer_token(fake_grafana: FakeGrafana) -> None:
    client = g.connect(fake_grafana.url, g.Secret(TOKEN), timeout_s=5, org_id=3)
    try:
        assert g.server_version(client) == "11.6.0"
    finally:
        g.close(client)
    (call,) = fake_grafana.calls("GET", "/api/frontend/settings")
    assert call.headers["Authorization"] == f"Bearer {TOKEN}"
    assert call.headers["X-Grafana-Org-Id"] == "3"
    assert_no_secret(TOKEN, repr(client.client.auth), repr(vars(client.client)))


@pytest.mark.parametrize("url", ["ftp://grafana:3000", "grafana:3000", "http://", "localhost"])
def test_connect_rejects_non_http_urls(url: str) -> None:
    with pytest.raises(g.GrafanaError, match="http:// or https://"):
        g.connect(url, "t", timeout_s=1)


def test_connect_keeps_a_path_prefix() -> None:
    client = g.connect("https://example.org/grafana", "t", timeout_s=1)
    assert client.client.url == "https://example.org/grafana/api"
    g.close(client)


# --------------------------------------------------------------------------- dashboards
def test_push_creates_folder_and_dashboard(api: GrafanaApi, fake_grafana: FakeGrafana) -> None:
    (result,) = g.push_dashboards(api, [dashboard()], folder_title=FOLDER, message="guardian 0.1.0")
    assert result == g.PushResult(
        uid="rlguard-overview", url="/d/rlguard-overview/rl-guardian-overview", version=1, status="success"
    )
    assert list(fake_grafana.folders) == [g.folder_uid(FOLDER)] == ["rl-guardian"]
    assert fake_grafana.folders["rl-guardian"]["title"] == FOLDER
    stored = api.dashboard.get_dashboard("rlguard-overview")
    assert stored["meta"]["folderUid"] == "rl-guardian"
    assert stored["dashboard"]["version"] == 1


def test_second_push_updates_in_place(
    api: GrafanaApi, fake_grafana: FakeGrafana, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="guardian.grafana")
    boards = [dashboard(), dashboard("rlguard-runs", "RL guardian runs")]
    first = g.push_dashboards(api, boards, folder_title=FOLDER, message="push 1")
    second = g.push_dashboards(api, boards, folder_title=FOLDER, message="push 2")
    assert [r.uid for r in second] == [r.uid for r in first] == ["rlguard-overview", "rlguard-runs"]
    assert [r.version for r in second] == [2, 2]
    assert len(fake_grafana.folders) == 1 and len(fake_grafana.dashboards) == 2
    assert len(fake_grafana.calls("POST", "/api/folders")) == 1
    posts = fake_grafana.calls("POST", "/api/dashboards/db")
    assert len(posts) == 4
    for call in posts:
        assert call.body["folderUid"] == "rl-guardian"
        assert call.body["overwrite"] is True
        assert call.body["dashboard"]["id"] is None
    assert [c.body["message"] for c in posts] == ["push 1", "push 1", "push 2", "push 2"]
    assert "event=grafana_dashboard_pushed uid=rlguard-runs version=2 folder=rl-guardian" in caplog.text


def test_push_adopts_a_hand_made_folder_of_the_same_title(api: GrafanaApi, fake_grafana: FakeGrafana) -> None:
    api.folder.create_folder(FOLDER, uid="made-by-hand")
    (result,) = g.push_dashboards(api, [dashboard()], folder_title=FOLDER, message="m")
    assert result.version == 1
    assert fake_grafana.dashboards["rlguard-overview"]["folderUid"] == "made-by-hand"
    assert len(fake_grafana.folders) == 1


def test_long_or_symbolic_titles_give_valid_folder_uids() -> None:
    long_uid = g.folder_uid("x" * 80)
    assert len(long_uid) <= 40 and long_uid != g.folder_uid("x" * 81)
    assert g.folder_uid("日本").startswith("folder-")
    assert g.folder_uid("RL Guardian") == g.folder_uid("RL Guardian")


@pytest.mark.parametrize("bad", [{"title": "no uid"}, {"uid": "", "title": "t"}, {"uid": "u" * 41, "title": "t"}])
def test_push_requires_a_uid(api: GrafanaApi, fake_grafana: FakeGrafana, bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="uid"):
        g.push_dashboards(api, [bad], folder_title=FOLDER, message="m")
    assert fake_grafana.requests == []


def test_push_with_overwrite_false_surfaces_412(api: GrafanaApi, fake_grafana: FakeGrafana) -> None:
    g.push_dashboards(api, [dashboard()], folder_title=FOLDER, message="m")
    with pytest.raises(g.GrafanaError, match="412 version-mismatch") as info:
        g.push_dashboards(api, [dashboard(version=0)], folder_title=FOLDER, message="m", overwrite=False)
    assert info.value.status == 412 and not info.value.retryable
    assert "overwrite" in str(info.value)
    with pytest.raises(g.GrafanaError, match=r"412 name-exists.*rename"):
        g.push_dashboards(api, [dashboard(uid="other")], folder_title=FOLDER, message="m", overwrite=False)
    (current,) = g.push_dashboards(api, [dashboard(version=1)], folder_title=FOLDER, message="m", overwrite=False)
    assert current.version == 2


# --------------------------------------------------------------------------- failures
def test_bad_token_is_401_with_hint_and_no_token(fake_grafana: FakeGrafana, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    bad = "glsa_WRONG_do_not_leak_7f3a"
    client = client_for(fake_grafana, bad)
    try:
        with pytest.raises(g.GrafanaError) as info:
            g.push_dashboards(client, [dashboard()], folder_title=FOLDER, message="m")
    finally:
        g.close(client)
    err = info.value
    assert err.status == 401 and not err.retryable
    assert "token rejected" in str(err) and "GRAFANA_TOKEN" in str(err)
    assert fake_grafana.calls("GET", "/api/folders")[0].headers["Authorization"] == f"Bearer {bad}"
    chain = "".join(traceback.format_exception(err))
    assert_no_secret(bad, str(err), repr(err), chain, caplog.text)


def test_viewer_token_is_403(fake_grafana: FakeGrafana) -> None:
    fake_grafana.folders["rl-guardian"] = {"id": 1, "uid": "rl-guardian", "title": FOLDER}
    client = client_for(fake_grafana, VIEWER_TOKEN)
    try:
        assert g.server_version(client) == "11.6.0"  # reading works
        with pytest.raises(g.GrafanaError, match=r"lacks permission \(403\).*Editor on folder 'RL Guardian'") as info:
            g.push_dashboards(client, [dashboard()], folder_title=FOLDER, message="m")
        assert info.value.status == 403
        with pytest.raises(g.GrafanaError, match="403"):
            g.add_annotation(client, time_ms=T0, time_end_ms=None, tags=["rlguard"], text="x")
    finally:
        g.close(client)
    assert_no_secret(VIEWER_TOKEN, str(info.value))


def test_unreachable_url_fails_fast() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    client = g.connect(url, "glsa_x", timeout_s=2)
    started = time.monotonic()
    try:
        with pytest.raises(g.GrafanaError, match=f"Grafana unreachable at {url}") as info:
            g.server_version(client)
    finally:
        g.close(client)
    assert time.monotonic() - started < 2
    assert info.value.retryable and info.value.status is None


def test_slow_grafana_times_out(fake_grafana: FakeGrafana) -> None:
    fake_grafana.delay_s = 3
    client = client_for(fake_grafana, TOKEN, timeout_s=0.3)
    started = time.monotonic()
    try:
        with pytest.raises(g.GrafanaError, match=r"unreachable .*no answer within 0\.3s") as info:
            g.add_annotation(client, time_ms=T0, time_end_ms=None, tags=["rlguard"], text="x")
    finally:
        g.close(client)
    assert time.monotonic() - started < 2.5
    assert info.value.retryable


def test_server_error_is_surfaced_not_retried(api: GrafanaApi, fake_grafana: FakeGrafana) -> None:
    fake_grafana.fail_next(1, 503)
    with pytest.raises(g.GrafanaError, match="server error 503") as info:
        g.add_annotation(api, time_ms=T0, time_end_ms=None, tags=["rlguard"], text="x")
    assert info.value.status == 503 and info.value.retryable
    assert len(fake_grafana.requests) == 1  # one attempt only: retries belong to the caller
    assert g.add_annotation(api, time_ms=T0, time_end_ms=None, tags=["rlguard"], text="x") > 0


def test_too_many_requests_is_retryable_a_bad_request_is_not(api: GrafanaApi, fake_grafana: FakeGrafana) -> None:
    fake_grafana.fail_next(1, 429)
    with pytest.raises(g.GrafanaError, match="429") as busy:
        g.add_annotation(api, time_ms=T0, time_end_ms=None, tags=["rlguard"], text="x")
    fake_grafana.fail_next(1, 400)
    with pytest.raises(g.GrafanaError, match="400") as refused:
        g.add_annotation(api, time_ms=T0, time_end_ms=None, tags=["rlguard"], text="x")
    assert (busy.value.status, busy.value.retryable) == (429, True)
    assert (refused.value.status, refused.value.retryable) == (400, False)


def test_tls_to_a_plain_http_grafana_is_not_retryable(fake_grafana: FakeGrafana) -> None:
    client = g.connect(fake_grafana.url.replace("http://", "https://"), TOKEN, timeout_s=2)
    try:
        with pytest.raises(g.GrafanaError, match="unreachable") as info:
            g.server_version(client)
    finally:
        g.close(client)
    assert not info.value.retryable and info.value.status is None  # the same handshake fails every time


def test_a_url_that_is_not_grafana() -> None:
    class Html(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(b"<html>login</html>")

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Html)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    client = g.connect(f"http://127.0.0.1:{server.server_address[1]}", "glsa_x", timeout_s=2)
    try:
        with pytest.raises(g.GrafanaError, match="answered with text, not JSON"):
            g.server_version(client)
    finally:
        g.close(client)
        server.shutdown()
        server.server_close()


def test_error_messages_hide_url_credentials() -> None:
    client = g.connect(f"http://admin:pw-secret@127.0.0.1:{free_port()}", "glsa_x", timeout_s=1)
    try:
        with pytest.raises(g.GrafanaError) as info:
            g.server_version(client)
    finally:
        g.close(client)
    assert "pw-secret" not in str(info.value) and "127.0.0.1" in str(info.value)


# --------------------------------------------------------------------------- annotations
def test_annotation_region_open_then_closed(api: GrafanaApi, fake_grafana: FakeGrafana) -> None:
    g.push_dashboards(api, [dashboard()], folder_title=FOLDER, message="m")
    tags = ["rlguard", "Run:My Run/7", "sev:critical", "rlguard"]
    ann_id = g.add_annotation(
        api, time_ms=T0, time_end_ms=None, tags=tags, text="entropy collapse", dashboard_uid="rlguard-overview"
    )
    (post,) = fake_grafana.calls("POST", "/api/annotations")
    assert post.body["tags"] == ["rlguard", "Run:My_Run_7", "sev:critical"]
    assert post.body["time"] == T0 and post.body["timeEnd"] is None
    assert post.body["dashboardUID"] == "rlguard-overview"

    g.close_region(api, ann_id, T0 + 60_000)
    (patch,) = fake_grafana.calls("PATCH")
    assert patch.path == f"/api/annotations/{ann_id}" and patch.body == {"timeEnd": T0 + 60_000}

    (found,) = api.annotations.find_annotations(tags=["rlguard", "Run:My_Run_7"])
    assert found["id"] == ann_id and found["dashboardUID"] == "rlguard-overview"
    assert (found["time"], found["timeEnd"]) == (T0, T0 + 60_000)
    assert found["tags"] == ["rlguard", "Run:My_Run_7", "sev:critical"]  # closing kept the tags


def test_client_partial_update_would_strip_tags(api: GrafanaApi, fake_grafana: FakeGrafana) -> None:
    """Why close_region sends its own PATCH: the client's helper always sends ``"tags": []``."""
    ann_id = g.add_annotation(api, time_ms=T0, time_end_ms=None, tags=["rlguard"], text="x")
    api.annotations.partial_update_annotation(ann_id, time_to=T0 + 1000)
    assert fake_grafana.annotations[ann_id]["tags"] == []


def test_point_and_org_wide_annotation(api: GrafanaApi, fake_grafana: FakeGrafana) -> None:
    ann_id = g.add_annotation(api, time_ms=T0, time_end_ms=T0, tags=["stop"], text="training stopped")
    (post,) = fake_grafana.calls("POST", "/api/annotations")
    assert "dashboardUID" not in post.body
    assert fake_grafana.annotations[ann_id]["dashboardUID"] is None


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"time_ms": 1_767_225_600}, "epoch milliseconds"),
        ({"time_end_ms": T0 - 1}, "before"),
        ({"text": ""}, "text"),
        ({"tags": ["???"]}, "no usable characters"),
    ],
)
def test_add_annotation_rejects_bad_input(api: GrafanaApi, kwargs: dict[str, Any], match: str) -> None:
    args: dict[str, Any] = {"time_ms": T0, "time_end_ms": None, "tags": ["rlguard"], "text": "x", **kwargs}
    with pytest.raises(ValueError, match=match):
        g.add_annotation(api, **args)


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("rlguard", "rlguard"),
        ("Sev:CRITICAL", "Sev:CRITICAL"),
        ("run:Qwen2.5-7B-grpo-1a2b", "run:Qwen2.5-7B-grpo-1a2b"),
        ("run:exp 1/seed=2", "run:exp_1_seed_2"),
        ("Entropía", "Entropia"),
        ("  padded  ", "padded"),
        ("a&b?c#d", "a_b_c_d"),
        ("x" * 300, "x" * 100),
    ],
)
def test_tag_sanitiser(raw: str, clean: str) -> None:
    assert g.tag(raw) == clean


# --------------------------------------------------------------------------- the fake vs. Grafana's docs
def raw_call(fake: FakeGrafana, method: str, path: str, body: Any = None, token: str = TOKEN) -> tuple[int, Any]:
    """One request without grafana-client, checking the wire format every answer must have."""
    conn = http.client.HTTPConnection("127.0.0.1", int(fake.url.rsplit(":", 1)[1]), timeout=5)
    try:
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        conn.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
        response = conn.getresponse()
        assert response.getheader("Content-Type") == "application/json"
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def test_fake_answers_the_docs_examples(fake_grafana: FakeGrafana) -> None:
    """Request and response bodies hand-copied from grafana/grafana docs/sources/developers/http_api
    (folder.md, dashboard.md, annotations.md); ids and generated uids differ by nature."""
    status, folder = raw_call(fake_grafana, "POST", "/api/folders", {"uid": "nErXDvCkzz", "title": "Department ABC"})
    assert status == 200
    assert {k: folder[k] for k in ("uid", "title", "url", "version")} == {
        "uid": "nErXDvCkzz",
        "title": "Department ABC",
        "url": "/dashboards/f/nErXDvCkzz/department-abc",
        "version": 1,
    }
    assert set(folder) >= {"id", "hasAcl", "canSave", "canEdit", "canAdmin", "createdBy", "created", "updated"}
    assert raw_call(fake_grafana, "POST", "/api/folders", {"uid": "nErXDvCkzz", "title": "X"})[0] == 409
    assert raw_call(fake_grafana, "GET", "/api/folders") == (
        200,
        [{"id": folder["id"], "uid": "nErXDvCkzz", "title": "Department ABC"}],
    )

    new = {
        "dashboard": {
            "id": None,
            "uid": None,
            "title": "Production Overview",
            "tags": ["templated"],
            "timezone": "browser",
            "schemaVersion": 16,
            "refresh": "25s",
        },
        "folderUid": "nErXDvCkzz",
        "message": "Made changes to xyz",
        "overwrite": False,
    }
    status, created = raw_call(fake_grafana, "POST", "/api/dashboards/db", new)
    assert status == 200
    assert set(created) >= {"id", "uid", "url", "status", "version", "slug"}
    assert (created["status"], created["version"], created["slug"]) == ("success", 1, "production-overview")
    assert created["url"] == f"/d/{created['uid']}/production-overview"

    update = {
        "dashboard": {
            "id": created["id"],
            "title": "Production Overview Updated",
            "tags": ["templated"],
            "timezone": "browser",
            "schemaVersion": 16,
            "version": 1,
            "refresh": "25s",
        },
        "folderUid": "nErXDvCkzz",
        "message": "Made changes to xyz",
        "overwrite": False,
    }
    status, updated = raw_call(fake_grafana, "POST", "/api/dashboards/db", update)
    assert status == 200
    assert (updated["uid"], updated["version"]) == (created["uid"], 2)
    assert updated["url"] == f"/d/{created['uid']}/production-overview-updated"
    assert raw_call(fake_grafana, "POST", "/api/dashboards/db", update) == (
        412,
        {"message": "The dashboard has been changed by someone else", "status": "version-mismatch"},
    )

    status, got = raw_call(fake_grafana, "GET", f"/api/dashboards/uid/{created['uid']}")
    assert status == 200 and got["dashboard"]["title"] == "Production Overview Updated"
    assert {k: got["meta"][k] for k in ("isStarred", "url", "folderUid", "slug")} == {
        "isStarred": False,
        "url": updated["url"],
        "folderUid": "nErXDvCkzz",
        "slug": "production-overview-updated",
    }
    assert raw_call(fake_grafana, "GET", "/api/dashboards/uid/nope")[0] == 404

    ann = {
        "dashboardUID": created["uid"],
        "panelId": 1,
        "time": 1507037197339,
        "timeEnd": 1507180805056,
        "tags": ["tag1", "tag2"],
        "text": "Annotation Description",
    }
    status, added = raw_call(fake_grafana, "POST", "/api/annotations", ann)
    assert status == 200 and added["message"] == "Annotation added" and isinstance(added["id"], int)
    patch = {"text": "New Annotation Description", "tags": ["tag6", "tag7", "tag8"]}
    assert raw_call(fake_grafana, "PATCH", f"/api/annotations/{added['id']}", patch) == (
        200,
        {"message": "Annotation patched"},
    )
    status, found = raw_call(fake_grafana, "GET", "/api/annotations?tags=tag6&tags=tag7&limit=100")
    assert status == 200 and len(found) == 1
    expected_keys = {"id", "alertId", "dashboardId", "dashboardUID", "panelId", "userId", "newState", "prevState"}
    assert set(found[0]) >= expected_keys | {"time", "timeEnd", "text", "metric", "tags", "data"}
    assert (found[0]["time"], found[0]["timeEnd"], found[0]["panelId"]) == (1507037197339, 1507180805056, 1)
    assert found[0]["text"] == "New Annotation Description" and found[0]["tags"] == ["tag6", "tag7", "tag8"]
    assert raw_call(fake_grafana, "POST", "/api/annotations", {"time": 1507037197339, "text": ""})[0] == 400

    status, settings = raw_call(fake_grafana, "GET", "/api/frontend/settings")
    assert status == 200 and settings["buildInfo"]["version"] == "11.6.0"
    assert raw_call(fake_grafana, "GET", "/api/health", token="nope")[0] == 200
    assert raw_call(fake_grafana, "GET", "/api/frontend/settings", token="nope") == (401, {"message": "Unauthorized"})
