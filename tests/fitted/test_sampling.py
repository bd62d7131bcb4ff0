"""Click sequences sampled from fitted models (fitted/sampling.py): the same rows on any
partitioning, the kernels' story given the hashed uniforms, click rates, determinism."""

from __future__ import annotations

import math

import numpy as np
import pytest
from chispa import assert_df_equality
from pyspark.sql import functions as F

from clickeval_spark.models import get_model
from clickeval_spark.models.base import sample_clicks
from clickeval_spark.hashing import seeded_uniform
from clickeval_spark.fitted.sampling import sample_models, sample_serps

from tests.models.numpy_em import gather
from tests.em.logs import sorted_rows


@pytest.mark.slow
def test_sampling_same_rows_on_any_partitioning(spark, make_log, hand_fitted):
    model = get_model("dbn")
    log = make_log(model, n_serps=150, M=6, seed=8, n_queries=5, pool=9)
    fitted, _, _ = hand_fitted(spark, model, log, seed=4)
    df = log.df(spark)
    one = sample_serps(df.repartition(1), fitted, k=4, seed=123)
    eight = sample_serps(df.repartition(8), fitted, k=4, seed=123)
    assert one.columns == df.columns + ["sample_idx"]
    assert_df_equality(sorted_rows(one), sorted_rows(eight), ignore_nullable=True)
    rows = sorted_rows(one).collect()
    assert len(rows) == 4 * len(log.rows)
    assert {r.sample_idx for r in rows} == {0, 1, 2, 3}
    # lists cut to max_rank (all three list columns), clicks really re-drawn, seed matters
    assert max(len(r.doc_ids) for r in rows) == 6
    assert all(len(r.doc_ids) == len(r.clicks) and (r.vtypes is None or len(r.vtypes) == len(r.clicks))
               for r in rows)
    # the other columns pass through untouched
    originals = {row[3]: row for row in log.rows}
    for r in rows:
        o = originals[r.serp_id]
        assert (r.dataset, r.split, r.session_id, r.serp_pos, r.query_id, r.log_date) == (
            o[0], o[1], o[2], o[4], o[5], o[9])
        assert r.doc_ids == o[6][:6] and r.vtypes == (None if o[7] is None else o[7][:6])
    observed = {row[3]: row[8][:6] for row in log.rows}
    assert sum(r.clicks != observed[r.serp_id] for r in rows) > len(rows) // 4
    other = sorted_rows(sample_serps(df, fitted, k=4, seed=124)).collect()
    assert [r.clicks for r in rows] != [r.clicks for r in other]
    assert [r.serp_id for r in rows] == [r.serp_id for r in other]


def test_sampling_follows_kernel_given_the_hashed_uniforms(spark, make_log, hand_fitted):
    """Two models sampled together (one attach, one pass): each model's clicks are its own kernel's on the
    shared uniforms, unseen pairs (which differ between the models) at each model's prior."""
    log = make_log(get_model("ubm"), n_serps=80, M=5, seed=9, n_queries=4, pool=8)
    parts = {name: hand_fitted(spark, get_model(name), log, seed=seed) for name, seed in (("ubm", 6), ("pbm", 7))}
    k, seed = 3, 99
    got = sample_models(log.df(spark), {name: f for name, (f, _, _) in parts.items()}, k=k, seed=seed)
    got = {(r.model, r.serp_id, r.sample_idx): r.clicks for r in got.select("model", "serp_id", "sample_idx",
                                                                             "clicks").collect()}
    assert len(got) == 2 * k * len(log.rows)
    # the uniforms, recomputed independently of the sampler's plumbing
    u_df = (spark.createDataFrame([(row[3],) for row in log.rows], "serp_id string")
            .crossJoin(spark.range(k).select(F.col("id").cast("int").alias("sample_idx")))
            .crossJoin(spark.range(1, log.M + 1).select(F.col("id").cast("int").alias("rank")))
            .select("serp_id", "sample_idx", "rank",
                    seeded_uniform(seed, F.col("serp_id"), F.col("sample_idx"), F.col("rank")).alias("u")))
    u = np.ones((len(log.rows), k, log.M))
    pos = {row[3]: b for b, row in enumerate(log.rows)}
    for r in u_df.collect():
        u[pos[r.serp_id], r.sample_idx, r.rank - 1] = r.u
    assert ((u >= 0) & (u < 1)).all() and 0.3 < u.mean() < 0.7
    for name, (fitted, full, _) in parts.items():
        qd = gather(full, log.qd_index, log.mask)
        for s in range(k):
            expected = sample_clicks(fitted.model, qd, fitted.glob, log.mask, u[:, s, :])
            for b, row in enumerate(log.rows):
                n = min(len(row[6]), log.M)
                assert got[(name, row[3], s)] == [int(c) for c in expected[b, :n]], (name, row[3], s)


@pytest.mark.parametrize("name", ["dbn", "cm"])
def test_sampled_click_rates_match_click_probs(spark, make_log, hand_fitted, name):
    model = get_model(name)
    log = make_log(model, n_serps=40, M=6, seed=12, n_queries=4, pool=8)
    fitted, full, _ = hand_fitted(spark, model, log, seed=13)
    k = 600
    samples = sample_serps(log.df(spark), fitted, k=k, seed=5)
    rates = (samples.select("serp_id", F.posexplode("clicks").alias("pos", "c"))
             .groupBy("serp_id", "pos").agg(F.avg("c").alias("rate"), F.count("c").alias("n"))
             .collect())
    p = model.click_probs(gather(full, log.qd_index, log.mask), fitted.glob, log.mask)
    pos = {row[3]: b for b, row in enumerate(log.rows)}
    z = []
    for r in rates:
        assert r.n == k
        pr = p[pos[r.serp_id], r.pos]
        se = math.sqrt(max(pr * (1 - pr), 1e-4) / k)
        z.append((r.rate - pr) / se)
    assert len(z) == int(log.mask.sum())
    assert max(abs(x) for x in z) < 5.0
    if name == "cm":  # the cascade stops at the first click: a chain-rule property, not a marginal
        assert samples.filter(F.aggregate("clicks", F.lit(0), lambda a, c: a + c) > 1).count() == 0


def test_sampling_deterministic(spark, make_log, hand_fitted):
    model = get_model("pbm")
    log = make_log(model, n_serps=50, M=5, seed=2, n_queries=3, pool=8)
    fitted, full, _ = hand_fitted(spark, model, log, seed=3)
    got = sample_serps(log.df(spark), fitted, k=2, seed=1, deterministic=True).collect()
    expected = sample_clicks(model, gather(full, log.qd_index, log.mask), fitted.glob, log.mask,
                             np.zeros(log.mask.shape), deterministic=True)
    pos = {row[3]: b for b, row in enumerate(log.rows)}
    assert len(got) == 2 * len(log.rows)
    for r in got:
        b = pos[r.serp_id]
        assert r.clicks == [int(c) for c in expected[b, :len(r.clicks)]]
    assert expected.sum() > 0 and (expected[log.mask] == 0).sum() > 0
