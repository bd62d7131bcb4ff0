"""Days as partitions and log_date windows (DESIGN §6, issue 15).

serps (and relevance_labels tied to a SERP) carry log_date; an ingest replaces only its
(dataset, log_date) slices; fit, predict, evaluate, generate and surrogate read `window`
(both ends inclusive) or the whole dataset; the window is recorded in `runs` and shown in
the report.
"""

from __future__ import annotations

import calendar
import json
from datetime import date, datetime

import pytest
import yaml
from delta.tables import DeltaTable
from pyspark.sql import functions as F
from pyspark.sql import types as T

from clickeval_spark import tables
from clickeval_spark.context import StageContext
from clickeval_spark.stages import STAGES
from clickeval_spark.stages.ingest import write_ingest
from clickeval_spark.config import (PROJECT_ROOT, AppConfig, EvaluateConfig, ExternalModelConfig, FitConfig,
                                    IngestConfig, PredictConfig, WindowConfig, load_config)
from clickeval_spark.errors import ConfigError
from clickeval_spark.report_html import build_report
from clickeval_spark.runtime import load
from tests.sources.helpers import interaction, rules, run, write

# minutes of Spark: `make test-fast` leaves it out (docs/development.md)
pytestmark = pytest.mark.slow

LOCAL = PROJECT_ROOT / "conf" / "local.yaml"
D1, D2, D3, D5 = date(2026, 11, 1), date(2026, 11, 2), date(2026, 11, 3), date(2026, 11, 5)


def _line(sid: str, qid: str, docs: list[str], clicks: list[int]) -> str:
    return f"{sid}\t{qid}\t{json.dumps(docs)}\t{json.dumps([0] * len(docs))}\t{json.dumps(clicks)}\n"


def _text(tmp_path, name: str, lines: list[str]) -> str:
    return write(tmp_path / name, "".join(lines))


def _cfg(paths: dict[str, str], *, dataset: str = "days", log_date: date | None = None,
         window: WindowConfig | None = None, **sections) -> AppConfig:
    return AppConfig(ingest=IngestConfig(dataset=dataset, format="per_query_text", paths=paths, log_date=log_date),
                     window=window, **sections)


def _slices(spark, warehouse: str, dataset: str = "days") -> dict:
    """{log_date: sorted serp_ids} of the dataset's serps."""
    rows = tables.read_table(spark, warehouse, "serps").where(F.col("dataset") == dataset).collect()
    out: dict = {}
    for r in rows:
        out.setdefault(r["log_date"], []).append(r["serp_id"])
    return {k: sorted(v) for k, v in out.items()}


def _details(spark, warehouse: str, run_id: str) -> dict[str, dict]:
    rows = tables.read_table(spark, warehouse, "runs").where(F.col("run_id") == run_id).collect()
    return {r["job"]: json.loads(r["details"]) for r in rows}


def test_each_ingest_replaces_only_its_days(spark, warehouse, tmp_path):
    one_shot = _text(tmp_path, "undated.txt", [_line("u1", "q1", ["a", "b"], [1, 0])])
    day1 = _text(tmp_path, "day1.txt", [_line("s1", "q1", ["a", "b"], [0, 1]), _line("s2", "q2", ["c"], [1])])
    day2 = _text(tmp_path, "day2.txt", [_line("s3", "q1", ["b", "a"], [1, 0])])
    STAGES["ingest"](StageContext(spark, _cfg({"train": one_shot}), warehouse, "undated-1"))
    STAGES["ingest"](StageContext(spark, _cfg({"train": day1}, log_date=D1), warehouse, "day1"))
    STAGES["ingest"](StageContext(spark, _cfg({"train": day2}, log_date=D2), warehouse, "day2"))
    assert _slices(spark, warehouse) == {None: ["u1-1"], D1: ["s1-1", "s2-1"], D2: ["s3-1"]}

    # re-ingesting day 1 replaces that day alone; its counts reconcile against its own slice
    day1_again = _text(tmp_path, "day1b.txt", [_line("s4", "q3", ["d", "e"], [0, 0])])
    counts = STAGES["ingest"](StageContext(spark, _cfg({"train": day1_again}, log_date=D1), warehouse, "day1-again"))
    assert _slices(spark, warehouse) == {None: ["u1-1"], D1: ["s4-1"], D2: ["s3-1"]}
    assert (counts["read"], counts["serps_accepted"], counts["quarantined"]) == (1, 1, 0)
    assert _details(spark, warehouse, "day1-again")["ingest"]["log_dates"] == ["2026-11-01"]

    # a one-shot (undated) ingest replaces the undated slice and leaves the days alone
    STAGES["ingest"](StageContext(spark, _cfg({"train": _text(tmp_path, "u2.txt", [_line("u2", "q1", ["a"], [0])])}),
                        warehouse, "undated-2"))
    assert _slices(spark, warehouse) == {None: ["u2-1"], D1: ["s4-1"], D2: ["s3-1"]}
    assert _details(spark, warehouse, "undated-2")["ingest"]["log_dates"] == [None]

    path = tables.table_path(warehouse, "serps")
    assert DeltaTable.forPath(spark, path).detail().first()["partitionColumns"] == ["dataset", "log_date"]
    # days as partitions need no table feature: the protocol stays readable by delta-rs and DuckDB
    protocol = spark.sql(f"DESCRIBE DETAIL delta.`{path}`").select("minReaderVersion", "minWriterVersion").first()
    assert tuple(protocol) == (1, 2)


