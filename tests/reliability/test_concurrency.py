"""Issue 7.3: two runs with different run_ids writing the same tables at the same time both land completely.

How conflicts are handled (clickeval_spark/tables/retries.py, delta_io.py): run-keyed tables are partitioned by run_id
and every write names its run_id partition (replaceWhere, and a literal run_id in the `runs` MERGE), so
writes of different runs never conflict; where they still can (two writers creating a table, the same
slice written twice) tables.with_conflict_retries retries Delta's concurrent-modification errors a bounded
number of times. The tests below show each part: the retry policy, real conflicts on a fresh table being
retried (and failing without retries), disjoint run slices committing concurrently without a single
conflict, and two whole pipelines (one a separate `jobs.pipeline` process) on one fresh warehouse.
"""

import logging
import threading

import pytest
from delta.exceptions.captured import ConcurrentAppendException, ProtocolChangedException
from delta.tables import DeltaTable
from pyspark.errors import AnalysisException
from pyspark.sql import functions as F

from clickeval_spark import tables
from clickeval_spark.tables import retries
from clickeval_spark.runs import recorded_run
from tests.reliability import baseline as P

# minutes of Spark: `make test-fast` leaves it out (docs/development.md)
pytestmark = pytest.mark.slow


# ------------------------------------------------------------------------------------- the retry policy

def _conflict(cls=ConcurrentAppendException):
    return cls("Files were added to partition [run_id=x] by a concurrent update.", "")


def test_retries_only_concurrent_modification_then_succeeds(spark, caplog):
    calls, sleeps = [], []

    def write():
        calls.append(1)
        if len(calls) < 3:
            raise _conflict(ProtocolChangedException if len(calls) == 1 else ConcurrentAppendException)
        return "done"

    with caplog.at_level(logging.WARNING, logger="clickeval.tables"):
        assert tables.with_conflict_retries(write, "metrics [x]", attempts=4, base_seconds=0.1,
                                            sleep=sleeps.append) == "done"
    assert len(calls) == 3
    assert len(sleeps) == 2 and 0.1 <= sleeps[0] <= 0.2 and 0.2 <= sleeps[1] <= 0.4  # jittered, doubling
    retries = [r.getMessage() for r in caplog.records if "concurrent Delta commit" in r.getMessage()]
    assert len(retries) == 2 and "ProtocolChangedException" in retries[0] and "retry 1 of 3" in retries[0]


def test_gives_up_after_the_last_attempt_with_the_original_error(spark):
    calls, sleeps = [], []

    def write():
        calls.append(1)
        raise _conflict()

    with pytest.raises(ConcurrentAppendException) as info:
        tables.with_conflict_retries(write, "metrics [x]", attempts=3, base_seconds=0.01, sleep=sleeps.append)
    assert len(calls) == 3 and len(sleeps) == 2
    assert "still conflicting after 3 attempts" in "".join(getattr(info.value, "__notes__", []))


def test_other_errors_are_not_retried(spark, tmp_path):
    calls = []

    def write():
        calls.append(1)
        raise ValueError("bad write")

    with pytest.raises(ValueError):
        tables.with_conflict_retries(write, "metrics [x]", attempts=5, sleep=lambda s: None)
    assert len(calls) == 1
    with pytest.raises(AnalysisException):  # a real Spark error that is not a conflict: no retry either
        tables.with_conflict_retries(lambda: spark.read.format("delta").load(str(tmp_path / "metrics")).count(), "x",
                                     attempts=5, sleep=lambda s: pytest.fail("retried"))


# ------------------------------------------------------------------------------ real conflicts, in threads

def _metric(spark, run_id: str, value: float):
    return spark.createDataFrame([(run_id, "m", "d", "test", "LL", None, value, 1, None, None, None)],
                                 tables.METRICS)


def _race(spark, warehouse: str, run_ids: list[str]) -> list[BaseException]:
    """Each run (one thread each, released together) writes its metrics slice and its runs row."""
    frames = {r: _metric(spark, r, float(i)) for i, r in enumerate(run_ids)}
    gate = threading.Barrier(len(run_ids))
    errors: list[BaseException] = []

    def one(run_id: str) -> None:
        gate.wait()
        try:
            with recorded_run(spark, warehouse, run_id, "race", "d", {}) as run:
                tables.replace_slice(frames[run_id], warehouse, "metrics", {"run_id": run_id}, run_id)
                run.counts["rows"] = 1
        except BaseException as exc:  # collected: the test asserts on them
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(r,)) for r in run_ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    return errors


