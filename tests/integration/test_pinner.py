"""The pin pass of ``guardian run`` (guardian/checkpoints/pinner.py) on a real store and real folders: it pins what the
plan says, records what it made (hard links add no bytes), releases the pins K newer healthy ones replace, adopts
a pinned folder the store missed, releases a row whose folder is gone, and says a refused copy once."""

from __future__ import annotations

import errno
import json
import os
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import ManualClock
from verl_saves import retention_deletes, save

from guardian.checkpoints import pinning as pins
from guardian.checkpoints.pinner import Pinner
from guardian.checkpoints.pinning import PIN_DIR, pinned_path, pinned_steps
from guardian.checkpoints.view import read_checkpoints
from guardian.cli import EXIT_OK, main
from guardian.config import CheckpointsConfig
from guardian.core import Finding, Severity
from guardian.incidents.health import StepHealth
from guardian.states import PinMode
from guardian.store import Store

RUN = "pins"


@pytest.fixture
def store(tmp_path: Path) -> Store:
    opened = Store.open(f"sqlite:///{tmp_path / 'guardian.db'}")
    opened.ensure_run(RUN, name=RUN, metrics_path="m", rollouts_dir="r", checkpoints_dir="c", mode="enforce", now=0.0)
    return opened


def healthy_through(last: int) -> StepHealth:
    noted = StepHealth()
    for step in range(1, last + 1):
        noted.note(step, [Finding("entropy_collapse", Severity.OK, step, "")])
    return noted


def saved(store: Store, ckpt: Path, *steps: int, verdict: str = "healthy") -> None:
    for step in steps:
        folder = save(ckpt, step)
        store.record_checkpoint(RUN, step=step, path=str(folder), verdict=verdict, now=1.0)


def pinner(store: Store, ckpt: Path, keep: int = 2) -> Pinner:
    config = CheckpointsConfig(pin_keep=keep, healthy_window_steps=5, copy_min_free_gib=1.0)
    return Pinner(config, store, RUN, ckpt, ManualClock(100.0))


