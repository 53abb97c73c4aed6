"""Secrets never reach a person: a database URL is rendered masked whatever its form (password in the userinfo, in
a query parameter, a URL without a scheme, an unescaped ``@``), a driver's error text is scrubbed of it, and a
config value under a key the guardian does not know is never echoed (red-team findings P3, P4, P5, O2)."""

from __future__ import annotations

import json
import urllib.parse
from pathlib import Path

import pytest
from postgres_server import PASSWORD, USER, PostgresServer

from guardian.cli import EXIT_OK, EXIT_USAGE, main
from guardian.config import ConfigError, load_config
from guardian.fleet.spec import load_fleet
from guardian.redact import render_db_url, scrub_text
from guardian.store import Store, StoreError, mask_url
from guardian.store.engine import reason

SECRET = "Pw:S3cr3t/x%y@z#q"
QUOTED = urllib.parse.quote(SECRET, safe="")


def fragments(secret: str) -> list[str]:
    """Pieces of ``secret`` that must not be shown: itself raw and escaped, and each part around its ``@``/``:``."""
    pieces = {secret, urllib.parse.quote(secret, safe=""), urllib.parse.quote(secret)}
    for separator in "@:/":
        pieces.update(part for part in secret.split(separator) if len(part) >= 3)
    return sorted(pieces)


def assert_hidden(text: str, secret: str = SECRET) -> None:
    shown = [piece for piece in fragments(secret) if piece in text]
    assert not shown, f"{shown} shown in: {text}"


# ----------------------------------------------------------------------------------- the renderer


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql+psycopg://guardian:hunter2@db:5432/g", "postgresql+psycopg://guardian:***@db:5432/g"),
        ("postgresql+psycopg://guardian@db/g?password=hunter2", "postgresql+psycopg://guardian@db/g?password=***"),
        (
            "postgresql://g@db/g?sslmode=require&sslpassword=hunter2",
            "postgresql://g@db/g?sslmode=require&sslpassword=***",
        ),
        (
            "postgresql+psycopg:///g1?host=127.0.0.1&port=15432&user=guardian&password=hunter2",
            "postgresql+psycopg:///g1?host=127.0.0.1&port=15432&user=guardian&password=***",
        ),
        ("postgresql://g@db/g?PassWord=hunter2", "postgresql://g@db/g?PassWord=***"),
        ("postgresql://g@db/g?pass%77ord=hunter2", "postgresql://g@db/g?pass%77ord=***"),
        ("postgresql://g@db/g?passfile=/home/g/.hunter2", "postgresql://g@db/g?passfile=***"),
        ("postgresql://g@db/g?options=-c%20x%3Dhunter2", "postgresql://g@db/g?options=***"),  # unknown: masked
        ("postgresql://g@db/g?hunter2", "postgresql://g@db/g?***"),
        ("guardian:hunter2@127.0.0.1", "guardian:***@127.0.0.1"),  # no scheme (P3)
        ("guardian:hunter2@127.0.0.1/g?password=hunter2", "guardian:***@127.0.0.1/g?password=***"),
        ("postgresql://guardian:hun@ter2@127.0.0.1:5432/g", "postgresql://guardian:***@127.0.0.1:5432/g"),  # P4
        ("postgresql://guardian:hun?ter=2@127.0.0.1/g", "postgresql://guardian:***@127.0.0.1/g"),
        ("postgresql://guardian@db/g?application_name=a@b", "postgresql://guardian@db/g?application_name=a@b"),
        ("host=db port=5432 user=g password=hunter2", "host=db port=5432 user=g password=***"),
        ("host=db password='hun ter2' dbname=g", "host=db password=*** dbname=g"),
        ("sqlite:////var/lib/guardian/guardian.db", "sqlite:////var/lib/guardian/guardian.db"),
        ("sqlite:///file:g.db?mode=ro&uri=true", "sqlite:///file:g.db?mode=ro&uri=true"),
        ("/var/lib/guardian.db", "/var/lib/guardian.db"),
        ("nonsense://u:secret@x", "nonsense://u:***@x"),
    ],
)
def test_a_database_url_is_rendered_masked_whatever_its_form(url: str, expected: str) -> None:
    assert render_db_url(url) == expected
    assert mask_url(url) == expected, "the store's name for it is the same function"
    assert "hunter2" not in render_db_url(url) and "ter2" not in render_db_url(url)


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql+psycopg://guardian:{SECRET}@127.0.0.1:15432/g1",  # P4, as the red team wrote it
        f"postgresql+psycopg://guardian:{SECRET}@127.0.0.1:15432/g1?sslmode=disable",
        f"postgresql+psycopg://guardian@127.0.0.1:15432/g1?password={QUOTED}",
        f"postgresql+psycopg://guardian@127.0.0.1:15432/g1?sslpassword={QUOTED}",
        f"postgresql+psycopg:///g1?host=127.0.0.1&port=15432&password={QUOTED}",
        f"guardian:{QUOTED}@127.0.0.1",
        f"guardian:{SECRET}@127.0.0.1",
    ],
)
def test_no_piece_of_the_password_survives_rendering(url: str) -> None:
    rendered = render_db_url(url)
    assert_hidden(rendered)
    assert "127.0.0.1" in rendered, "the host is still shown"


