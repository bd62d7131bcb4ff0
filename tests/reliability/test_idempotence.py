"""Issue 7.1: rerunning any stage with the same run_id leaves every table exactly as after one run.

A scheduler retry must never duplicate, lose or alter rows: after the baseline pipeline, each stage of
STAGES is run again with the same run_id, and every table (all columns, compared bitwise as a
multiset of rows) must equal what the single run left; only `runs`' timestamps and durations may differ,
and `runs` still holds one row per (run_id, job).
"""

import re
from collections import Counter
from pathlib import Path

import pytest

from clickeval_spark.stages import STAGES
from clickeval_spark.config import load_config
from tests.reliability import baseline as P

# minutes of Spark: `make test-fast` leaves it out (docs/development.md)
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def rerun_state(spark, tmp_path_factory):
    """A copy of the baseline warehouse and the tables (and report page) the single run left. Reruns use
    the baseline's config as it is (its `runs` rows record the config), only writing into the copy."""
    base = P.baseline(spark, tmp_path_factory)
    warehouse = base.copy_to(tmp_path_factory.mktemp("idempotence") / "wh")
    return base.cfg, warehouse, P.snapshot(spark, warehouse), _page(Path(base.cfg.report.path))


def _page(reports) -> str:
    """The report page without its 'generated <date time> UTC' stamp (the one per-attempt part)."""
    html = (reports / f"{P.BASE_RUN}.html").read_text(encoding="utf-8")
    return re.sub(r"generated \d{4}-\d\d-\d\d \d\d:\d\d UTC", "generated <time>", html)


@pytest.mark.parametrize("stage", STAGES)
def test_rerunning_a_stage_changes_no_table(spark, rerun_state, stage):
    cfg, warehouse, after_one_run, page = rerun_state
    assert set(after_one_run) >= {"serps", "relevance_labels", "quarantine", "model_params", "runs",
                                  "click_predictions", "relevance_scores", "metrics", "synthetic_serps",
                                  "distributional_metrics"}
    before_versions = P.versions(spark, warehouse)
    P.run_stage(spark, cfg, warehouse, P.BASE_RUN, stage)
    after_versions = P.versions(spark, warehouse)
    assert set(after_versions) == set(after_one_run)
    # a table whose Delta version did not move is the same table; every table the rerun wrote is compared
    moved = sorted(n for n, v in after_versions.items() if v > before_versions[n])
    assert "runs" in moved  # the stage did run and record itself again
    P.assert_same_tables(after_one_run, P.snapshot(spark, warehouse, moved), f"after rerunning {stage}")
    print(f"rerun of {stage} rewrote {moved}: rows identical")

    runs = spark.read.format("delta").load(f"{warehouse}/runs").where(f"run_id = '{P.BASE_RUN}'")
    per_job = Counter(r["job"] for r in runs.select("job").collect())
    assert per_job and set(per_job.values()) == {1}, per_job
    assert {r["status"] for r in runs.select("status").collect()} == {"succeeded"}
    if stage == "report":
        assert _page(Path(cfg.report.path)) == page


def test_rerunning_ingest_keeps_quarantine_exact(spark, tmp_path):
    """A text log with bad lines: a rerun leaves serps and quarantine (and the read = accepted +
    quarantined counts in runs) exactly as one run did, nothing doubled."""
    good = [f"s{i // 3}\tq{i % 4}\t{[f'd{i % 4}_{j}' for j in range(10)]}\t{[1] * 10}\t{[int(j == i % 10) for j in range(10)]}"
            for i in range(40)]
    bad = [
        "s90\tq1\t(d1, d2)\t[1, 1]\t[0, 1]",                           # not a JSON list: unparseable
        f"s91\tq1\t{[f'd1_{j}' for j in range(10)]}\t{[1] * 10}\t{[0] * 9}",      # length mismatch
        f"s92\tq2\t{[f'd2_{j}' for j in range(10)]}\t{[1] * 10}\t{[2] + [0] * 9}",  # click value 2
        "garbage without tabs",                                          # wrong number of fields
    ]
    log = tmp_path / "log.txt"
    log.write_text("\n".join(good[:20] + bad + good[20:]).replace("'", '"') + "\n", encoding="utf-8")
    warehouse = str(tmp_path / "wh")
    cfg = load_config(P.write_conf(tmp_path, warehouse, str(tmp_path / "reports")), {
        "ingest.dataset": "text", "ingest.format": "per_query_text", "ingest.text_variant": "graphcm",
        "ingest.paths": {"all": str(log)}})
    counts = P.run_stage(spark, cfg, warehouse, "text-1", "ingest")
    once = P.snapshot(spark, warehouse)
    assert counts["serps_read"] == 44 and counts["serps_quarantined"] == 4 and counts["serps_accepted"] == 40
    assert sum(once["quarantine"].values()) == 4 and sum(once["serps"].values()) == 40
    again = P.run_stage(spark, cfg, warehouse, "text-1", "ingest")
    assert again == counts
    P.assert_same_tables(once, P.snapshot(spark, warehouse), "after rerunning ingest of a text log")