def _landed(spark, warehouse: str, run_ids: list[str]) -> None:
    metrics = tables.read_table(spark, warehouse, "metrics").groupBy("run_id").count().collect()
    assert {r["run_id"]: r["count"] for r in metrics} == {r: 1 for r in run_ids}
    runs = tables.read_table(spark, warehouse, "runs").collect()
    assert sorted((r["run_id"], r["job"], r["status"]) for r in runs) == [(r, "race", "succeeded") for r in sorted(run_ids)]


@pytest.mark.parametrize("condition", ["DELTA_CREATE_TABLE_WITH_NON_EMPTY_LOCATION", "DELTA_TABLE_NOT_FOUND"])
def test_a_create_that_finds_another_writers_delta_log_is_a_retried_race(spark, tmp_path, monkeypatch, condition):
    """The loser of a creation race may find the winner's `_delta_log` (its commit not yet in the loser's snapshot):
    Delta then refuses a non-empty location (CI, 16th session: DELTA_CREATE_TABLE_WITH_NON_EMPTY_LOCATION from
    DeltaTableBuilder.execute), or the builder's read-back of the table finds no commit (CI, 19th session:
    DELTA_TABLE_NOT_FOUND from DeltaTable.forPath in DeltaTableBuilder.execute). Either is a conflict to retry,
    and the retry finds the table; the same error without a Delta log at the path stays Delta's own, not retried."""
    warehouse = str(tmp_path / "wh")

    class Builder:   # Delta's builder as the race leaves it
        def __init__(self, winner_log: bool):
            self.winner_log = winner_log

        def __getattr__(self, _):
            return lambda *a, **k: self

        def execute(self):
            (tmp_path / "wh" / ("metrics/_delta_log" if self.winner_log else "runs")).mkdir(parents=True)
            raise AnalysisException(message=f"[{condition}] Cannot create table")
    with monkeypatch.context() as m:
        m.setattr(DeltaTable, "createIfNotExists", lambda _spark: Builder(winner_log=True))
        with pytest.raises(retries.TableCreationRace) as race:
            tables.create_table(spark, warehouse, "metrics")
        assert tables.is_concurrent_modification(race.value)
        m.setattr(DeltaTable, "createIfNotExists", lambda _spark: Builder(winner_log=False))
        with pytest.raises(AnalysisException, match=condition) as foreign:   # no Delta log: not a race
            tables.create_table(spark, warehouse, "runs")
        assert not tables.is_concurrent_modification(foreign.value)


def test_writers_creating_the_same_tables_conflict_and_retries_land_them_all(spark, tmp_path, monkeypatch, caplog):
    """Three runs writing into tables that do not exist yet: all race to commit version 0. Without retries
    some run fails with a Delta conflict; with them every run lands exactly once."""
    run_ids = ["race-a", "race-b", "race-c"]
    monkeypatch.setattr(retries, "WRITE_ATTEMPTS", 1)
    failures = []
    for attempt in range(3):
        failures = _race(spark, str(tmp_path / f"no-retry-{attempt}"), run_ids)
        if failures:
            break
    assert failures, "three writers creating one table never conflicted: the race did not happen"
    assert all(tables.is_concurrent_modification(e) for e in failures), failures

    monkeypatch.setattr(retries, "WRITE_ATTEMPTS", 8)
    monkeypatch.setattr(retries, "RETRY_BASE_SECONDS", 0.2)
    retried = 0
    for attempt in range(3):
        warehouse = str(tmp_path / f"retry-{attempt}")
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="clickeval.tables"):
            assert _race(spark, warehouse, run_ids) == []
        _landed(spark, warehouse, run_ids)
        retried = sum("concurrent Delta commit" in r.getMessage() for r in caplog.records)
        if retried:
            break
    assert retried, "no conflict was retried in three races"


def test_disjoint_run_slices_commit_concurrently_without_conflicts(spark, tmp_path, monkeypatch):
    """On existing tables, runs writing their own run_id partition (replaceWhere and the runs MERGE) never
    conflict: no retry allowed, and simultaneous runs all land. (A MERGE on `runs` without the literal
    run_id predicate reads the whole table and fails here with ConcurrentAppendException.)"""
    warehouse = str(tmp_path / "wh")
    _race(spark, warehouse, ["seed"])  # create metrics and runs
    monkeypatch.setattr(retries, "WRITE_ATTEMPTS", 1)
    run_ids = ["r-a", "r-b", "r-c"]
    assert _race(spark, warehouse, run_ids) == []  # new slices: appends into new partitions
    _landed(spark, warehouse, ["seed", *run_ids])
    # rewriting slices that exist (MERGE updates, replaceWhere deletes) next to each other does not conflict either
    assert _race(spark, warehouse, ["seed", *run_ids]) == []
    _landed(spark, warehouse, ["seed", *run_ids])


