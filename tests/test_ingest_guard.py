"""Issue 15: an ingest that accepts no record, or quarantines more than ingest.max_quarantine_share of
its records, fails before any write (one line, exit 2); the dataset's slices and Delta versions stay."""

from __future__ import annotations

import json

import pytest
from delta.tables import DeltaTable
from pyspark.sql import functions as F

from clickeval_spark import tables
from clickeval_spark.config import IngestConfig
from clickeval_spark.errors import ConfigError
from jobs import ingest as ingest_job

GOOD = [f"s{i}\tq1\t[1, 2]\t[0, 0]\t[0, 1]" for i in range(1, 7)]
LABELS = "s1\tq1\t[1, 2]\t[0, 0]\t[0, 1]\t[2, 0]\n"


def _write(path, text: str | bytes) -> str:
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    return str(path)


def _ingest(conf: str, run_id: str, *settings: str) -> int:
    argv = ["--conf", conf, "--run-id", run_id, "--set", "ingest.dataset=guarded",
            "--set", "ingest.format=per_query_text"]
    for setting in settings:
        argv += ["--set", setting]
    return ingest_job.main(argv)


def _versions(spark, warehouse) -> dict[str, int]:
    return {name: DeltaTable.forPath(spark, tables.table_path(warehouse, name)).history(1).first()["version"]
            for name in ("serps", "relevance_labels", "quarantine")}


def _serps(spark, warehouse) -> list[tuple]:
    return sorted((r["serp_id"], r["ingest_run_id"]) for r in
                  tables.read_table(spark, warehouse, "serps").where(F.col("dataset") == "guarded").collect())


def _run_row(spark, warehouse, run_id):
    [row] = tables.read_table(spark, warehouse, "runs").where(
        (F.col("run_id") == run_id) & (F.col("job") == "ingest")).collect()
    return row


@pytest.mark.slow
def test_binary_file_fails_before_any_write_and_keeps_the_dataset(spark, warehouse, tmp_path, job_conf, capsys):
    good = _write(tmp_path / "good.txt", "\n".join(GOOD) + "\n")
    labels = _write(tmp_path / "labels.txt", LABELS)
    assert _ingest(job_conf, "good-1", f"ingest.paths={{train: {good}}}", f"ingest.labels={labels}") == 0
    before, kept = _versions(spark, warehouse), _serps(spark, warehouse)
    assert len(kept) == 6
    capsys.readouterr()

    # 16 lines of binary (every byte but the line ends), none of them a SERP
    binary = _write(tmp_path / "image.bin", (bytes(b for b in range(256) if b not in b"\r\n") + b"\n") * 16)
    rc = _ingest(job_conf, "binary-1", f"ingest.paths={{train: {binary}}}", f"ingest.labels={labels}")
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert err == [f"clickeval ingest: error: ingest refused, nothing written: {binary}: serps read 16, accepted 0, "
                   "quarantined 16 (no record accepted; most frequent rules: unparseable 16)"]
    # nothing written: no new Delta version of any ingest table, the good slice as it was
    assert _versions(spark, warehouse) == before
    assert _serps(spark, warehouse) == kept
    failed = _run_row(spark, warehouse, "binary-1")
    assert failed["status"] == "failed" and "ingest refused" in json.loads(failed["details"])["error"]
    assert (failed["counts"]["serps_read"], failed["counts"]["serps_quarantined"]) == (16, 16)