def test_a_control_character_in_a_url_is_escaped() -> None:
    assert render_db_url("sqlite:////tmp/a\nCRITICAL x") == "sqlite:////tmp/a\\nCRITICAL x"


def test_a_drivers_text_is_scrubbed_of_every_form() -> None:
    url = f"postgresql+psycopg://guardian:{SECRET}@127.0.0.1:15432/g1"
    echoed = RuntimeError('could not translate host name "z#q@127.0.0.1" to address: Name or service not known')
    said = reason(echoed, url)
    assert_hidden(said)
    assert said.startswith("RuntimeError: could not translate host name") and "127.0.0.1" in said
    assert_hidden(scrub_text(f"dsn postgresql://guardian@h/g?password={QUOTED} and password={SECRET} end"))
    assert_hidden(scrub_text(f"missing '=' after 'guardian:{QUOTED}@127.0.0.1' in connection info string"))


# --------------------------------------------------------------------------- commands, no server


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GUARDIAN_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("GUARDIAN_DB_URL", raising=False)
    monkeypatch.delenv("GRAFANA_TOKEN", raising=False)
    return tmp_path / "home"


def said_by(capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture, home: Path) -> str:
    """Everything the command showed: stdout, stderr, the log lines, and every file it left under the home."""
    captured = capsys.readouterr()
    files = [p.read_text(errors="replace") for p in home.rglob("*") if p.is_file() and p.suffix != ".db"]
    return "\n".join([captured.out, captured.err, caplog.text, *files])


def metrics_file(folder: Path) -> Path:
    path = folder / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "data": {"actor/entropy": 1.0}}) + "\n" for s in range(1, 4)))
    return path


SCHEMELESS = [f"guardian:{QUOTED}@127.0.0.1", f"guardian:{SECRET}@127.0.0.1:1/g1"]


