"""The report page, `clickeval tables` and `clickeval sql` on a warehouse holding literal result rows."""

import base64
import re

import pytest

from clickeval_spark import tables
from clickeval_spark.config import AppConfig, FitConfig, IngestConfig, ReportConfig
from clickeval_spark.context import StageContext
from clickeval_spark.report_figures import coverage_plot, ndcg_figure
from clickeval_spark.stages import STAGES
from jobs import sql as sql_job
from jobs import tables as tables_job

RUN = "rep-1"


def _metric_rows():
    rows = []
    for i, model in enumerate(("rctr", "pbm", "dbn", "truth")):
        rows.append((RUN, model, "d", "test", "LL", None, -0.30 + 0.01 * i, 100, -0.32 + 0.01 * i, -0.28 + 0.01 * i, None))
        rows.append((RUN, model, "d", "test", "PPL", None, 1.30 - 0.01 * i, 100, 1.28 - 0.01 * i, 1.33 - 0.01 * i, None))
        for t in range(1, 11):
            v = 1.6 - 0.05 * t - 0.01 * i
            rows.append((RUN, model, "d", "test", "PPL", t, v, 100, v - 0.02, v + 0.02, None))
            rows.append((RUN, model, "d", "test", "PPL_cond", t, v - 0.01, 100, v - 0.03, v + 0.01, None))
        if model != "rctr":
            for k in (1, 3, 5, 10):
                v = 0.5 + 0.02 * k + 0.01 * i
                rows.append((RUN, model, "d", "test", "NDCG", k, v, 40, v - 0.05, v + 0.05, None))
            rows.append((RUN, model, "d", "test", "LL_diff", None, 0.01 * i, 100, 0.002, 0.02 * i, "rctr"))
    return rows


