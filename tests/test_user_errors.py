"""Issue 15: errors a user can cause through a stage (a stage run before the one that writes its input, a
run id never fitted, an unknown model name) come out as one ClickevalError line and exit 2, not a traceback."""

from __future__ import annotations

import json

import pytest

from clickeval_spark import tables
from clickeval_spark.errors import ClickevalError
from clickeval_spark.fitted.model import load_fitted
from jobs import generate as generate_job
from jobs import ingest as ingest_job
from jobs import predict as predict_job


def _one_line(capsys) -> list[str]:
    return capsys.readouterr().err.strip().splitlines()


@pytest.mark.slow
def test_stages_before_their_inputs_exist(spark, tmp_path, warehouse, capsys):
    conf = tmp_path / "c.yaml"
    log = tmp_path / "test.txt"
    log.write_text("s1\tq1\t[1, 2]\t[0, 0]\t[0, 1]\ns2\tq1\t[2, 1]\t[0, 0]\t[1, 0]\n")
    conf.write_text(json.dumps({"spark": {"warehouse": warehouse, "conf": {}}, "fit": {"models": ["pbm"]},
                                "ingest": {"dataset": "early", "format": "per_query_text", "paths": {"test": str(log)}},
                                "generate": {"samples": 1}}))
    argv = ["--conf", str(conf), "--run-id", "never-fitted"]

    assert predict_job.main(argv) == 2  # nothing ingested yet
    assert _one_line(capsys) == [f"clickeval predict: error: table serps does not exist yet under {warehouse}: "
                                 "run `clickeval ingest` first"]

    assert ingest_job.main(argv) == 0
    capsys.readouterr()
    assert predict_job.main(argv) == 2  # ingested, nothing fitted
    assert _one_line(capsys) == [f"clickeval predict: error: table model_params does not exist yet under {warehouse}: "
                                 "run `clickeval fit` first"]

    # model_params exist, but for another run, and that run's PBM lacks its per-rank gamma
    partial = [{"run_id": "fitted", "model": "pbm", "param": "prior_alpha", "value": 0.5}]
    tables.replace_slice(spark.createDataFrame(partial, tables.MODEL_PARAMS), warehouse, "model_params",
                         {"run_id": "fitted"}, "fitted")
    for job, name in ((predict_job, "predict"), (generate_job, "generate")):
        assert job.main(argv) == 2
        assert _one_line(capsys) == [f"clickeval {name}: error: run never-fitted: no model_params for model pbm; "
                                     "run `clickeval fit --run-id never-fitted` first"]
    assert predict_job.main(["--conf", str(conf), "--run-id", "fitted"]) == 2
    [line] = _one_line(capsys)
    # the rest of the line is params_io's own account of what is missing
    assert line.startswith("clickeval predict: error: run fitted: ") and "gamma" in line
    assert line.endswith("; rerun `clickeval fit --run-id fitted`")


@pytest.mark.parametrize("setting,message", [
    ("fit.iterations=0", "fit.iterations: must be >= 1, got 0"),
    ("fit.engine=fast", "fit.engine: 'fast' is not allowed; allowed: ['auto', 'stages', 'resident']"),
    ("fit.iteratons=3", "fit.iteratons: unknown key; allowed keys: ['checkpoint_interval', 'converge', 'engine', "
                        "'iterations', 'max_rank', 'model_priors', 'models', 'prior', 'tol']"),
    ("report.path=[a]", "report.path: expected a string, got ['a']"),
    ("ingest.log_date='2026-02-30'", "ingest.log_date: expected a date YYYY-MM-DD, got '2026-02-30'"),
])
def test_a_bad_config_value_is_one_line_and_exit_2(tmp_path, capsys, setting, message):
    """The key path, the value given and what is allowed, before any Spark session."""
    conf = tmp_path / "c.yaml"
    conf.write_text("{}")
    assert predict_job.main(["--conf", str(conf), "--set", setting]) == 2
    assert _one_line(capsys) == [f"clickeval predict: error: {message}"]


def test_unknown_model_name_is_a_clickeval_error(spark):
    params = spark.createDataFrame([], tables.MODEL_PARAMS)
    with pytest.raises(ClickevalError, match=r"^model_params: unknown click model 'ncm'; expected one of: gctr, "):
        load_fitted(params, "ncm", "r1", 10)


def test_a_table_in_an_older_layout_is_named_not_overwritten(spark, tmp_path):
    """click_predictions written before it held one row per SERP: the next write says what to do, and the
    old rows stay as they were."""
    warehouse = str(tmp_path / "wh")
    path = tables.table_path(warehouse, "click_predictions")
    old = spark.createDataFrame([("r0", "pbm", "d", "test", "s1", 1, 0, 0.5, 0.5)],
                                "run_id string, model string, dataset string, split string, serp_id string, "
                                "rank int, click int, p_click_cond double, p_click double")
    old.write.format("delta").partitionBy("run_id").save(path)
    new = spark.createDataFrame([("r1", "pbm", "d", "test", "s1", [0], [0.5], [0.5])], tables.CLICK_PREDICTIONS)
    with pytest.raises(ClickevalError) as err:
        tables.replace_slice(new, warehouse, "click_predictions", {"run_id": "r1", "model": "pbm"}, "r1")
    assert str(err.value) == (
        f"{path}: table click_predictions was written by an older version with another layout: "
        "p_click_cond double (now array<double>), p_click double (now array<double>); move it aside "
        "(or delete it: the stage that writes it recreates it) and rerun")
    assert [tuple(r) for r in spark.read.format("delta").load(path).collect()] == [tuple(r) for r in old.collect()]