def test_the_pass_pins_records_and_releases_what_newer_pins_replace(
    tmp_path: Path, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    ckpt = tmp_path / "ckpt"
    saved(store, ckpt, 10, 20)
    guard = pinner(store, ckpt)
    with caplog.at_level("INFO", logger="guardian"):
        guard.run(healthy_through(25), 25, branch=0, on_disk=read_checkpoints(ckpt))
    assert [(p.step, p.mode, p.bytes_added, p.live) for p in store.pins(RUN)] == [
        (10, PinMode.LINK, 0, True),
        (20, PinMode.LINK, 0, True),
    ]
    assert "event=checkpoint_pinned run=pins step=20 mode=link files=4 bytes_added=0" in caplog.text
    saved(store, ckpt, 30, 40)
    retention_deletes(ckpt / "global_step_10")  # verl's max_actor_ckpt_to_keep at work meanwhile
    guard.run(healthy_through(45), 45, branch=0, on_disk=read_checkpoints(ckpt))
    assert [p.step for p in store.pins(RUN, live=True)] == [30, 40]
    released = [p for p in store.pins(RUN) if not p.live]
    assert [(p.step, p.note) for p in released] == [
        (10, "2 newer healthy pins: steps 20,30"),
        (20, "2 newer healthy pins: steps 30,40"),
    ]
    assert list(pinned_steps(ckpt)) == [30, 40]
    assert (ckpt / "global_step_10" / "data.pt").is_file(), "only the guardian's own pinned folders are removed"


def test_the_first_pass_removes_what_a_guardian_killed_while_pinning_left(tmp_path: Path, store: Store) -> None:
    ckpt = tmp_path / "ckpt"
    saved(store, ckpt, 10)
    for name in (".tmp-release-global_step_5-41", ".tmp-restore-global_step_7-41"):
        (ckpt / PIN_DIR / name / "actor").mkdir(parents=True)
    pinner(store, ckpt).run(healthy_through(20), 20, branch=0, on_disk=read_checkpoints(ckpt))
    assert sorted(p.name for p in (ckpt / PIN_DIR).iterdir()) == ["global_step_10"]


def test_nothing_is_pinned_while_an_incident_is_open(tmp_path: Path, store: Store) -> None:
    ckpt = tmp_path / "ckpt"
    saved(store, ckpt, 10)
    store.open_incident(RUN, Finding("entropy_collapse", Severity.CRITICAL, 12, "collapse", 11), now=5.0)
    pinner(store, ckpt).run(healthy_through(20), 20, branch=0, on_disk=read_checkpoints(ckpt))
    assert store.pins(RUN) == [] and not (ckpt / PIN_DIR).exists()


def test_a_pinned_folder_the_store_missed_is_adopted_and_a_row_whose_folder_went_is_released(
    tmp_path: Path, store: Store
) -> None:
    ckpt = tmp_path / "ckpt"
    saved(store, ckpt, 10, 20)
    pins.pin_checkpoint(ckpt, 20, min_free_bytes=0)  # a guardian killed after the rename, before its record
    store.record_pin(
        RUN, step=5, source_path="x", pinned_path=str(pinned_path(ckpt, 5)), mode=PinMode.LINK, bytes_added=0, now=1
    )
    pinner(store, ckpt).run(healthy_through(30), 30, branch=0, on_disk=read_checkpoints(ckpt))
    gone = next(p for p in store.pins(RUN) if p.step == 5)
    assert not gone.live and "its folder is gone" in (gone.note or "")
    assert sorted(p.step for p in store.pins(RUN, live=True)) == [10, 20]


def test_a_refused_copy_is_said_once_in_one_line_and_not_retried_on_this_branch(
    tmp_path: Path, store: Store, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    ckpt = tmp_path / "ckpt"
    saved(store, ckpt, 10)

    def cross_device(src: object, dst: object, **kwargs: object) -> None:
        raise OSError(errno.EXDEV, os.strerror(errno.EXDEV), str(src))

    monkeypatch.setattr(pins.os, "link", cross_device)
    monkeypatch.setattr(pins.shutil, "disk_usage", lambda path: SimpleNamespace(total=1 << 30, used=0, free=1 << 29))
    guard = pinner(store, ckpt)
    with caplog.at_level("INFO", logger="guardian"):
        guard.run(healthy_through(20), 20, branch=0, on_disk=read_checkpoints(ckpt))
        guard.run(healthy_through(21), 21, branch=0, on_disk=read_checkpoints(ckpt))
    refusals = [r for r in caplog.records if "event=pin_copy_refused" in r.getMessage()]
    assert len(refusals) == 1 and "\n" not in refusals[0].getMessage()
    assert str(ckpt / "global_step_10") in refusals[0].getMessage() and refusals[0].levelname == "ERROR"
    assert store.pins(RUN) == []
    # a new branch (after a rollback): tried again
    guard.run(healthy_through(22), 22, branch=1, on_disk=read_checkpoints(ckpt))
    assert len([r for r in caplog.records if "event=pin_copy_refused" in r.getMessage()]) == 2


def test_a_copy_when_links_are_refused_is_recorded_with_the_bytes_it_adds_and_warned_about(
    tmp_path: Path, store: Store, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    ckpt = tmp_path / "ckpt"
    saved(store, ckpt, 10)

    def not_permitted(src: object, dst: object, **kwargs: object) -> None:
        raise OSError(errno.EPERM, os.strerror(errno.EPERM), str(src))

    monkeypatch.setattr(pins.os, "link", not_permitted)
    monkeypatch.setattr(pins.shutil, "disk_usage", lambda path: SimpleNamespace(total=1 << 40, used=0, free=1 << 40))
    with caplog.at_level("INFO", logger="guardian"):
        pinner(store, ckpt).run(healthy_through(20), 20, branch=0, on_disk=read_checkpoints(ckpt))
    (pin,) = store.pins(RUN)
    size = sum(p.stat().st_size for p in (ckpt / "global_step_10").rglob("*") if p.is_file() and not p.is_symlink())
    assert (pin.mode, pin.bytes_added) == (PinMode.COPY, size)
    (line,) = [r for r in caplog.records if "event=checkpoint_pinned" in r.getMessage()]
    assert line.levelname == "WARNING" and "EPERM" in line.getMessage() and "copied" in line.getMessage()


def test_guardian_checkpoints_lists_the_pins_with_what_they_add_and_hold(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    home, ckpt = tmp_path / "home", tmp_path / "ckpt"
    monkeypatch.setenv("GUARDIAN_HOME", str(home))
    monkeypatch.delenv("GUARDIAN_DB_URL", raising=False)
    with Store.open(f"sqlite:///{home / 'guardian.db'}") as store:
        store.ensure_run(
            RUN, name=RUN, metrics_path="m", rollouts_dir="", checkpoints_dir=str(ckpt), mode="enforce", now=0
        )
        saved(store, ckpt, 10, 20)
        guard = pinner(store, ckpt, keep=2)
        guard.run(healthy_through(25), 25, branch=0, on_disk=read_checkpoints(ckpt))
        saved(store, ckpt, 30)
        guard.run(healthy_through(35), 35, branch=0, on_disk=read_checkpoints(ckpt))
    retention_deletes(ckpt / "global_step_20")
    held = sum(
        p.stat().st_size for p in (pinned_path(ckpt, 20) / "actor").rglob("*") if p.is_file() and not p.is_symlink()
    )
    assert main(["checkpoints", RUN, "--json"]) == EXIT_OK
    listed = json.loads(capsys.readouterr().out)
    assert [(p["step"], p["mode"], p["bytes_added"], p["holds_bytes"]) for p in listed["pins"]] == [
        (10, "link", 0, None),  # released: three pins were made, two are kept
        (20, "link", 0, held),  # its original's actor/ is gone: the pin alone keeps those bytes
        (30, "link", 0, 0),
    ]
    assert main(["checkpoints", RUN]) == EXIT_OK
    text = capsys.readouterr().out
    assert "emptied (pinned)" in text and "present (pinned)" in text
    assert re.search(r"pin  step +20  link  added +0 B  holds +\d+\.\d KiB", text)
    assert re.search(r"pin  step +10  link  added +0 B  released .*: 2 newer healthy pins: steps 20,30", text)


def test_a_warning_that_only_advises_counts_as_healthy_around_a_step() -> None:
    """Entropy falling while the reward climbs is advice, not trouble: it must not block the pins a rescue needs."""
    health = StepHealth()
    advice = Finding("entropy_collapse", Severity.WARN, 10, "sharpening - a warning, not a rollback", advice=True)
    trouble = Finding("kl_drift", Severity.WARN, 11, "KL grew 2x")
    health.note(10, [advice])
    health.note(11, [advice, trouble])
    assert health.worst_between(10, 10) == Severity.OK
    assert health.worst_between(10, 11) == Severity.WARN
