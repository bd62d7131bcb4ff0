"""Daily inputs (DESIGN §3): an ingest location names its day with {log_date}, filled from ingest.log_date,
so a scheduled ingest reads that day's folder and no other; a missing day fails in one line naming the
location expected, an empty day is refused like an empty file, both before any write."""

from __future__ import annotations

import calendar
import json
import re
from datetime import date

import pytest
from delta.tables import DeltaTable
from pyspark.sql import functions as F

from clickeval_spark import tables
from clickeval_spark.config import IngestConfig
from clickeval_spark.errors import ConfigError, InputError
from jobs import ingest as ingest_job
from tests.sources.helpers import interaction, rules, run

pytestmark = pytest.mark.slow

D28, D29 = date(2026, 11, 28), date(2026, 11, 29)
TEXT_RECORDS = "tab-separated lines 'sid, qid, [docs], [vtypes], [clicks]'"


def _line(sid: str) -> str:
    return f"{sid}\tq1\t[\"a\", \"b\"]\t[0, 0]\t[0, 1]\n"


def _write(path, text: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


@pytest.fixture
def logs(tmp_path):
    """Two days of per-query text: dt=2026-11-28 holds 3 lines in two files, dt=2026-11-29 2 lines."""
    root = tmp_path / "logs"
    _write(root / "dt=2026-11-28" / "part-0.txt", _line("a1") + _line("a2"))
    _write(root / "dt=2026-11-28" / "part-1.txt", _line("a3"))
    _write(root / "dt=2026-11-28" / "_SUCCESS", "")
    _write(root / "dt=2026-11-29" / "part-0.txt", _line("b1") + _line("b2"))
    return root


def _ingest(conf: str, run_id: str, location: str, log_date: date | None, *settings: str) -> int:
    argv = ["--conf", conf, "--run-id", run_id, "--set", "ingest.dataset=daily",
            "--set", "ingest.format=per_query_text", "--set", f"ingest.paths={{all: '{location}'}}"]
    for setting in ([f"ingest.log_date={log_date}"] if log_date else []) + list(settings):
        argv += ["--set", setting]
    return ingest_job.main(argv)


def _slices(spark, warehouse) -> dict:
    """{log_date: sorted session ids} of the dataset's serps."""
    out: dict = {}
    for r in tables.read_table(spark, warehouse, "serps").where(F.col("dataset") == "daily").collect():
        out.setdefault(r["log_date"], []).append(r["session_id"])
    return {day: sorted(ids) for day, ids in out.items()}


def _run_row(spark, warehouse, run_id):
    [row] = tables.read_table(spark, warehouse, "runs").where(
        (F.col("run_id") == run_id) & (F.col("job") == "ingest")).collect()
    return row


def _written(spark, warehouse) -> list[str]:
    return [name for name in ("serps", "quarantine", "relevance_labels")
            if DeltaTable.isDeltaTable(spark, tables.table_path(warehouse, name))]


def test_a_daily_ingest_reads_only_its_days_folder(spark, warehouse, job_conf, logs):
    template = f"{logs}/dt={{log_date}}/"
    assert _ingest(job_conf, "daily-20261128", template, D28) == 0
    assert _slices(spark, warehouse) == {D28: ["a1", "a2", "a3"]}
    row = _run_row(spark, warehouse, "daily-20261128")
    details = json.loads(row["details"])
    assert details["inputs"] == {"paths.all": f"{logs}/dt=2026-11-28/"}
    assert details["input_files"] == [f"{logs}/dt=2026-11-28/part-0.txt", f"{logs}/dt=2026-11-28/part-1.txt"]
    assert details["log_dates"] == ["2026-11-28"]
    assert (row["counts"]["serps_read"], row["counts"]["serps_accepted"]) == (3, 3)

    # the next day: its own folder, its own slice; the day before stays
    assert _ingest(job_conf, "daily-20261129", template, D29) == 0
    assert _slices(spark, warehouse) == {D28: ["a1", "a2", "a3"], D29: ["b1", "b2"]}
    details = json.loads(_run_row(spark, warehouse, "daily-20261129")["details"])
    assert details["input_files"] == [f"{logs}/dt=2026-11-29/part-0.txt"]


def test_a_day_in_the_file_name_with_a_format(spark, tmp_path):
    path = _write(tmp_path / "logs" / "20261129.txt", _line("c1"))
    _write(tmp_path / "logs" / "20261128.txt", _line("c0"))
    cfg = IngestConfig(dataset="daily", format="per_query_text", log_date=D29,
                       paths={"all": str(tmp_path / "logs" / "{log_date:%Y%m%d}.txt")})
    out = run(spark, cfg)
    assert out.files == (path,)
    assert [r["session_id"] for r in out.serps.collect()] == ["c1"]


def test_a_missing_day_fails_in_one_line_naming_the_location_and_writes_nothing(spark, warehouse, job_conf, logs,
                                                                                  capsys):
    rc = _ingest(job_conf, "daily-20261130", f"{logs}/dt={{log_date}}/", date(2026, 11, 30))
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert err == [f"clickeval ingest: error: no input for log_date 2026-11-30: {logs}/dt=2026-11-30/ does not exist"]
    assert _written(spark, warehouse) == []
    failed = _run_row(spark, warehouse, "daily-20261130")
    assert failed["status"] == "failed"
    assert json.loads(failed["details"])["inputs"] == {"paths.all": f"{logs}/dt=2026-11-30/"}


def test_a_missing_days_label_file_fails_the_same_way(spark, logs):
    cfg = IngestConfig(dataset="daily", format="per_query_text", log_date=D28,
                       paths={"all": f"{logs}/dt={{log_date}}/"}, labels=f"{logs}/labels-{{log_date}}.txt")
    expected = f"no input for log_date 2026-11-28: {logs}/labels-2026-11-28.txt does not exist"
    with pytest.raises(InputError, match=f"^{re.escape(expected)}$"):
        run(spark, cfg)


@pytest.mark.parametrize("content", [{}, {"_SUCCESS": ""}, {"part-0.txt": ""}])
def test_an_empty_day_is_refused_before_any_write(spark, warehouse, job_conf, logs, capsys, content):
    day = logs / "dt=2026-12-01"
    day.mkdir()
    for name, text in content.items():
        _write(day / name, text)
    rc = _ingest(job_conf, "daily-20261201", f"{logs}/dt={{log_date}}", date(2026, 12, 1))
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    if "part-0.txt" in content:   # an empty file: the file is named, as for any input
        expected = f"{day}/part-0.txt: breaks rule empty_input: no records in it (expected {TEXT_RECORDS})"
    else:   # no data file at all (hidden files are not read)
        expected = f"{day}: breaks rule empty_input: no input file in it (expected {TEXT_RECORDS})"
    assert err == [f"clickeval ingest: error: {expected}"]
    assert _written(spark, warehouse) == []
    assert _run_row(spark, warehouse, "daily-20261201")["status"] == "failed"


@pytest.mark.parametrize("setting", ["ingest.paths={all: 'logs/dt={log_date}/'}", "ingest.labels=labels/{log_date}.txt"])
def test_a_placeholder_without_log_date_is_a_config_error(spark, job_conf, tmp_path, capsys, setting):
    argv = ["--conf", job_conf, "--set", "ingest.format=per_query_text", "--set", f"ingest.paths={{all: '{tmp_path}'}}",
            "--set", setting]
    assert ingest_job.main(argv) == 2
    [err] = capsys.readouterr().err.strip().splitlines()
    key = "ingest.labels" if "labels" in setting else "ingest.paths.all"
    assert err.startswith(f"clickeval ingest: error: {key}: ")
    assert "names its day with {log_date}, but ingest.log_date is not set" in err
    with pytest.raises(ConfigError, match=r"^ingest.paths.all: 's3a://b/dt=\{log_date\}/' names its day"):
        run(spark, IngestConfig(format="tiangong_xml", paths={"all": "s3a://b/dt={log_date}/"}))


def test_a_record_of_another_day_in_a_daily_folder_is_quarantined(spark, tmp_path):
    """TianGong-ST starttime still gives each SERP its day; one that falls outside the folder's day is
    quarantined (other_day) rather than written, so the ingest replaces the folder's day only."""
    late = calendar.timegm((2026, 11, 27, 23, 59, 0))   # the previous UTC day, in the 2026-11-28 folder
    on_day = calendar.timegm((2026, 11, 28, 8, 0, 0))
    _write(tmp_path / "dt=2026-11-28" / "sessions.xml", (
        "<root>\n"
        f'<session num="1" starttime="{on_day}">{interaction(1, "q1", ["d1", "d2"], [1])}</session>\n'
        f'<session num="2" starttime="{late}">{interaction(1, "q1", ["d2", "d1"], [])}</session>\n'
        f'<session num="3">{interaction(1, "q2", ["d3"], [1])}</session>\n'   # no time: the folder's day
        f'<session num="4" starttime="{late}">{interaction(1, "q2", ["d3"], [1])}</session>\n'
        "</root>\n"))
    cfg = IngestConfig(dataset="tg", format="tiangong_xml", paths={"all": str(tmp_path / "dt={log_date}")},
                       log_date=D28)
    out = run(spark, cfg)
    assert out.log_dates == (D28,)
    assert sorted((r["serp_id"], r["log_date"]) for r in out.serps.collect()) == [("1-1", D28), ("3-1", D28)]
    assert rules(out) == [("session 2 interaction 1", "other_day"), ("session 4 interaction 1", "other_day")]
    reason = out.quarantine.first()["reason"]
    assert "own time gives log_date 2026-11-27" in reason and "log_date 2026-11-28's records" in reason

    # the same file named without its day keeps today's behaviour: each SERP its own day
    whole = IngestConfig(dataset="tg", format="tiangong_xml", log_date=D28,
                         paths={"all": str(tmp_path / "dt=2026-11-28")})
    assert run(spark, whole).log_dates == (date(2026, 11, 27), D28)