XML_TWO_DAYS = (
    "<root>\n"
    # session 1 starts 30 s before midnight UTC; its second interaction carries its own time, after midnight
    f'<session num="1" starttime="{calendar.timegm((2026, 11, 1, 23, 59, 30)) + 0.25}">'
    f'{interaction(1, "q1", ["d1", "d2"], [1])}'
    + interaction(2, "q2", ["d4", "d5"], []).replace(
        '<interaction num="2">', f'<interaction num="2" starttime="{calendar.timegm((2026, 11, 2, 0, 0, 10))}">')
    + "</session>\n"
    f'<session num="2">{interaction(1, "q1", ["d2", "d1"], [])}</session>\n'  # no time: ingest.log_date
    f'<session num="3" starttime="soon">{interaction(1, "q3", ["d7"], [])}</session>\n'
    "</root>\n"
)
LABELS = "1 1 1 1 3\n2 1 2 4 2\n3 9 9 9 4\n"  # tied to SERP 1-1 (day 1), to 1-2 (day 2), to nothing


def test_tiangong_starttime_gives_the_utc_day_of_each_serp(spark, tmp_path):
    xml, labels = write(tmp_path / "s.xml", XML_TWO_DAYS), write(tmp_path / "l.txt", LABELS)
    cfg = IngestConfig(dataset="tg", format="tiangong_xml", paths={"all": xml}, labels=labels,
                       label_query_prefix="q", label_doc_prefix="d", log_date=D5)
    out = run(spark, cfg)
    assert sorted((r["serp_id"], r["log_date"]) for r in out.serps.collect()) == [
        ("1-1", D1), ("1-2", D2), ("2-1", D5)]
    assert sorted(out.log_dates) == [D1, D2, D5]
    # a starttime that is not Unix seconds is quarantined, not silently re-dated
    assert rules(out) == [("session 3 interaction 1", "unparseable")]
    assert "starttime soon is not Unix seconds" in out.quarantine.first()["reason"]
    # labels take the day of the SERP they are tied to; an untied label takes ingest.log_date
    assert sorted((r["doc_id"], r["serp_id"], r["log_date"]) for r in out.labels.collect()) == [
        ("d1", "1-1", D1), ("d4", "1-2", D2), ("d9", None, D5)]


def test_window_reads_only_its_days_and_undated_labels(spark, warehouse, tmp_path):
    xml, labels = write(tmp_path / "s.xml", XML_TWO_DAYS), write(tmp_path / "l.txt", LABELS)
    cfg = IngestConfig(dataset="tg", format="tiangong_xml", paths={"all": xml}, labels=labels,
                       label_query_prefix="q", label_doc_prefix="d")  # no ingest.log_date: session 2 undated
    write_ingest(StageContext(spark, AppConfig(ingest=cfg), warehouse, "tg-1"), run(spark, cfg, "tg-1"))
    app = AppConfig(ingest=cfg, window=WindowConfig(D2, D2))
    assert sorted(r["serp_id"] for r in StageContext(spark, app, warehouse, "-").serps().collect()) == ["1-2"]
    assert sorted((r["doc_id"], r["log_date"]) for r in StageContext(spark, app, warehouse, "-").labels().collect()) == [
        ("d4", D2), ("d9", None)]
    whole = AppConfig(ingest=cfg)
    assert sorted(r["serp_id"] for r in StageContext(spark, whole, warehouse, "-").serps().collect()) == ["1-1", "1-2", "2-1"]
    assert StageContext(spark, whole, warehouse, "-").labels().count() == 3


