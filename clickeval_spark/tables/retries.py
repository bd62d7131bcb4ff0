"""Delta commit conflicts between concurrent writers, retried with jittered exponential backoff.

Concurrent runs (DESIGN §2: two runs with different run_ids write the same tables at once).
Every run-keyed table is partitioned by run_id and every write names its run_id in the
replaceWhere / MERGE predicate, so Delta's conflict check (WriteSerializable) sees two runs
touching disjoint partitions and lets both commit; that already removes the common conflicts.
Partitioning cannot separate every writer, though:
  - the creation of a table that does not exist yet: two writers both try to commit version 0
    (ProtocolChangedException / MetadataChangedException for the loser), or the loser's create finds the
    winner's `_delta_log` before its first commit (`TableCreationRace`);
  - two runs replacing the same slice: the same dataset's serps / relevance_labels (partitioned by
    dataset, not run_id) or its synthetic truth `truth-<dataset>` in model_params;
  - Delta's own metadata commits racing a write.
So every table write also goes through with_conflict_retries: a bounded number of attempts with
jittered exponential backoff, retrying only Delta's concurrent-modification errors (anything else
fails at once), one warning per retry, the original error re-raised after the last attempt. A retry
is safe because each write replaces a whole slice: re-run against the newer snapshot it leaves the
same rows, never duplicates. Writes conflicting with themselves forever (the same slice written by
two processes in a loop) still fail after the last attempt rather than spin.
"""

from __future__ import annotations

import logging
import random
import time
from typing import Callable, TypeVar

# importing delta.exceptions.captured also makes PySpark raise these classes for Delta's Java commit conflicts
from delta.exceptions.captured import (ConcurrentAppendException, ConcurrentDeleteDeleteException,
                                       ConcurrentDeleteReadException, ConcurrentTransactionException,
                                       ConcurrentWriteException, DeltaConcurrentModificationException,
                                       MetadataChangedException, ProtocolChangedException)


class TableCreationRace(Exception):
    """Another writer was creating the same table: its `_delta_log` was there, its first commit not yet, when
    this writer's create found the location not empty (Delta's DELTA_CREATE_TABLE_WITH_NON_EMPTY_LOCATION) or
    read the table back without a commit (DELTA_TABLE_NOT_FOUND). A retry finds the table."""


CONCURRENT_MODIFICATION_ERRORS: tuple[type[BaseException], ...] = (
    DeltaConcurrentModificationException, ConcurrentWriteException, MetadataChangedException,
    ProtocolChangedException, ConcurrentAppendException, ConcurrentDeleteReadException,
    ConcurrentDeleteDeleteException, ConcurrentTransactionException, TableCreationRace,
)
WRITE_ATTEMPTS = 6
RETRY_BASE_SECONDS = 0.5
_log = logging.getLogger("clickeval.tables")
_T = TypeVar("_T")


def is_concurrent_modification(exc: BaseException) -> bool:
    """A Delta commit conflict (another writer committed first); not a bad write."""
    return isinstance(exc, CONCURRENT_MODIFICATION_ERRORS)


def with_conflict_retries(write: Callable[[], _T], what: str, *, attempts: int | None = None,
                          base_seconds: float | None = None, sleep: Callable[[float], None] = time.sleep) -> _T:
    """Run `write` (one complete, idempotent Delta commit); on a concurrent-modification conflict wait
    base * 2^(k-1) * U(1, 2) seconds and run it again, at most `attempts` times in all."""
    attempts = WRITE_ATTEMPTS if attempts is None else attempts
    base_seconds = RETRY_BASE_SECONDS if base_seconds is None else base_seconds
    for attempt in range(1, attempts + 1):
        try:
            return write()
        except Exception as exc:
            if not is_concurrent_modification(exc):
                raise
            if attempt == attempts:
                exc.add_note(f"clickeval: {what}: still conflicting after {attempts} attempts")
                raise
            delay = base_seconds * 2 ** (attempt - 1) * (1 + random.random())
            _log.warning("%s: concurrent Delta commit (%s); retry %d of %d in %.2f s",
                         what, type(exc).__name__, attempt, attempts - 1, delay)
            sleep(delay)
    raise AssertionError("unreachable")  # the loop returns or raises