@pytest.mark.parametrize("url", SCHEMELESS)
@pytest.mark.parametrize(
    "argv",
    [
        ["doctor"],
        ["doctor", "--json"],
        ["incidents", "list"],
        ["incidents", "list", "--json"],
        ["watch", "--metrics", "METRICS", "--no-follow", "--no-live"],
        ["report", "1", "-o", "OUT"],
        ["checkpoints", "some-run"],
    ],
)
def test_a_url_without_a_scheme_is_masked_by_every_command(
    url: str,
    argv: list[str],
    home: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """P3: ``user:PASS@host`` (no scheme, a typical mistake) was printed raw by seven commands."""
    monkeypatch.setenv("GUARDIAN_DB_URL", url)
    metrics = str(metrics_file(tmp_path))
    argv = [metrics if a == "METRICS" else str(tmp_path / "r.html") if a == "OUT" else a for a in argv]
    main(argv)
    text = said_by(capsys, caplog, home)
    assert "guardian:***@127.0.0.1" in text, "the URL is still named, masked"
    assert "it has no scheme: write sqlite:///PATH or postgresql+psycopg://" in " ".join(text.split())
    assert_hidden(text)


P4_URLS = [
    f"postgresql+psycopg://guardian:{SECRET}@127.0.0.1:1/g1",
    "postgresql+psycopg://guardian:Pw@S3cr3t@xq@127.0.0.1:1/g1",
]


@pytest.mark.parametrize("url", P4_URLS)
def test_an_unescaped_at_in_the_password_is_masked_up_to_the_host(
    url: str,
    home: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """P4: everything after the first ``@`` was shown as the host, and psycopg's error text repeated it."""
    password = url.split("guardian:", 1)[1].rsplit("@127.0.0.1", 1)[0]
    assert render_db_url(url) == "postgresql+psycopg://guardian:***@127.0.0.1:1/g1"
    with pytest.raises(StoreError) as caught:
        Store.open(url)
    assert_hidden(str(caught.value), password)
    assert str(caught.value).endswith("(its password holds '@', '?' or '/' as is: percent-encode them (%40, %3F, %2F))")
    monkeypatch.setenv("GUARDIAN_DB_URL", url)
    main(["doctor", "--json"])
    assert_hidden(said_by(capsys, caplog, home), password)


# ------------------------------------------------------------------------- commands, a real server


def query_forms(postgres: PostgresServer) -> dict[str, str]:
    """The three URL forms libpq accepts with the password in the query, each on a fresh database."""
    quoted = urllib.parse.quote(PASSWORD, safe="")
    port = postgres.port
    return {
        "password": f"postgresql+psycopg://{USER}@127.0.0.1:{port}/{db(postgres)}?password={quoted}",
        "sslpassword": f"postgresql+psycopg://{USER}@127.0.0.1:{port}/{db(postgres)}?password={quoted}"
        f"&sslpassword={urllib.parse.quote(SECRET, safe='')}",
        "all-query": f"postgresql+psycopg:///{db(postgres)}?host=127.0.0.1&port={port}&user={USER}&password={quoted}",
    }


def db(postgres: PostgresServer) -> str:
    return postgres.database().rsplit("/", 1)[1]


def test_a_password_in_the_query_is_never_printed(
    postgres: PostgresServer,
    home: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """P5: ``?password=``, ``sslpassword=`` and the all-query form work (doctor says ok) and were printed in full by
    doctor, the ``event=watch`` line, guardian.log and the watch summary's ``history:`` line."""
    metrics = metrics_file(tmp_path)
    for form, url in query_forms(postgres).items():
        monkeypatch.setenv("GUARDIAN_DB_URL", url)
        assert main(["doctor", "--json"]) in (EXIT_OK, 1)
        report = {check["name"]: check for check in json.loads(capsys.readouterr().out)}
        assert report["store"]["status"] == "ok", (form, report["store"])
        assert "password=***" in report["store"]["detail"]
        main(["doctor"])
        main(["watch", "--metrics", str(metrics), "--no-follow", "--no-live", "--run-id", f"q-{form}"])
        text = said_by(capsys, caplog, home)
        assert "history: postgresql+psycopg://" in text and "event=watch" in text
        assert "password=***" in text
        assert_hidden(text, PASSWORD)
        assert_hidden(text, SECRET)


# ------------------------------------------------------------------------------ config values (O2)


TYPO = (
    "notify:\n"
    "  webhooks:\n"
    '    - {name: x, url: "https://hooks.slack.com/services/T0/B0/WEBHOOKSECRET"}\n'
    'grafana: {url: "https://g.example", token: "glsa_TOKENSECRET"}\n'
)


def test_a_secret_under_a_misspelt_key_is_never_echoed(tmp_path: Path) -> None:
    config = tmp_path / "typo.yaml"
    config.write_text(TYPO)
    with pytest.raises(ConfigError) as caught:
        load_config(config, env={})
    message = str(caught.value)
    assert "WEBHOOKSECRET" not in message and "TOKENSECRET" not in message
    assert "notify.webhooks[1].url: unknown key (line 3); did you mean url_env or url_file?" in message, message
    assert "grafana.token: unknown key (line 4); did you mean token_file?" in message, message


@pytest.mark.parametrize(
    "argv", [["doctor"], ["doctor", "--json"], ["watch", "--metrics", "METRICS", "--no-follow", "--no-live"]]
)
def test_doctor_run_and_watch_never_echo_a_misspelt_secret(
    argv: list[str],
    home: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = tmp_path / "typo.yaml"
    config.write_text(TYPO)
    metrics = str(metrics_file(tmp_path))
    main([*(metrics if a == "METRICS" else a for a in argv), "--config", str(config)])
    text = said_by(capsys, caplog, home)
    assert "did you mean url_env" in text
    assert "WEBHOOKSECRET" not in text and "TOKENSECRET" not in text


def test_run_never_echoes_a_misspelt_secret(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    config = tmp_path / "typo.yaml"
    config.write_text(TYPO)
    code = main(["run", "--config", str(config), "--no-live", "--", "python", "-c", "pass"])
    text = said_by(capsys, caplog, home)
    assert code == EXIT_USAGE and "did you mean token_file" in text
    assert "WEBHOOKSECRET" not in text and "TOKENSECRET" not in text


@pytest.mark.parametrize(
    "value",
    ["https://hooks.slack.com/services/T0/B0/WEBHOOKSECRET", "WEBHOOKSECRET https://x", "a\nWEBHOOKSECRET"],
)
def test_a_webhook_url_written_as_its_env_name_is_refused_unshown(tmp_path: Path, value: str) -> None:
    config = tmp_path / "g.yaml"
    config.write_text("notify:\n  webhooks:\n    - name: x\n      url_env: " + json.dumps(value) + "\n")
    with pytest.raises(ConfigError) as caught:
        load_config(config, env={})
    assert "WEBHOOKSECRET" not in str(caught.value)
    assert "notify.webhooks[1].url_env: Value error, must name an environment variable" in str(caught.value)
    assert "(line 4)" in str(caught.value)


def test_a_section_written_as_a_string_is_not_echoed(tmp_path: Path) -> None:
    config = tmp_path / "g.yaml"
    config.write_text("grafana: glsa_TOKENSECRET\n")
    with pytest.raises(ConfigError) as caught:
        load_config(config, env={})
    assert "TOKENSECRET" not in str(caught.value) and "grafana: Input should be a valid dictionary" in str(caught.value)


def test_a_plain_value_under_a_known_key_is_still_shown(tmp_path: Path) -> None:
    config = tmp_path / "g.yaml"
    config.write_text("mode: enforcee\nchecks:\n  stall:\n    for_steps: many\n")
    with pytest.raises(ConfigError) as caught:
        load_config(config, env={})
    assert "mode: Input should be 'observe', 'advise' or 'enforce' (line 1; got 'enforcee')" in str(caught.value)
    assert (
        "checks.stall.for_steps: Input should be a valid integer, unable to parse string as an integer (line 4;"
        in str(caught.value)
    )


SHADOW = "root:$6$abcdefgh$HASHSECRET1:19000:0:99999:7:::\ndaemon:*:19000:0:99999:7:::\nuser: $6$xyz$HASHSECRET2:1\n"


@pytest.mark.parametrize(
    "content",
    [
        SHADOW,
        "HASHSECRET1 HASHSECRET2\n",  # a scalar: not a mapping
        "- HASHSECRET1\n- HASHSECRET2\n",  # a list
        "a: b: HASHSECRET1\n",  # not valid YAML: PyYAML's message quotes the line
        "key: 'HASHSECRET1\n",
        "\tHASHSECRET1: x\n",
        "a: *HASHSECRET1\n",  # an undefined alias: PyYAML names it
        "a: !HASHSECRET1 x\n",  # an unknown tag: PyYAML names it
    ],
)
def test_a_fleet_runs_config_prints_nothing_of_a_file_that_is_no_guardian_yaml(tmp_path: Path, content: str) -> None:
    """O2: a fleet run's ``config:`` can name any readable file; its lines were printed as unknown keys."""
    (tmp_path / "secret").write_text(content)
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("runs:\n  - run_id: a\n    command: [x]\n    config: secret\n")
    with pytest.raises(ConfigError) as caught:
        load_fleet(fleet, load_config(None, env={}))
    message = str(caught.value)
    assert "HASHSECRET" not in message and "$6$" not in message, message
    assert "run a of the fleet" in message and str(tmp_path / "secret") in message
    assert len(message.splitlines()) <= 2, message


# ------------------------------------------------------------------- log lines and traceback files


def test_a_drivers_echo_of_an_opened_urls_password_never_reaches_a_log_line_or_traceback(tmp_path: Path) -> None:
    """The store remembers the secret parts of the URL it opened: every log line (a traceback included) and the
    internal-error traceback file are written without them, whatever the driver's text holds."""
    from guardian.cli.common import write_traceback
    from guardian.logs import get_logger, logging_to_file

    password = "Remembered:Pw/x%y@hostpiece#1"
    with pytest.raises(StoreError):
        Store.open(f"postgresql+psycopg://guardian:{password}@127.0.0.1:1/g1")
    echo = RuntimeError(f"server said: failed for host 'hostpiece#1@127.0.0.1' with password {password}")
    log_file = tmp_path / "guardian.log"
    with logging_to_file(log_file, quiet_terminal=False):
        try:
            raise echo
        except RuntimeError:
            get_logger("test").exception("event=tick_failed error=%s", echo)
    written = log_file.read_text()
    assert "event=tick_failed" in written and "Traceback" in written
    assert_hidden(written, password)
    where = write_traceback(tmp_path / "home", echo, 0.0)
    assert where is not None
    assert_hidden(where.read_text(), password)
    assert "RuntimeError: server said" in where.read_text()


def test_a_short_or_visible_password_is_not_blanked_from_every_log_line() -> None:
    from guardian.redact import remember_url, remembered

    remember_url("postgresql+psycopg://guardian:guardian@127.0.0.1/guardian?password=pw")
    assert "guardian" not in remembered() and "pw" not in remembered()
