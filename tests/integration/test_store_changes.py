"""The store's write count and the memo of reads over it, on real SQLite and PostgreSQL (``db_url``): a read is kept
while this process writes nothing, read again after its own write at once, and after another process's write within
the memo's age."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from guardian.core import Finding, Severity, StepRecord
from guardian.store import Store
from guardian.store.changes import StoreMemo

T0 = 1_795_000_000.0
RUN = "run-20261202-1900-ab12"


class FakeClock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    with Store.open(db_url) as opened:
        opened.ensure_run(
            RUN, name="n", metrics_path="m", rollouts_dir="r", checkpoints_dir="c", mode="enforce", now=T0
        )
        yield opened


def _open(store: Store, step: int) -> None:
    finding = Finding("entropy_collapse", Severity.CRITICAL, step, "entropy fell", step - 2)
    store.open_incident(RUN, finding, T0 + step)


def test_writes_move_the_count_and_reads_do_not(store: Store) -> None:
    before = store.writes.value
    store.list_incidents(RUN)
    store.interventions(RUN)
    assert store.writes.value == before
    _open(store, 10)
    assert store.writes.value == before + 1
    with store.transaction() as joined:  # one transaction of several writes: one commit
        _open(joined, 11)
        _open(joined, 12)
    assert store.writes.value == before + 2


def test_a_transaction_that_fails_moves_nothing(store: Store) -> None:
    before = store.writes.value
    with pytest.raises(RuntimeError), store.transaction() as joined:
        _open(joined, 10)
        raise RuntimeError("the unit failed")
    assert store.writes.value == before
    assert store.list_incidents(RUN) == []


def test_the_memo_reads_again_after_an_own_write_at_once(store: Store) -> None:
    clock = FakeClock()
    memo = StoreMemo(store.writes, max_age_s=5.0, clock=clock)
    fetches: list[int] = []

    def incidents() -> tuple[int, ...]:
        fetches.append(1)
        return tuple(i.id for i in store.list_incidents(RUN))

    assert memo.read("incidents", incidents) == ()
    assert memo.read("incidents", incidents) == ()
    assert len(fetches) == 1  # nothing written, young: kept
    _open(store, 10)
    assert len(memo.read("incidents", incidents)) == 1
    assert len(fetches) == 2


def test_another_process_write_is_seen_within_the_age(db_url: str, store: Store) -> None:
    clock = FakeClock()
    memo = StoreMemo(store.writes, max_age_s=5.0, clock=clock)

    def incidents() -> int:
        return len(store.list_incidents(RUN))

    assert memo.read("incidents", incidents) == 0
    with Store.open(db_url) as other:  # its own engine: a write this process's count does not see
        _open(other, 10)
    clock.now += 4.9
    assert memo.read("incidents", incidents) == 0  # still young
    clock.now += 0.2
    assert memo.read("incidents", incidents) == 1


def test_a_write_during_a_read_makes_the_next_read_fetch(store: Store) -> None:
    clock = FakeClock()
    memo = StoreMemo(store.writes, max_age_s=5.0, clock=clock)

    def read_while_another_thread_writes() -> int:
        count = len(store.list_incidents(RUN))
        _open(store, 10)  # committed after the rows were read
        return count

    assert memo.read("incidents", read_while_another_thread_writes) == 0
    assert memo.read("incidents", lambda: len(store.list_incidents(RUN))) == 1


def test_a_transaction_of_steps_alone_leaves_the_memos_their_reads(store: Store) -> None:
    attempt = store.start_attempt(RUN, metrics_path="m", now=T0)
    before, steps_before = store.writes.value, store.writes.steps
    with store.transaction(steps_only=True) as joined:
        joined.write_steps(RUN, attempt.id, 0, [StepRecord(1, {"actor/entropy": 0.5})], T0)
    assert (store.writes.value, store.writes.steps) == (before, steps_before + 1)
    assert store.latest_step(RUN) is not None
