"""The dataset trend page (issue 39): runs placed at their window end, shifts between consecutive runs,
days without a run; pure functions on literal rows, then the report stage over three real daily runs."""

from __future__ import annotations

import base64
import json
import re
from datetime import date, datetime

import pytest
from pyspark.sql import functions as F

from clickeval_spark import tables
from clickeval_spark.config import (AppConfig, EvaluateConfig, FitConfig, IngestConfig, PredictConfig, PriorConfig,
                                    ReportConfig, WindowConfig)
from clickeval_spark.context import StageContext
from clickeval_spark.stages import STAGES
from clickeval_spark.trend import (Point, build_trend, days_without_run, intervals_disjoint, trend_page,
                                   trend_series)

D = {day: date(2026, 11, day) for day in range(1, 10)}


def _metric(run_id: str, value: float, lo: float | None, hi: float | None, *, model: str = "pbm", metric: str = "LL",
            cutoff: int | None = None, split: str = "test", reference_model: str | None = None) -> dict:
    return {"run_id": run_id, "model": model, "split": split, "metric": metric, "cutoff": cutoff, "value": value,
            "ci_low": lo, "ci_high": hi, "reference_model": reference_model}


def _run(run_id: str, end: date | None, finished_minute: int = 0, status: str = "succeeded") -> dict:
    window = None if end is None else {"start": end.isoformat(), "end": end.isoformat()}
    return {"run_id": run_id, "status": status, "finished_at": datetime(2026, 12, 1, 6, finished_minute),
            "details": json.dumps({"window": window, "external": {}})}


def _ll(trend, model: str = "pbm", label: str = "LL") -> list[tuple]:
    return [(p.window_end, p.run_id, p.shifted) for p in trend.series[(model, label)]]


def test_a_day_is_marked_only_when_its_interval_misses_the_previous_one():
    intervals = {1: (0.0, 1.0), 2: (1.0, 2.0), 3: (2.5, 3.0), 4: (2.0, 2.6), 5: (0.0, 1.9), 6: (1.9, 1.95)}
    metrics = [_metric(f"r{d}", (lo + hi) / 2, lo, hi) for d, (lo, hi) in intervals.items()]
    runs = [_run(f"r{d}", D[d]) for d in intervals]
    trend = trend_series(metrics, runs)
    # 2 touches 1 (overlap), 3 lies above 2, 4 overlaps 3, 5 lies below 4, 6 touches 5 from above
    assert [shifted for _, _, shifted in _ll(trend)] == [False, False, True, False, True, False]
    # an interval that is not known is never a shift, nor a reason for the next one
    p = Point(D[1], "a", 1.0, None, None)
    q = Point(D[2], "b", 5.0, 4.9, 5.1)
    assert not intervals_disjoint(p, q) and not intervals_disjoint(q, p)


def test_days_without_a_run_lie_between_the_first_and_last_window_end():
    assert days_without_run([D[2], D[6], D[3]]) == [D[4], D[5]]
    assert days_without_run([D[2]]) == [] and days_without_run([]) == []
    runs = [_run("a", D[1]), _run("b", D[4]), _run("whole", None)]
    trend = trend_series([_metric("a", 0, 0, 0), _metric("b", 0, 0, 0), _metric("whole", 0, 0, 0)], runs)
    assert trend.missing_days == [D[2], D[3]]


def test_runs_are_ordered_by_window_end_not_run_id_or_finish_time():
    # a backfill: the run named for the 9th evaluated the 1st, and finished last
    runs = [_run("daily-20261109", D[1], finished_minute=50), _run("daily-20261102", D[3], finished_minute=10),
            _run("daily-20261105", D[2], finished_minute=20)]
    metrics = [_metric("daily-20261109", -0.5, -0.52, -0.48), _metric("daily-20261102", -0.3, -0.32, -0.28),
               _metric("daily-20261105", -0.5, -0.51, -0.49)]
    trend = trend_series(metrics, runs)
    assert [(r.window_end, r.run_id) for r in trend.runs] == [
        (D[1], "daily-20261109"), (D[2], "daily-20261105"), (D[3], "daily-20261102")]
    # the shift is against the previous window end (the 2nd), not against the run finished just before
    assert _ll(trend) == [(D[1], "daily-20261109", False), (D[2], "daily-20261105", False),
                          (D[3], "daily-20261102", True)]
    page = trend_page(trend, "days")
    assert page.index("daily-20261109") < page.index("daily-20261105") < page.index("daily-20261102")