@pytest.mark.slow
def test_mostly_quarantined_input_fails_naming_counts_and_rules(spark, warehouse, tmp_path, job_conf, capsys):
    lines = (GOOD + [f"garbage line {i}" for i in range(4)]  # unparseable: one field
             + [f"c{i}\tq1\t[1, 2]\t[0, 0]\t[0, 2]" for i in range(3)]  # click_not_binary
             + [f"l{i}\tq1\t[1, 2]\t[0, 0]\t[0]" for i in range(2)]  # length_mismatch
             + ["\u3000\tq1\t[1]\t[0]\t[1]"])  # missing_id: the fourth rule, not named
    path = _write(tmp_path / "mixed.txt", "\n".join(lines) + "\n")
    rc = _ingest(job_conf, "mixed-1", f"ingest.paths={{train: {path}}}")
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert err == [f"clickeval ingest: error: ingest refused, nothing written: {path}: serps read 16, accepted 6, "
                   "quarantined 10 (62.5% quarantined > ingest.max_quarantine_share 0.5; most frequent rules: "
                   "unparseable 4, click_not_binary 3, length_mismatch 2)"]
    assert not DeltaTable.isDeltaTable(spark, tables.table_path(warehouse, "serps"))
    assert not DeltaTable.isDeltaTable(spark, tables.table_path(warehouse, "quarantine"))
    assert _run_row(spark, warehouse, "mixed-1")["status"] == "failed"

    # a looser threshold lets the same input through: the good lines land, the others are quarantined
    assert _ingest(job_conf, "mixed-2", f"ingest.paths={{train: {path}}}", "ingest.max_quarantine_share=0.7") == 0
    assert _serps(spark, warehouse) == [(f"s{i}-1", "mixed-2") for i in range(1, 7)]
    counts = _run_row(spark, warehouse, "mixed-2")["counts"]
    assert (counts["serps_accepted"], counts["serps_quarantined"]) == (6, 10)


@pytest.mark.slow
def test_broken_label_file_is_refused_too(spark, warehouse, tmp_path, job_conf, capsys):
    good = _write(tmp_path / "good.txt", "\n".join(GOOD) + "\n")
    labels = _write(tmp_path / "labels.txt", "not a label\nnor this\n")
    rc = _ingest(job_conf, "labels-1", f"ingest.paths={{train: {good}}}", f"ingest.labels={labels}")
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert err == [f"clickeval ingest: error: ingest refused, nothing written: {labels}: relevance_labels read 2, "
                   "accepted 0, quarantined 2 (no record accepted; most frequent rules: unparseable 2)"]
    assert not DeltaTable.isDeltaTable(spark, tables.table_path(warehouse, "serps"))


@pytest.mark.parametrize("share", [-0.1, 1.5])
def test_max_quarantine_share_is_a_fraction(share):
    with pytest.raises(ConfigError, match=r"ingest.max_quarantine_share: must be in \[0, 1\]"):
        IngestConfig(max_quarantine_share=share)


def test_a_rerun_replaces_the_quarantine_of_its_earlier_attempt_and_commits_nothing_when_there_is_none(
        spark, warehouse, tmp_path, job_conf):
    """An ingest with nothing quarantined writes no quarantine commit, unless an earlier attempt of the same run
    left rows there to replace: those go (a corrected input rerun under its run id)."""
    log = tmp_path / "log.txt"
    path = _write(log, "\n".join(GOOD + ["s9\tq1\t[1, 2]\t[0, 0]\t[0, 2]"]) + "\n")   # line 7: a click of 2

    def quarantined() -> list[tuple]:
        return [(r["line"], r["rule"]) for r in tables.read_table(spark, warehouse, "quarantine")
                .where(F.col("run_id") == "rerun").collect()]

    assert _ingest(job_conf, "rerun", f"ingest.paths={{train: {path}}}") == 0
    assert quarantined() == [(7, "click_not_binary")]
    _write(log, "\n".join(GOOD) + "\n")
    assert _ingest(job_conf, "rerun", f"ingest.paths={{train: {path}}}") == 0
    assert quarantined() == []
    def version() -> int:
        return DeltaTable.forPath(spark, tables.table_path(warehouse, "quarantine")).history(1).first()["version"]

    before = version()
    assert _ingest(job_conf, "rerun", f"ingest.paths={{train: {path}}}") == 0
    assert version() == before
    assert _run_row(spark, warehouse, "rerun")["counts"]["serps_quarantined"] == 0