@pytest.fixture(scope="module")
def filled(spark, tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    warehouse = str(root / "wh")
    tables.replace_slice(spark.createDataFrame(_metric_rows(), tables.METRICS), warehouse, "metrics",
                         {"run_id": RUN}, RUN)
    dist = [(RUN, "d", g, "dcm", f"{o}/stochastic", o, "stochastic", 1.4 + 0.1 * j, 1.5 + 0.05 * j,
             [1.4] * 10, [1.5] * 10, 700, 100, 5)
            for j, g in enumerate(("pbm", "dbn")) for o in ("original", "shuffled_all", "shuffled_halves")]
    dist.append((RUN, "d", "real_log", "dcm", "original/observed", "original", "observed", 1.38, 1.38,
                 [1.38] * 10, [1.38] * 10, 100, 100, 5))
    # the out-of-sample reference: two halves and both pooled (stages/surrogate.py)
    for mode, rev, fwd, n_syn, n_real in (("fit_a_score_b", 1.43, 1.47, 48, 52), ("fit_b_score_a", 1.47, 1.43, 52, 48),
                                          ("cross_fitted", 1.45, 1.45, 100, 100)):
        dist.append((RUN, "d", "real_log", "dcm", f"original/{mode}", "original", mode, rev, fwd,
                     [rev] * 10, [fwd] * 10, n_syn, n_real, 5))
    tables.replace_slice(spark.createDataFrame(dist, tables.DISTRIBUTIONAL_METRICS), warehouse,
                         "distributional_metrics", {"run_id": RUN}, RUN)
    conf = root / "c.yaml"
    conf.write_text(f"spark: {{warehouse: {warehouse}, conf: {{}}}}\n")
    return root, warehouse, str(conf)


@pytest.mark.slow
def test_report_is_self_contained_with_every_figure(spark, filled):
    root, warehouse, _ = filled
    cfg = AppConfig(ingest=IngestConfig(dataset="d"), fit=FitConfig(models=("rctr", "pbm", "dbn")),
                    report=ReportConfig(path=str(root / "reports")))
    path = STAGES["report"](StageContext(spark, cfg, warehouse, RUN))
    page = open(path, encoding="utf-8").read()
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(images) == 3  # PPL@rank curves, NDCG@k bars, Reverse-vs-Forward chart
    assert all(base64.b64decode(img)[:8] == b"\x89PNG\r\n\x1a\n" for img in images)
    assert "http" not in page.replace("http-equiv", "")  # nothing fetched from elsewhere
    assert "-0.2800<br><small>[-0.3000, -0.2600]</small>" in page  # dbn's LL with its interval
    assert "Paired differences against rctr" in page and "Reverse PPL" in page
    # the simulated log's true model: a row of the table, last, with what it is
    assert page.index("<tr><th>dbn</th>") < page.index("<tr><th>truth</th>") and "truth-d" in page
    assert "original/cross_fitted" in page and "out of sample" in page


@pytest.mark.slow
def test_coverage_chart_draws_the_out_of_sample_reference(spark, filled):
    _, warehouse, _ = filled
    dist = [r.asDict() for r in tables.read_table(spark, warehouse, "distributional_metrics").collect()]
    fig, ax = coverage_plot(dist)
    labels = ax.get_legend_handles_labels()[1]
    assert "real log, out of sample (2 halves)" in labels and "real log, in sample" in labels
    assert "one real half as the generator" in labels
    solid = {(tuple(line.get_xdata()), tuple(line.get_ydata())) for line in ax.get_lines()
             if line.get_linestyle() == "-"}
    assert ((0, 1), (1.45, 1.45)) in solid and ((1.45, 1.45), (0, 1)) in solid   # horizontal and vertical at 1.45
    [halves] = [c for c in ax.collections if c.get_label() == "one real half as the generator"]
    assert sorted(map(tuple, halves.get_offsets().tolist())) == [(1.43, 1.47), (1.47, 1.43)]
    # an older run without the halves keeps its one dashed line
    fig, ax = coverage_plot([d for d in dist if d["click_mode"] not in ("fit_a_score_b", "fit_b_score_a",
                                                                        "cross_fitted")])
    assert "surrogate on the real log" in ax.get_legend_handles_labels()[1]


def test_sql_answers_over_the_result_tables(spark, filled, capsys):
    _, _, conf = filled
    rc = sql_job.main(["--conf", conf, "SELECT model, value FROM metrics WHERE metric = 'LL' ORDER BY model"])
    out = capsys.readouterr().out
    assert rc == 0
    assert re.search(r"\|dbn\s*\|-0\.2799", out) and re.search(r"\|rctr\s*\|-0\.3\s", out)


def test_sql_error_is_one_line(spark, filled, capsys):
    _, _, conf = filled
    rc = sql_job.main(["--conf", conf, "SELECT nope FROM metrics"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("clickeval sql: error: query failed:")


def test_tables_lists_counts_and_versions(spark, filled, capsys):
    _, _, conf = filled
    assert tables_job.main(["--conf", conf]) == 0
    out = capsys.readouterr().out
    metrics_line = next(line for line in out.splitlines() if line.startswith("metrics "))
    # version 0 is the table's creation (tables.create_table), 1 the one write of its rows
    assert metrics_line.split()[1:3] == [str(len(_metric_rows())), "1"]
    assert re.search(r"^serps\s+-\s+-\s+\(not written yet\)", out, re.M)


def test_click_predictions_are_one_row_per_serp_with_a_by_rank_view(spark, tmp_path, capsys):
    warehouse = str(tmp_path / "wh")
    rows = [(RUN, "pbm", "d", "test", "s1", [0, 1], [0.5, 0.25], [0.5, 0.2]),
            (RUN, "pbm", "d", "test", "s2", [1], [0.75], [0.75])]
    tables.replace_slice(spark.createDataFrame(rows, tables.CLICK_PREDICTIONS), warehouse, "click_predictions",
                         {"run_id": RUN, "model": "pbm"}, RUN)
    conf = tmp_path / "c.yaml"
    conf.write_text(f"spark: {{warehouse: {warehouse}, conf: {{}}}}\n")
    query = ("SELECT serp_id, rank, click, p_click_cond, p_click FROM click_predictions_by_rank "
             "ORDER BY serp_id, rank")
    assert sql_job.main(["--conf", str(conf), query]) == 0
    out = capsys.readouterr().out
    assert [[c.strip() for c in line.split("|")[1:-1]] for line in out.splitlines() if line.startswith(("|s1", "|s2"))] == [
        ["s1", "1", "0", "0.5", "0.5"], ["s1", "2", "1", "0.25", "0.2"], ["s2", "1", "1", "0.75", "0.75"]]


def test_ndcg_figure_draws_an_interval_that_misses_the_point_estimate():
    """A percentile bootstrap interval need not hold the point estimate (with 5 replicates on the
    standalone run, an NDCG point estimate fell outside its interval): the figure draws it as it is instead
    of failing in matplotlib on a negative error bar."""
    def cell(model, k, value, low, high):
        return {"model": model, "split": "test", "metric": "NDCG", "cutoff": k, "reference_model": None,
                "value": value, "ci_low": low, "ci_high": high}

    rows = [cell("pbm", 1, 0.60, 0.62, 0.70), cell("pbm", 3, 0.50, 0.40, 0.45),
            cell("dbn", 1, 0.55, 0.50, 0.60), cell("dbn", 3, 0.52, 0.48, 0.56)]
    [img] = re.findall(r'src="data:image/png;base64,([^"]+)"', ndcg_figure(rows, ["pbm", "dbn"], "test", [1, 3]))
    assert base64.b64decode(img)[:8] == b"\x89PNG\r\n\x1a\n"