def test_fit_predict_evaluate_and_report_see_only_the_window(spark, warehouse, tmp_path):
    docs = ["a", "b", "c"]
    for day, when in enumerate((D1, D2, D3), start=1):
        train = [_line(f"t{day}{i}", "q1", docs, [i % 2, 0, (i + day) % 2]) for i in range(4)]
        if day == 1:  # a query only the first day has: a fit over days 2-3 never sees it
            train.append(_line("t1old", "qold", ["x", "y", "z"], [1, 1, 0]))
        test = [_line(f"e{day}{i}", "q1", docs, [0, i % 2, 0]) for i in range(day)]  # 1, 2, 3 test SERPs
        paths = {"train": _text(tmp_path, f"train{day}.txt", train), "test": _text(tmp_path, f"test{day}.txt", test)}
        STAGES["ingest"](StageContext(spark, _cfg(paths, log_date=when), warehouse, f"ingest-{day}"))

    # an external model predicts every test SERP of every day: those outside the window are not evaluated
    external = str(tmp_path / "external")
    spark.createDataFrame([(f"e{day}{i}-1", rank, 0.3, 0.3) for day in (1, 2, 3) for i in range(day)
                           for rank in (1, 2, 3)], "serp_id string, rank int, p_click_cond double, p_click double") \
        .write.parquet(external)
    run_id = "window-2-3"
    cfg = _cfg({"train": "unused"}, window=WindowConfig(D2, D3), fit=FitConfig(models=("pbm",), iterations=2),
               predict=PredictConfig(splits=("test",)),
               evaluate=EvaluateConfig(replicates=5, reference_model=None,
                                       external=(ExternalModelConfig(name="ext", predictions=external),)))
    STAGES["fit"](StageContext(spark, cfg, warehouse, run_id))
    STAGES["predict"](StageContext(spark, cfg, warehouse, run_id))
    STAGES["evaluate"](StageContext(spark, cfg, warehouse, run_id))

    params = tables.read_table(spark, warehouse, "model_params").where(F.col("run_id") == run_id)
    assert {r["query_id"] for r in params.select("query_id").distinct().collect()} == {"q1", None}
    preds = tables.read_table(spark, warehouse, "click_predictions").where(F.col("run_id") == run_id)
    window_serps = {f"t{d}{i}-1" for d in (2, 3) for i in range(4)} | {"e20-1", "e21-1", "e30-1", "e31-1", "e32-1"}
    assert {r["serp_id"] for r in preds.select("serp_id").distinct().collect()} == window_serps
    ll = (tables.read_table(spark, warehouse, "metrics")
          .where((F.col("run_id") == run_id) & (F.col("metric") == "LL")).collect())
    assert sorted((r["model"], r["n"]) for r in ll) == [("ext", 5), ("pbm", 5)]  # days 2 and 3, not day 1

    window = {"start": "2026-11-02", "end": "2026-11-03"}
    details = _details(spark, warehouse, run_id)
    assert {job: d["window"] for job, d in details.items()} == {"fit:pbm": window, "predict": window,
                                                                "evaluate": window}
    assert "Window: log_date 2026-11-02 to 2026-11-03 (both inclusive)" in build_report(
        StageContext(spark, cfg, warehouse, run_id), run_id, "days", ["pbm"], [1])
    # the whole dataset: a run without a window records null and the report says so
    whole = _cfg({"train": "unused"}, fit=FitConfig(models=("pbm",), iterations=1))
    STAGES["fit"](StageContext(spark, whole, warehouse, "whole"))
    assert _details(spark, warehouse, "whole")["fit:pbm"]["window"] is None
    assert "Window: the whole dataset" in build_report(StageContext(spark, whole, warehouse, "whole"), "whole", "days",
                                                       ["pbm"], [1])