def test_a_shared_window_end_keeps_the_run_whose_evaluate_finished_last():
    runs = [_run("first", D[1]), _run("early", D[2], finished_minute=30), _run("retry", D[2], finished_minute=40),
            _run("z-earliest", D[2], finished_minute=5)]
    metrics = [_metric("first", -0.5, -0.51, -0.49), _metric("early", -0.1, -0.11, -0.09),
               _metric("retry", -0.5, -0.51, -0.49), _metric("z-earliest", -0.9, -0.91, -0.89)]
    trend = trend_series(metrics, runs)
    assert [r.run_id for r in trend.runs] == ["first", "retry"]
    assert _ll(trend) == [(D[1], "first", False), (D[2], "retry", False)]
    assert trend.superseded == [(D[2], "early", "retry"), (D[2], "z-earliest", "retry")]
    page = trend_page(trend, "days")
    assert "early and retry both end on 2026-11-02: retry (its evaluate finished later) is plotted" in page


def test_only_succeeded_dated_evaluations_with_metrics_are_plotted():
    runs = [_run("a", D[1]), _run("b", D[2]), _run("whole", None), _run("failed", D[3], status="failed"),
            _run("no-metrics", D[4])]
    metrics = [_metric(r, -0.5, -0.51, -0.49) for r in ("a", "b", "whole", "failed", "orphan")]
    metrics.append(_metric("b", 0.01, 0.0, 0.02, metric="LL_diff", reference_model="rctr"))
    trend = trend_series(metrics, runs)
    assert [r.run_id for r in trend.runs] == ["a", "b"]
    assert trend.undated == ["whole"] and trend.unrecorded == ["failed", "orphan"]
    assert trend.missing_days == []  # the 3rd and 4th are no runs of the dataset: the range ends on the 2nd
    assert [p.value for p in trend.series[("pbm", "LL")]] == [-0.5, -0.5]  # the paired difference is no point
    page = trend_page(trend, "days")
    assert "Runs that evaluated the whole dataset (no window), listed but not plotted" in page
    assert "whole" in page and "<li>2026-11-01: a</li><li>2026-11-02: b</li>" in page


def test_without_ndcg_a_model_gets_two_panels_and_ndcg_at_10_only_otherwise():
    runs = [_run("a", D[1]), _run("b", D[2])]
    metrics = []
    for r, shift in (("a", 0.0), ("b", 0.5)):
        metrics += [_metric(r, -0.5 + shift, -0.51 + shift, -0.49 + shift, model="gctr"),
                    _metric(r, 1.5 - shift, 1.49 - shift, 1.51 - shift, model="gctr", metric="PPL"),
                    _metric(r, 1.6, 1.5, 1.7, model="gctr", metric="PPL", cutoff=3),
                    _metric(r, -0.4, -0.41, -0.39), _metric(r, 1.4, 1.39, 1.41, metric="PPL"),
                    _metric(r, 0.6, 0.5, 0.7, metric="NDCG", cutoff=10),
                    _metric(r, 0.9 - shift, 0.89 - shift, 0.91 - shift, metric="NDCG", cutoff=1)]
    trend = trend_series(metrics, runs)
    assert sorted(trend.series) == [("gctr", "LL"), ("gctr", "PPL"), ("pbm", "LL"), ("pbm", "NDCG@10"),
                                    ("pbm", "PPL")]
    assert _ll(trend, "gctr", "PPL")[1][2] and not _ll(trend, "pbm", "NDCG@10")[1][2]
    page = trend_page(trend, "days", ["pbm", "gctr"])
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(images) == 2 and all(base64.b64decode(i)[:8] == b"\x89PNG\r\n\x1a\n" for i in images)
    assert page.index("<h2>pbm</h2>") < page.index("<h2>gctr</h2>")
    gctr = page[page.index("<h2>gctr</h2>"):]
    assert "NDCG" not in gctr and "<tr><td>PPL</td><td>2026-11-02</td><td>b</td><td>1.0000</td>" in gctr
    assert "2026-11-02: <b>gctr LL</b> 0.0000 [-0.0100, 0.0100] (b), previous run 2026-11-01" in page


