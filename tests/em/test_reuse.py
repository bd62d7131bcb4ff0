"""fit.prior.reuse: a daily run fits the recent choice of `k: auto` alone (`em.selection.reused_candidate`). While its valid LL
holds, the fit is the one the whole selection gives when it chooses the same, bit for bit, for one candidate's
passes; when it does not hold, or the choice is not one of today's candidates, every candidate competes again.
The fit stage finds the choice in the `runs` table (`stages.fit._recent_choices`)."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from clickeval_spark.em import fit, pack_serps
from clickeval_spark.em.options import RecentChoice
from clickeval_spark.models import get_model
from clickeval_spark.report_html import priors_html
from tests.em.logs import split_log

M = 5
OPTIONS = dict(iterations=12, tol=None, max_rank=M, k_grid=(0.5, 4.0, 64.0), halving=())


@pytest.fixture(scope="module")
def small(spark, make_log):
    """DCM on 1,600 SERPs of 120 queries, a quarter held out: packed train + valid."""
    log = make_log(get_model("dcm"), n_serps=1600, M=M, seed=32, n_queries=120)
    train_df, valid_df = split_log(spark, log, np.arange(len(log.rows)) % 4 == 0)
    packed = pack_serps(train_df, max_rank=M, held_out=valid_df)
    yield packed
    packed.unpersist()


@pytest.fixture(scope="module")
def full(small):
    return fit(small, get_model("dcm"), **OPTIONS)


def _recent(full, **changes) -> RecentChoice:
    sel = full.selection
    return RecentChoice(**{"run_id": "day-1", "k": sel["chosen_k"], "seen_means": sel["chosen_seen_means"],
                           "valid_ll": full.valid_ll, "margin": 1e-3, **changes})


def test_a_choice_that_holds_is_fitted_alone_as_among_all(small, full, caplog):
    with caplog.at_level(logging.DEBUG, logger="clickeval_spark.em.driver"):
        reused = fit(small, get_model("dcm"), reuse=_recent(full, valid_ll=full.valid_ll + 4e-4), **OPTIONS)
    # one candidate's passes: the fit's log has one candidate's iterations (the full fit's four: 3 strengths, eb)
    fitted = {r.getMessage().split(" iteration ")[0] for r in caplog.records if " iteration " in r.getMessage()}
    assert len(fitted) == 1 and len(full.selection["grid"]) == 4
    assert [h[1] for h in reused.history] == [h[1] for h in full.history]
    assert reused.valid_ll == full.valid_ll
    sel = reused.selection
    assert [sel[key] for key in ("chosen_k", "chosen_seen_means")] == [
        full.selection[key] for key in ("chosen_k", "chosen_seen_means")]
    assert sel["reused"] == {"run_id": "day-1", "valid_ll_then": full.valid_ll + 4e-4, "margin": 1e-3,
                             "valid_ll_now": full.valid_ll, "held": True}
    assert [e["valid_ll"] for e in sel["grid"]] == [full.valid_ll]
    json.dumps(sel)   # it goes into runs.details as it is


def test_a_reused_choice_stops_and_goes_on_as_the_chosen_one_does(small):
    """With fit.tol and fit.converge (conf/cluster.yaml's), the reused candidate stops by tol and goes on to
    converge exactly as the chosen one of the whole selection does: the same passes, the same stop record."""
    opts = {**OPTIONS, "iterations": 40, "tol": 1e-4, "converge": 3e-6, "halving": ((6, 2e-3), (8, 1e-3))}
    whole = fit(small, get_model("dcm"), **opts)
    reused = fit(small, get_model("dcm"), reuse=_recent(whole), **opts)
    assert whole.prior_spec["stop"]["passes"] > whole.prior_spec["stop"]["tol_passes"]   # it went on
    assert reused.prior_spec["stop"] == whole.prior_spec["stop"]
    assert [h[1] for h in reused.history] == [h[1] for h in whole.history]
    assert reused.valid_ll == whole.valid_ll and reused.selection["reused"]["held"]
    # its grid entry says what the selection's says of the chosen one: its valid LL and passes when chosen
    sel = whole.selection
    [chosen] = [e for e in sel["grid"] if (e["k"], e["seen_means"]) == (sel["chosen_k"], sel["chosen_seen_means"])]
    assert reused.selection["grid"] == [chosen]


def test_a_choice_whose_valid_ll_moved_is_selected_again(spark, small, full):
    moved = _recent(full, k=0.5 if full.selection["chosen_k"] != 0.5 else 64.0, valid_ll=full.valid_ll - 0.05)
    before = set(spark.sparkContext._jsc.getPersistentRDDs().keySet())
    again = fit(small, get_model("dcm"), reuse=moved, **OPTIONS)
    # only the selection's qd table stays persisted: the refused fit's is freed
    assert len(set(spark.sparkContext._jsc.getPersistentRDDs().keySet()) - before) == 1
    # the whole selection ran: its grid and choice are the full fit's, and the refusal is recorded
    assert again.selection["grid"] == full.selection["grid"]
    assert [h[1] for h in again.history] == [h[1] for h in full.history]
    refused = again.selection["reuse_refused"]
    assert refused["held"] is False and refused["run_id"] == "day-1"
    assert abs(refused["valid_ll_now"] - refused["valid_ll_then"]) > refused["margin"]


def test_a_choice_outside_todays_grid_is_not_reused(small, full):
    stray = fit(small, get_model("dcm"), reuse=_recent(full, k=1000.0), **OPTIONS)
    assert stray.selection["grid"] == full.selection["grid"]
    assert "reused" not in stray.selection and "reuse_refused" not in stray.selection


def test_the_fit_stage_reuses_the_latest_choice_of_the_dataset(spark, tmp_path):
    """Three fit runs on one small synthetic dataset: the second and the third reuse the first's choice of every
    model that had one (the run that made the choice: the second only reused it), with its valid LL (the same:
    the same log), record it in runs.details, and write the same params."""
    from pyspark.sql import functions as F

    from clickeval_spark.config import PROJECT_ROOT, load_config
    from clickeval_spark.context import StageContext
    from clickeval_spark.stages import STAGES

    warehouse = str(tmp_path / "wh")
    cfg = load_config(PROJECT_ROOT / "conf" / "local.yaml", {
        "spark.warehouse": warehouse, "ingest.synthetic.n_serps": 1500, "ingest.synthetic.n_queries": 40,
        "fit.models": ["dctr", "pbm", "sdbn"], "fit.prior.reuse.days": 1})
    STAGES["ingest"](StageContext(spark, cfg, warehouse, "reuse-day-1"))
    for run_id in ("reuse-day-1", "reuse-day-2", "reuse-day-3"):
        STAGES["fit"](StageContext(spark, cfg, warehouse, run_id))
    ctx = StageContext(spark, cfg, warehouse, "reuse-day-3")
    rows = {r["run_id"] + "/" + r["job"]: json.loads(r["details"])
            for r in ctx.collected("runs", F.col("job").startswith("fit:"), ["run_id", "job", "details"])}
    for name in ("dctr", "pbm", "sdbn"):
        first = rows[f"reuse-day-1/fit:{name}"]
        assert "reused" not in first["prior_selection"]
        for day in ("reuse-day-2", "reuse-day-3"):
            later = rows[f"{day}/fit:{name}"]
            if first["prior"].get("estimator", "em") != "em":   # counting won: its candidates compete again
                assert "reused" not in later["prior_selection"]
                continue
            reused = later["prior_selection"]["reused"]
            assert reused == {"run_id": "reuse-day-1", "valid_ll_then": first["valid_ll"], "margin": 1e-3,
                              "valid_ll_now": first["valid_ll"], "held": True}
            chosen = [first["prior_selection"][key] for key in ("chosen_k", "chosen_seen_means")]
            assert [later["prior_selection"][key] for key in ("chosen_k", "chosen_seen_means")] == chosen
            assert len(later["prior_selection"]["grid"]) == 1 < len(first["prior_selection"]["grid"])
    params = ctx.read("model_params").where(F.col("model").isin("dctr", "pbm"))
    day_1, day_3 = (params.where(F.col("run_id") == r).drop("run_id") for r in ("reuse-day-1", "reuse-day-3"))
    assert day_1.count() > 0 and day_1.exceptAll(day_3).count() == 0 and day_3.exceptAll(day_1).count() == 0


def test_the_report_says_the_choice_was_reused():
    sel = {"chosen_k": "eb", "chosen_seen_means": "rank",
           "grid": [{"k": "eb", "seen_means": "rank", "valid_ll": -0.27111, "iterations": 41}],
           "reused": {"run_id": "daily-2026-12-06", "valid_ll_then": -0.27158, "valid_ll_now": -0.27111,
                      "margin": 1e-3, "held": True}}
    params = [{"model": "dbn", "param": "prior_kind:beta", "rank": None, "value": 1.0}]
    page = priors_html(params, [{"job": "fit:dbn", "details": json.dumps({"prior_selection": sel})}], ["dbn"])
    assert "eb/rank reused from run daily-2026-12-06 (valid LL -0.2711, then -0.2716)" in page


def _run_row(run_id, job="fit:pbm", *, dataset="d", status="succeeded", finished="2026-12-07 06:00:00",
             window_end=None, reused=False):
    from datetime import datetime

    details = {"window": None if window_end is None else {"start": window_end, "end": window_end},
               "prior_selection": {"chosen_k": 4.0, "chosen_seen_means": "rank",
                                   **({"reused": {"run_id": "x"}} if reused else {})}}
    at = datetime.fromisoformat(finished)
    return (run_id, job, dataset, status, at, at, 1.0, {}, json.dumps(details), "{}")


def test_the_recent_selection_is_the_latest_whole_one_of_the_dataset_by_data_day_or_by_clock(spark):
    from datetime import date, datetime

    from clickeval_spark.config import WindowConfig
    from clickeval_spark.stages.fit import recent_selections
    from clickeval_spark.tables.schemas import SCHEMAS

    runs = spark.createDataFrame([
        _run_row("day-01", finished="2026-12-01 06:00:00", window_end="2026-12-01"),
        _run_row("day-03", finished="2026-12-03 06:00:00", window_end="2026-12-03"),
        _run_row("day-04", finished="2026-12-04 06:00:00", window_end="2026-12-04", reused=True),   # reused: skipped
        _run_row("day-05", finished="2026-12-05 06:00:00", window_end="2026-12-05", status="failed"),
        _run_row("day-05b", finished="2026-12-05 07:00:00", window_end="2026-12-05", dataset="other"),
        _run_row("day-06", finished="2026-12-06 06:00:00", window_end="2026-12-06", job="fit:dbn"),
        _run_row("day-09", finished="2026-12-02 06:00:00", window_end="2026-12-09"),   # a later day, run earlier
        _run_row("adhoc", finished="2026-12-06 09:00:00"),                               # no window
        _run_row("today", finished="2026-12-07 05:00:00", window_end="2026-12-07"),     # this run's own row
    ], SCHEMAS["runs"])
    now = datetime(2026, 12, 7, 6, 0)

    def chosen(window_end: str | None, days: int = 7, jobs=("fit:pbm", "fit:dbn")) -> dict[str, str]:
        window = None if window_end is None else WindowConfig(start=date.fromisoformat(window_end),
                                                              end=date.fromisoformat(window_end))
        rows = recent_selections(runs, dataset="d", jobs=list(jobs), run_id="today", days=days, window=window,
                                 now=now).collect()
        return {r["job"]: r["run_id"] for r in rows}

    # a daily run of 2026-12-07: the latest whole selection on earlier days of data (day-09's data is later)
    assert chosen("2026-12-07") == {"fit:pbm": "day-03", "fit:dbn": "day-06"}
    assert chosen("2026-12-07", days=4) == {"fit:pbm": "day-03", "fit:dbn": "day-06"}
    assert chosen("2026-12-07", days=3) == {"fit:dbn": "day-06"}   # day-03 is 4 data days back
    # a backfill of 2026-12-02 reuses only what was chosen on its own or earlier days
    assert chosen("2026-12-02") == {"fit:pbm": "day-01"}
    # without a window, by the clock: the latest to finish in the last 7 days
    assert chosen(None) == {"fit:pbm": "adhoc", "fit:dbn": "day-06"}
    assert chosen(None, days=1) == {"fit:pbm": "adhoc", "fit:dbn": "day-06"}
    assert chosen(None, days=1, jobs=("fit:pbm",)) == {"fit:pbm": "adhoc"}