# ------------------------------------------------------------------------------ two whole pipelines at once

def _comparable(spark, warehouse: str, run_id: str, dataset: str, digits: int | None) -> dict:
    """Every table's rows of one run (its dataset's serps and labels, its truth params), run id and dataset
    replaced by placeholders; runs by (job, status, counts)."""
    rename = {run_id: "<run>", dataset: "<dataset>", f"truth-{dataset}": "<truth>"}
    out = {}
    for name in tables.SCHEMAS:
        if name == "runs":
            rows = tables.read_table(spark, warehouse, "runs").where(F.col("run_id") == run_id)
            # the report page names its run and dataset: its size in bytes is the one run-specific count
            out[name] = sorted((r["job"], r["status"], sorted(kv for kv in r["counts"].items()
                                                              if (r["job"], kv[0]) != ("report", "bytes")))
                               for r in rows.collect())
        elif name in ("serps", "relevance_labels"):
            out[name] = P.table_rows(spark, warehouse, name, where=f"dataset = '{dataset}'", rename=rename,
                                     digits=digits)
        else:
            ids = (run_id, f"truth-{dataset}") if name == "model_params" else (run_id,)
            out[name] = P.table_rows(spark, warehouse, name, rename=rename, digits=digits,
                                     where="run_id IN (" + ", ".join(f"'{i}'" for i in ids) + ")")
    return out


def _commit_order(spark, warehouse: str, run_ids: tuple[str, str]) -> list[str]:
    """Which run made each tagged commit of any table, in commit time order."""
    commits = []
    for name in P.existing_tables(spark, warehouse):
        for r in DeltaTable.forPath(spark, tables.table_path(warehouse, name)).history().collect():
            who = [run for run in run_ids if f"run_id={run} " in (r["userMetadata"] or "")]
            if who:
                commits.append((r["timestamp"], who[0]))
    return [who for _, who in sorted(commits)]


def test_two_pipeline_processes_on_one_warehouse_both_land_completely(spark, tmp_path_factory):
    """A `jobs.pipeline` process and the test session run every stage into one fresh warehouse at the same
    time (see _pipeline.concurrent_pair). Both runs' rows in every table equal the baseline run's; the
    in-session run (same settings as the baseline) bitwise, the process (8 partitions) with floats to 12
    significant digits: bit-identity across partitionings is test_reproducibility's to prove."""
    base = P.baseline(spark, tmp_path_factory)
    pair = P.concurrent_pair(spark, tmp_path_factory)
    output = P.tail(pair.log, 60)
    assert pair.returncode == 0, output
    order = _commit_order(spark, pair.warehouse, (P.PROC_RUN, P.SESSION_RUN))
    print(f"commits in time order (p: job, s: session): {''.join('p' if w == P.PROC_RUN else 's' for w in order)}; "
          f"retries logged by the job: {output.count('concurrent Delta commit')}")
    switches = sum(a != b for a, b in zip(order, order[1:]))
    assert switches >= 2, f"the two runs' writes did not overlap in time: {order}"

    for run_id, digits in ((P.SESSION_RUN, None), (P.PROC_RUN, 12)):
        expected = _comparable(spark, base.warehouse, P.BASE_RUN, P.DATASET, digits)
        got = _comparable(spark, pair.warehouse, run_id, P.DATASETS[run_id], digits)
        for name, rows in expected.items():
            assert rows or name == "quarantine", name  # a simulated log has nothing to quarantine
            assert got[name] == rows, f"{run_id}: {name}\n" + (P.diff(rows, got[name]) if name != "runs" else
                                                                 f"{rows}\n{got[name]}")
        assert (pair.reports / f"{run_id}.html").stat().st_size > 10_000
    runs = tables.read_table(spark, pair.warehouse, "runs").groupBy("run_id", "job").count()
    assert runs.where("count != 1").count() == 0
    assert {r["dataset"] for r in tables.read_table(spark, pair.warehouse, "serps").select("dataset").distinct()
            .collect()} == set(P.DATASETS.values())