def test_split_is_test_when_present_else_the_one_evaluated_or_the_one_asked_for():
    runs = [_run("a", D[1]), _run("b", D[2])]
    both = [_metric(r, v, v, v, split=s) for r in ("a", "b") for s, v in (("valid", 1.0), ("test", 2.0))]
    assert trend_series(both, runs).split == "test"
    assert {p.value for p in trend_series(both, runs).series[("pbm", "LL")]} == {2.0}
    assert {p.value for p in trend_series(both, runs, "valid").series[("pbm", "LL")]} == {1.0}
    train = [_metric(r, 3.0, 3.0, 3.0, split="train") for r in ("a", "b")]
    assert trend_series(train, runs).split == "train"


def test_fewer_than_two_dated_runs_say_so():
    page = trend_page(trend_series([_metric("a", -0.5, -0.51, -0.49)], [_run("a", D[1])]), "days")
    assert "Fewer than two dated runs of dataset days (1 found)" in page and "<img" not in page
    assert "<tr><td>LL</td><td>2026-11-01</td><td>a</td><td>-0.5000</td><td>[-0.5100, -0.4900]</td>" in page
    empty = trend_page(trend_series([], []), "days")
    assert "Fewer than two dated runs of dataset days (0 found)" in empty


def test_a_warehouse_without_metrics_or_runs_gets_a_page_saying_so(spark, warehouse):
    page = build_trend(StageContext(spark, AppConfig(), warehouse, "-"), "days")
    assert "Fewer than two dated runs of dataset days (0 found)" in page


# ---- end to end: ingest three days, one run per day, the report stage writes the trend page ----

DOCS = ["a", "b", "c", "d", "e"]
RUN_DAYS = (1, 4, 2)   # run in this order: finish times do not follow window ends; no run ends on the 3rd


def _line(sid: str, qid: str, clicks: list[int]) -> str:
    return f"{sid}\t{qid}\t{json.dumps(DOCS)}\t{json.dumps([0] * len(DOCS))}\t{json.dumps(clicks)}\n"


def _clicks(day: int, i: int) -> list[int]:
    """Days 1-2: rank 1 clicked on 2 SERPs in 5, a click lower down on some; day 4: rank 1 always, rank 2
    rarely."""
    if day == 4:
        return [1, int(i % 9 == 4), 0, 0, 0]
    return [int(i % 5 < 2), int(i % 5 == 2), 0, int(i % 7 == 3), 0]


def _days_cfg(**sections) -> AppConfig:
    return AppConfig(ingest=IngestConfig(dataset="days", format="per_query_text", paths={"train": "unused"}),
                     **sections)


