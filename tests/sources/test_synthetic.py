import hashlib

import pytest
import numpy as np
from pyspark.sql import functions as F

from clickeval_spark.config import IngestConfig, SyntheticConfig
from clickeval_spark.sources import synthetic


def _cfg(**kw):
    return IngestConfig(dataset="syn", format="synthetic",
                        synthetic=SyntheticConfig(n_serps=3000, n_queries=50, seed=11, **kw))


@pytest.mark.slow
def test_same_log_for_any_partitioning_and_the_truth_comes_with_it(spark):
    cfg = _cfg(model="pbm")
    spark.conf.set("spark.sql.shuffle.partitions", "1")
    a, labels, truth = synthetic.generate(spark, cfg)
    rows_a = a.select("serp_id", "query_id", "doc_ids", "clicks").orderBy("serp_id").collect()
    spark.conf.set("spark.sql.shuffle.partitions", "8")
    b, _, _ = synthetic.generate(spark, cfg)
    rows_b = b.select("serp_id", "query_id", "doc_ids", "clicks").orderBy("serp_id").collect()
    spark.conf.set("spark.sql.shuffle.partitions", "4")
    assert rows_a == rows_b and len(rows_a) == 3000

    assert {r["run_id"] for r in truth.select("run_id").distinct().collect()} == {"truth-syn"}
    gamma = [r["value"] for r in truth.where("param = 'gamma'").orderBy("rank").collect()]
    np.testing.assert_allclose(gamma, 0.98 * np.arange(1, 11) ** -0.7)
    assert truth.where("param = 'alpha'").count() == 50 * 15
    assert labels.count() == 50 * 15


def test_shape_is_tiangong_like_and_clicks_follow_the_truth(spark):
    serps, _, truth = synthetic.generate(spark, _cfg(model="pbm"))
    serps = serps.cache()
    assert serps.where(F.size("doc_ids") != 10).count() == 0
    # Zipf-like: the most frequent query carries far more SERPs than the median one
    freq = sorted((r["count"] for r in serps.groupBy("query_id").count().collect()), reverse=True)
    assert freq[0] > 8 * freq[len(freq) // 2]
    # PBM truth: CTR at rank r = gamma_r * E[alpha of the doc shown there]; clicks decay with rank
    ctr = [serps.select(F.avg(F.col("clicks")[r])).first()[0] for r in range(10)]
    assert ctr[0] > ctr[4] > ctr[9] > 0
    truth = truth.where("param = 'alpha'")
    shown = serps.select("query_id", F.posexplode("doc_ids").alias("pos", "doc_id"),
                         F.col("clicks").alias("c"))
    expected = (shown.join(truth.select("query_id", "doc_id", F.col("value").alias("alpha")),
                           on=["query_id", "doc_id"], how="inner")
                .where("pos = 0").select(F.avg("alpha")).first()[0])
    assert abs(ctr[0] - 0.98 * expected) < 0.03  # 3,000 Bernoulli draws: sd < 0.01


def test_ubm_and_dbn_logs_follow_their_truth(spark):
    """Rank 1 is always examined (UBM: gamma[1, no click above]; DBN: E_1 = 1), so CTR@1 = exam * E[alpha]."""
    for model, exam_at_1 in (("ubm", 0.98), ("dbn", 1.0)):
        serps, _, params = synthetic.generate(spark, _cfg(model=model))
        assert params.where("model = '%s'" % model).count() > 0
        first = serps.select("query_id", F.col("doc_ids")[0].alias("doc_id"), F.col("clicks")[0].alias("c"))
        joined = first.join(params.where("param = 'alpha'").select("query_id", "doc_id", F.col("value").alias("a")),
                            on=["query_id", "doc_id"], how="inner")
        ctr, mean_alpha, n = joined.agg(F.avg("c"), F.avg("a"), F.count("c")).first()
        assert n == 3000 and abs(ctr - exam_at_1 * mean_alpha) < 0.03, (model, ctr, mean_alpha)
    gamma = params.where("model = 'dbn' AND param = 'gamma'").first()["value"]
    assert gamma == 0.9


def test_sha256_doc_ids_are_the_short_log_with_each_id_digested(spark):
    """The same SERPs and clicks; every doc id of serps, truth and labels is SHA-256 of the short one."""
    short, short_labels, short_truth = synthetic.generate(spark, _cfg(model="pbm"))
    digested, long_labels, long_truth = synthetic.generate(spark, _cfg(model="pbm", doc_id_form="sha256"))

    def digest(doc):
        return hashlib.sha256(doc.encode()).hexdigest()

    cols = ("serp_id", "query_id", "doc_ids", "clicks")
    a = short.select(*cols).orderBy("serp_id").collect()
    b = digested.select(*cols).orderBy("serp_id").collect()
    assert len(a) == len(b) == 3000
    assert all(x["doc_ids"][0].startswith("d") for x in a)
    assert [(x["serp_id"], x["query_id"], [digest(d) for d in x["doc_ids"]], x["clicks"]) for x in a] == \
        [(y["serp_id"], y["query_id"], y["doc_ids"], y["clicks"]) for y in b]
    left = sorted(((r["param"], r["query_id"], r["doc_id"] and digest(r["doc_id"]), r["value"])
                   for r in short_truth.collect()), key=repr)
    right = sorted(((r["param"], r["query_id"], r["doc_id"], r["value"]) for r in long_truth.collect()), key=repr)
    assert left == right and sum(1 for r in right if r[0] == "alpha") == 50 * 15
    left = sorted((r["query_id"], [digest(d) for d in r["doc_ids"]], r["relevances"]) for r in short_labels.collect())
    right = sorted((r["query_id"], r["doc_ids"], r["relevances"]) for r in long_labels.collect())
    assert left == right and len(right) == 50 * 15


def test_serp_labels_never_broadcast_the_query_doc_grades(spark):
    """The grades are one row per (query, doc) of the log: they must not pass through the driver, though
    Spark sizes their spark.range source at a few bytes a query."""
    _, labels, _ = synthetic.generate(spark, _cfg(labels="serp"))
    labels.collect()   # runs this plan: adaptive execution has settled its joins
    plan = labels._jdf.queryExecution().executedPlan().toString()
    assert "isFinalPlan=true" in plan and "SortMergeJoin" in plan and "Broadcast" not in plan, plan