def test_a_serps_table_partitioned_by_dataset_alone_keeps_working(spark, warehouse, tmp_path):
    """Warehouses written before days were partitions: serps partitioned by dataset, relevance_labels
    without log_date. Day slices are then replaced through the log_date column."""
    tables.conform(spark.createDataFrame([], tables.SERPS), "serps").write.format("delta").partitionBy(
        "dataset").save(tables.table_path(warehouse, "serps"))
    old_labels = [f for f in tables.RELEVANCE_LABELS.fields if f.name != "log_date"]
    spark.createDataFrame([("tg", "q0", "d0", 1, None, None, None, "old")], T.StructType(old_labels)) \
        .write.format("delta").partitionBy("dataset").save(tables.table_path(warehouse, "relevance_labels"))
    xml, labels = write(tmp_path / "s.xml", XML_TWO_DAYS), write(tmp_path / "l.txt", LABELS)
    cfg = IngestConfig(dataset="tg", format="tiangong_xml", paths={"all": xml}, labels=labels,
                       label_query_prefix="q", label_doc_prefix="d", log_date=D5)
    write_ingest(StageContext(spark, AppConfig(ingest=cfg), warehouse, "tg-1"), run(spark, cfg, "tg-1"))
    day3 = write(tmp_path / "d3.xml", f'<root><session num="7">{interaction(1, "q1", ["d1"], [1])}</session></root>')
    cfg3 = IngestConfig(dataset="tg", format="tiangong_xml", paths={"all": day3}, log_date=D3)
    write_ingest(StageContext(spark, AppConfig(ingest=cfg3), warehouse, "tg-2"), run(spark, cfg3, "tg-2"))
    assert _slices(spark, warehouse, "tg") == {D1: ["1-1"], D2: ["1-2"], D3: ["7-1"], D5: ["2-1"]}
    path = tables.table_path(warehouse, "serps")
    assert DeltaTable.forPath(spark, path).detail().first()["partitionColumns"] == ["dataset"]
    # the old undated label row stays (its slice was not replaced) and gains a null log_date
    got = sorted((r["doc_id"], r["log_date"]) for r in tables.read_table(spark, warehouse, "relevance_labels")
                 .collect())
    assert got == [("d0", None), ("d1", D1), ("d4", D2), ("d9", D5)]
    labels_path = tables.table_path(warehouse, "relevance_labels")
    protocol = spark.sql(f"DESCRIBE DETAIL delta.`{labels_path}`").select("minReaderVersion", "minWriterVersion").first()
    assert tuple(protocol) == (1, 2)  # ADD COLUMNS needs no table feature


def test_canonical_rows_keep_their_own_log_date(spark, tmp_path):
    path = str(tmp_path / "canonical")
    spark.createDataFrame(
        [("s1", "q1", ["a"], [1], "2026-11-01"), ("s2", "q1", ["a"], [0], None), ("s3", "q1", ["a"], [0], "someday")],
        "session_id string, query_id string, doc_ids array<string>, clicks array<int>, log_date string",
    ).withColumn("serp_pos", F.lit(1)).write.parquet(path)
    out = run(spark, IngestConfig(dataset="c", format="parquet", paths={"all": path}, log_date=D5))
    assert sorted((r["serp_id"], r["log_date"]) for r in out.serps.collect()) == [("s1-1", D1), ("s2-1", D5)]
    bad = out.quarantine.collect()
    assert [(b["rule"], b["reason"]) for b in bad] == [("unparseable", "log_date someday is not a date")]


def test_window_and_log_date_config():
    cfg, _ = load(LOCAL, ["window.start=2026-11-02", "window.end='2026-11-03'", "ingest.log_date=2026-11-03"])
    assert cfg.window == WindowConfig(D2, D3) and cfg.ingest.log_date == D3
    assert load_config(LOCAL).window is None
    bad = [
        ({"window.start": "2026-11-03", "window.end": "2026-11-02"}, "window: start 2026-11-03 is after end 2026-11-02"),
        ({"window.start": "2026-11-03"}, "window.end: required key is missing"),
        ({"window.start": "2026-02-30", "window.end": "2026-03-01"}, "window.start: expected a date YYYY-MM-DD"),
        ({"ingest.log_date": "20261103"}, "ingest.log_date: expected a date YYYY-MM-DD"),
        ({"ingest.log_date": yaml.safe_load("2026-11-03 10:00:00")}, "ingest.log_date: expected a date YYYY-MM-DD"),
    ]
    for overrides, message in bad:
        with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
            load_config(LOCAL, overrides)
    assert isinstance(yaml.safe_load("2026-11-03 10:00:00"), datetime)


def test_log_date_predicate():
    assert tables.log_date_predicate([D2, None, D1]) == "(log_date IN (DATE'2026-11-01', DATE'2026-11-02') OR log_date IS NULL)"
    assert tables.log_date_predicate([None]) == "(log_date IS NULL)"
    for bad in ([], ["2026-11-01"], [datetime(2026, 11, 1)]):
        with pytest.raises(ValueError):
            tables.log_date_predicate(bad)
