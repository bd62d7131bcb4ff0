"""Fitted models through the model_params table and back (fitted/params_io.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from chispa import assert_df_equality
from pyspark.sql import functions as F
from pyspark.sql import types as T

from clickeval_spark.models import get_model
from clickeval_spark.fitted.params_io import MODEL_PARAMS_SCHEMA, to_param_rows
from clickeval_spark.fitted import FittedModel
from clickeval_spark.fitted.model import load_fitted_models


# ---------------------------------------------------------------------------
# model_params round trip
# ---------------------------------------------------------------------------

@pytest.mark.slow
def test_param_rows_round_trip(spark, make_log, hand_fitted, warehouse):
    names = ["ubm", "ccm", "dbn", "gctr"]
    M = 5
    fits = {}
    for name in names:
        log = make_log(get_model(name), n_serps=40, M=M, seed=21, n_queries=3, pool=7)
        fits[name] = (log,) + hand_fitted(spark, get_model(name), log, seed=22)
    rows = None
    for name in names:
        for run in ("run-1", "run-2"):
            r = to_param_rows(fits[name][1], run)
            rows = r if rows is None else rows.unionByName(r)
    assert rows.schema.simpleString() == T.DataType.fromDDL(MODEL_PARAMS_SCHEMA).simpleString()
    # a stored table (Parquet: same types and nulls as the Delta table, a tenth of the test time)
    path = str(Path(warehouse) / "model_params")
    rows.write.mode("overwrite").parquet(path)
    stored = spark.read.parquet(path).cache()

    counts = {(r.model, r.param): r["count"] for r in
              stored.filter(F.col("run_id") == "run-1").groupBy("model", "param").count().collect()}
    for name in names:
        log, fitted, _, known = fits[name]
        model = get_model(name)
        for p in model.qd_params:
            assert counts[(name, p)] == len(known)
            assert counts[(name, "prior_" + p)] == 1 + M   # m, then an unseen pair's value at each rank
    assert counts[("ubm", "gamma")] == M * (M + 1)
    assert counts[("dbn", "gamma")] == 1 and counts[("gctr", "ctr")] == 1
    assert {k for k in counts if k[0] == "gctr"} == {("gctr", "ctr")}

    # UBM gamma (M, M+1): rank 1..M, prev_click_rank 0..M (0 = no click above)
    ubm_glob = fits["ubm"][1].glob
    g = {(r["rank"], r.prev_click_rank): r.value for r in stored.filter(
        (F.col("run_id") == "run-1") & (F.col("param") == "gamma") & (F.col("model") == "ubm")).collect()}
    assert g == {(i + 1, j): ubm_glob["gamma"][i, j] for i in range(M) for j in range(M + 1)}
    # CCM tau (3,) does not depend on M: scalars tau1..tau3, keys null
    taus = stored.filter((F.col("run_id") == "run-1") & F.col("param").startswith("tau")).collect()
    assert {r.param: r.value for r in taus} == {f"tau{i + 1}": fits["ccm"][1].glob["tau"][i] for i in range(3)}
    assert all(r["rank"] is None and r.query_id is None for r in taus)
    prior = stored.filter((F.col("run_id") == "run-1") & (F.col("param") == "prior_sigma")
                          & F.col("rank").isNull()).first()
    assert prior.value == fits["dbn"][1].prior["sigma"] and prior.query_id is None and prior["rank"] is None
    alpha = stored.filter((F.col("run_id") == "run-1") & (F.col("model") == "dbn")
                          & (F.col("param") == "alpha")).select("query_id", "doc_id", "value", "n_obs")
    assert_df_equality(alpha, fits["dbn"][1].qd.select("query_id", "doc_id", F.col("alpha").alias("value"), "n_obs"),
                       ignore_nullable=True, ignore_row_order=True)

    for name in names:
        log, fitted, _, _ = fits[name]
        back = FittedModel.from_rows(stored, get_model(name), "run-1", M)
        assert back.prior == fitted.prior and back.max_rank == M
        assert all(back.unseen_at_ranks(p) == fitted.unseen_at_ranks(p) for p in fitted.prior)
        assert sorted(back.glob) == sorted(fitted.glob)
        for k in fitted.glob:
            np.testing.assert_array_equal(back.glob[k], fitted.glob[k])
        assert_df_equality(back.qd, fitted.qd, ignore_nullable=True, ignore_row_order=True,
                           ignore_column_order=True)
    # the stages' loader: every model's global parameters in one Spark job, the same models
    spark.sparkContext.setJobGroup("load-fitted-models", "test")
    loaded = load_fitted_models(stored, names, "run-1", M)
    jobs = spark.sparkContext.statusTracker().getJobIdsForGroup("load-fitted-models")
    spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
    assert len(jobs) == 1
    for name in names:
        fitted = fits[name][1]
        assert loaded[name].prior == fitted.prior and loaded[name].model.name == name
        for k in fitted.glob:
            np.testing.assert_array_equal(loaded[name].glob[k], fitted.glob[k])
    log, fitted, _, _ = fits["ubm"]
    back = FittedModel.from_rows(stored, get_model("ubm"), "run-1", M)
    assert_df_equality(back.predict(log.df(spark)), fitted.predict(log.df(spark)),
                       ignore_nullable=True, ignore_row_order=True)
    with pytest.raises(ValueError, match="lack values"):
        FittedModel.from_rows(stored, get_model("ubm"), "run-1", M + 1)
    stored.unpersist()