@pytest.mark.slow
def test_report_stage_writes_the_trend_of_three_daily_runs(spark, warehouse, tmp_path, capsys):
    for day in RUN_DAYS:
        lines = {split: [_line(f"{split[:2]}{day}x{i}", f"q{i % 4}", _clicks(day, i)) for i in range(n)]
                 for split, n in (("train", 60), ("test", 80))}
        paths = {}
        for split, rows in lines.items():
            paths[split] = str(tmp_path / f"{split}{day}.txt")
            (tmp_path / f"{split}{day}.txt").write_text("".join(rows))
        ingest_cfg = AppConfig(ingest=IngestConfig(dataset="days", format="per_query_text", paths=paths,
                                                   log_date=D[day]))
        STAGES["ingest"](StageContext(spark, ingest_cfg, warehouse, f"ingest-{day}"))
    for day in RUN_DAYS:
        cfg = _days_cfg(window=WindowConfig(D[day], D[day]),
                        fit=FitConfig(models=("gctr", "pbm"), iterations=2, prior=PriorConfig(kind="pyclick")),
                        predict=PredictConfig(splits=("test",)),
                        evaluate=EvaluateConfig(replicates=20, reference_model=None))
        for stage in ("fit", "predict", "evaluate"):
            STAGES[stage](StageContext(spark, cfg, warehouse, f"daily-202611{day:02d}"))

    reports = tmp_path / "reports"
    cfg = _days_cfg(fit=FitConfig(models=("gctr", "pbm")), report=ReportConfig(path=str(reports), trend=True))
    capsys.readouterr()
    STAGES["report"](StageContext(spark, cfg, warehouse, "daily-20261102"))
    out = capsys.readouterr().out
    trend_path = str(reports / "days-trend.html")
    assert f"report: {reports / 'daily-20261102.html'}\ntrend: {trend_path}\n" in out
    assert (reports / "daily-20261102.html").exists()
    details = json.loads(tables.read_table(spark, warehouse, "runs").where(
        (F.col("run_id") == "daily-20261102") & (F.col("job") == "report")).first()["details"])
    assert details["trend_path"] == trend_path

    page = (reports / "days-trend.html").read_text(encoding="utf-8")
    images = re.findall(r'<img alt="" src="data:image/png;base64,([^"]+)"', page)
    assert len(images) == 2 and all(base64.b64decode(i)[:8] == b"\x89PNG\r\n\x1a\n" for i in images)
    ids = ["daily-20261101", "daily-20261102", "daily-20261104"]
    assert page.index(ids[0]) < page.index(ids[1]) < page.index(ids[2])
    assert "<h2>Days without a run</h2><ul><li>2026-11-03</li></ul>" in page

    # every number the page lists is the metrics table's, and only the day the clicks moved is marked
    metrics = tables.read_table(spark, warehouse, "metrics").where(
        F.col("run_id").isin(*ids) & F.col("metric").isin("LL", "PPL") & F.col("cutoff").isNull()).collect()
    assert len(metrics) == 2 * 2 * 3
    for model in ("gctr", "pbm"):
        section = page[page.index(f"<h2>{model}</h2>"):]
        section = section[:section.find("<h2>", 4)] if "<h2>" in section[4:] else section
        listed = {(m, end, run): (value, interval, marked) for m, end, run, value, interval, marked in re.findall(
            r"<tr><td>(\w+)</td><td>([\d-]+)</td><td>([\w-]+)</td><td>(.*?)</td><td>(.*?)</td><td>(.*?)</td></tr>",
            section)}
        for r in (r for r in metrics if r["model"] == model):
            end = f"2026-11-{r['run_id'][-2:]}"
            value, interval, marked = listed[(r["metric"], end, r["run_id"])]
            assert (value, interval) == (f"{r['value']:.4f}", f"[{r['ci_low']:.4f}, {r['ci_high']:.4f}]")
            assert (marked != "–") == (end == "2026-11-04"), (model, r["metric"], end, marked)
        ll = {r["run_id"]: r for r in metrics if r["model"] == model and r["metric"] == "LL"}
        if model == "pbm":   # day 4's clicks are far easier to predict for a model with a rank effect
            assert ll[ids[2]]["ci_low"] > ll[ids[1]]["ci_high"]
        else:                # gctr's one click rate for every rank fits rank-1-only clicks worse
            assert ll[ids[2]]["ci_high"] < ll[ids[1]]["ci_low"]
        assert f"2026-11-04: <b>{model} LL</b>" in page
