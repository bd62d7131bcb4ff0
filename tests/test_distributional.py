"""Generate + surrogate on a log simulated from a known UBM: Reverse PPL separates good and degenerate generators."""

import math

import pytest
from pyspark.sql import functions as F

from clickeval_spark import tables
from clickeval_spark.config import (AppConfig, ExternalSequencesConfig, FitConfig, GenerateConfig, IngestConfig,
                                    SplitConfig, SurrogateConfig, SyntheticConfig)
from clickeval_spark.generation import generate, reorder
from clickeval_spark.models import get_model
from clickeval_spark.fitted import FittedModel
from clickeval_spark.context import StageContext
from clickeval_spark.metrics.distributional import perplexity
from clickeval_spark.models.priors import model_prior
from clickeval_spark.em.driver import fit
from clickeval_spark.stages import STAGES, surrogate

RUN = "sim-run"


def _config(**generate):
    return AppConfig(
        ingest=IngestConfig(dataset="sim-ubm", format="synthetic",
                            split=SplitConfig(ratios={"train": 1.0, "test": 1.0}),
                            synthetic=SyntheticConfig(model="ubm", n_serps=4000, n_queries=30, docs_per_query=12,
                                                      seed=3)),
        fit=FitConfig(models=("ubm",)),
        generate=GenerateConfig(samples=7, **generate),
        surrogate=SurrogateConfig(model="dcm", iterations=5),
    )


@pytest.fixture(scope="module")
def simulated(spark, tmp_path_factory):
    """A UBM log with its true parameters stored as this run's fitted 'ubm' (the generator is the truth)."""
    warehouse = str(tmp_path_factory.mktemp("wh_dist"))
    cfg = _config()
    STAGES["ingest"](StageContext(spark, cfg, warehouse, "sim-ingest"))
    truth = tables.read_table(spark, warehouse, "model_params").where("run_id = 'truth-sim-ubm'")
    tables.replace_slice(truth.withColumn("run_id", F.lit(RUN)).withColumn("model", F.lit("ubm")), warehouse,
                         "model_params", {"run_id": RUN, "model": "ubm"}, RUN)
    test = tables.read_table(spark, warehouse, "serps").where("split = 'test'")
    # degenerate generators, supplied as external sequences: never click; click anything with probability 1/2
    never = test.select("serp_id", F.lit(0).alias("sample_idx"), F.lit("stochastic").alias("click_mode"),
                        F.lit("original").alias("list_order"), "doc_ids",
                        F.transform("doc_ids", lambda d: F.lit(0)).alias("clicks"))
    never.write.parquet(f"{warehouse}/ext_never")
    coin = (test.select("serp_id", F.explode(F.sequence(F.lit(0), F.lit(6))).alias("sample_idx"), "doc_ids")
            .select("serp_id", "sample_idx", F.lit("stochastic").alias("click_mode"),
                    F.lit("original").alias("list_order"), "doc_ids",
                    F.transform("doc_ids", lambda d, i: (F.xxhash64("serp_id", "sample_idx", i) % 2 == 0)
                                .cast("int")).alias("clicks")))
    coin.write.parquet(f"{warehouse}/ext_coin")
    cfg = _config(external=(ExternalSequencesConfig(name="never", path=f"{warehouse}/ext_never"),
                            ExternalSequencesConfig(name="coin", path=f"{warehouse}/ext_coin")))
    written = STAGES["generate"](StageContext(spark, cfg, warehouse, RUN))
    rows = STAGES["surrogate"](StageContext(spark, cfg, warehouse, RUN))
    # generators by list order; the real log's reference rows by click_mode (stages/surrogate.py)
    return warehouse, written, {(r["generator_model"], r["click_mode"] if r["generator_model"] == "real_log"
                                 else r["list_order"]): r for r in rows}


@pytest.mark.slow
def test_true_generator_reverse_ppl_matches_the_real_log(simulated):
    _, written, rows = simulated
    real = rows[("real_log", "observed")]
    true_ubm = rows[("ubm", "original")]
    assert written["ubm"] == 3 * 7 * real["n_real"]  # 3 list orders x 7 samples per test SERP
    print(f"real-log PPL {real['reverse_ppl']:.4f}, true UBM reverse {true_ubm['reverse_ppl']:.4f} "
          f"forward {true_ubm['forward_ppl']:.4f}")
    assert true_ubm["reverse_ppl"] == pytest.approx(real["reverse_ppl"], rel=0.02)
    assert len(true_ubm["reverse_ppl_at"]) == 10


@pytest.mark.slow
def test_degenerate_generators_score_clearly_worse(simulated):
    _, _, rows = simulated
    good = rows[("ubm", "original")]["reverse_ppl"]
    never, coin = rows[("never", "original")]["reverse_ppl"], rows[("coin", "original")]["reverse_ppl"]
    print(f"reverse PPL: true UBM {good:.4f}, coin {coin:.4f}, never {never:.4f}")
    assert good * 1.1 < coin and good * 1.1 < never


@pytest.mark.slow
def test_shuffled_lists_keep_the_documents(spark, simulated):
    warehouse, _, _ = simulated
    syn = tables.read_table(spark, warehouse, "synthetic_serps").where(f"run_id = '{RUN}' AND generator_model = 'ubm'")
    real = tables.read_table(spark, warehouse, "serps").select("serp_id", F.col("doc_ids").alias("real_docs"))
    joined = syn.join(real, "serp_id", "inner")
    assert joined.where(F.array_sort("doc_ids") != F.array_sort("real_docs")).count() == 0
    assert joined.where("list_order = 'original' AND doc_ids != real_docs").count() == 0
    moved = joined.where("list_order = 'shuffled_all' AND doc_ids != real_docs").count()
    assert moved > 0.9 * joined.where("list_order = 'shuffled_all'").count()
    halves = joined.where("list_order = 'shuffled_halves'")
    assert halves.where(F.array_sort(F.slice("doc_ids", 1, 5)) != F.array_sort(F.slice("real_docs", 1, 5))).count() == 0


@pytest.mark.slow
def test_same_seed_same_rows_on_1_and_8_partitions(spark, simulated):
    warehouse, _, _ = simulated
    params = tables.read_table(spark, warehouse, "model_params")
    fitted = FittedModel.from_rows(params, get_model("ubm"), RUN, 10)
    test = tables.read_table(spark, warehouse, "serps").where("split = 'test'")

    def rows(df):
        out = generate(df, {"ubm": fitted}, samples=3, click_mode="stochastic",
                       list_orders=("shuffled_halves",), seed=11)
        return sorted(tuple(r) for r in out.select("serp_id", "sample_idx", "doc_ids", "clicks").collect())

    assert rows(test.coalesce(1)) == rows(test.repartition(8))


def test_reorder_is_a_permutation_within_halves(spark):
    df = spark.createDataFrame([("s1", [f"d{i}" for i in range(10)], None, [0] * 10)],
                               "serp_id string, doc_ids array<string>, vtypes array<string>, clicks array<int>")
    [row] = reorder(df, "shuffled_halves", 1).collect()
    assert sorted(row["doc_ids"][:5]) == [f"d{i}" for i in range(5)]
    assert sorted(row["doc_ids"][5:]) == [f"d{i}" for i in range(5, 10)]
    assert row["doc_ids"] != [f"d{i}" for i in range(10)] and row["vtypes"] is None


def test_perplexity_from_sums_skips_unreached_ranks_and_keeps_a_nan_sum_visible():
    from clickeval_spark.metrics.distributional import Perplexity
    ppl = Perplexity.from_sums([4, 2, 0], [-2.0, -1.0, 0.0])
    assert ppl.at_rank[:2] == (math.exp(0.5), math.exp(0.5)) and math.isnan(ppl.at_rank[2])
    assert ppl.total == math.exp(0.5) and ppl.n_serps == 4
    broken = Perplexity.from_sums([4, 2, 0], [-2.0, float("nan"), 0.0])
    assert math.isnan(broken.total) and broken.at_rank[0] == math.exp(0.5)


@pytest.mark.slow
def test_real_halves_partition_the_real_serps_by_session(spark, simulated):
    """Every real SERP in exactly one half, a session's SERPs in the same one; in the packed log the half-a fit
    trains on half a and holds out exactly half b (and the reverse), while group 0 trains on all of them."""
    warehouse, _, _ = simulated
    test = tables.read_table(spark, warehouse, "serps").where((F.col("dataset") == "sim-ubm") & (F.col("split") == "test"))
    halves = surrogate.real_with_halves(test, 10)
    by_serp = dict(halves.select("serp_id", "half").collect())
    assert len(by_serp) == halves.count() == test.count()
    assert set(by_serp.values()) == {"a", "b"}
    share = sum(h == "a" for h in by_serp.values()) / len(by_serp)
    assert 0.4 < share < 0.6, share
    sessions = dict(test.select("serp_id", "session_id").collect())
    per_session = {}
    for serp_id, half in by_serp.items():
        per_session.setdefault(sessions[serp_id], set()).add(half)
    assert all(len(h) == 1 for h in per_session.values())
    synthetic = tables.read_table(spark, warehouse, "synthetic_serps").where(F.col("run_id") == RUN)
    variants = spark.createDataFrame([(1, "ubm", "original", "stochastic")],
                                     "group int, generator_model string, list_order string, click_mode string")
    packed = surrogate.packed_inputs(halves, synthetic, variants, 1, 10).where(F.col("group") != 1).collect()

    def serps(group, held_out):
        ids = [r["serp_id"] for r in packed if (r["group"], r["held_out"]) == (group, held_out)]
        assert len(ids) == len(set(ids)), (group, held_out)   # none twice
        return set(ids)

    half_a = {s for s, h in by_serp.items() if h == "a"}
    half_b = set(by_serp) - half_a
    assert serps(0, False) == serps(0, True) == set(by_serp)
    assert serps(2, False) == half_a and serps(2, True) == half_b
    assert serps(3, False) == half_b and serps(3, True) == half_a


@pytest.mark.slow
def test_real_log_reference_is_out_of_sample(spark, simulated):
    _, _, rows = simulated
    inside, a_on_b, b_on_a, cross = (rows[("real_log", m)] for m in
                                     ("observed", "fit_a_score_b", "fit_b_score_a", "cross_fitted"))
    print(f"real-log PPL in sample {inside['reverse_ppl']:.4f}; out of sample: a->b {a_on_b['reverse_ppl']:.4f}, "
          f"b->a {b_on_a['reverse_ppl']:.4f}, cross-fitted {cross['reverse_ppl']:.4f}")
    assert {r["variant"] for r in (inside, a_on_b, b_on_a, cross)} == {
        "original/observed", "original/fit_a_score_b", "original/fit_b_score_a", "original/cross_fitted"}
    # half a's SERPs are b->a's scored ones; together every real SERP once
    assert a_on_b["n_synthetic"] == b_on_a["n_real"] and b_on_a["n_synthetic"] == a_on_b["n_real"]
    assert a_on_b["n_real"] + b_on_a["n_real"] == inside["n_real"] == cross["n_real"] == cross["n_synthetic"]
    assert a_on_b["forward_ppl"] == b_on_a["reverse_ppl"] and b_on_a["forward_ppl"] == a_on_b["reverse_ppl"]
    assert cross["forward_ppl"] == cross["reverse_ppl"]
    for t in range(10):   # the pooled PPL@t lies between the halves'
        lo, hi = sorted((a_on_b["reverse_ppl_at"][t], b_on_a["reverse_ppl_at"][t]))
        assert lo <= cross["reverse_ppl_at"][t] <= hi, t
    # fitted on half the sessions and scored on the others: worse than the in-sample fit, clearly
    assert cross["reverse_ppl"] > inside["reverse_ppl"] * 1.002
    assert min(a_on_b["reverse_ppl"], b_on_a["reverse_ppl"]) > inside["reverse_ppl"]


@pytest.mark.slow
def test_half_fit_in_the_packed_log_is_the_fit_of_that_half_alone(spark, simulated):
    """The a->b number equals a surrogate fitted on half a by itself (driver.fit, same prior and passes)
    and scored on half b with `perplexity`: the groups are wired to the right halves."""
    warehouse, _, rows = simulated
    cfg = _config()
    test = tables.read_table(spark, warehouse, "serps").where((F.col("dataset") == "sim-ubm") & (F.col("split") == "test"))
    halves = surrogate.real_with_halves(test, 10)
    dcm = get_model("dcm")
    alone = fit(halves.where(F.col("half") == "a"), dcm, iterations=cfg.surrogate.iterations, tol=None, max_rank=10,
                prior=model_prior(dcm, 10, *cfg.fit.prior_overrides("dcm")))
    on_b = perplexity(halves.where(F.col("half") == "b"), alone, cfg.surrogate.eps)
    assert rows[("real_log", "fit_a_score_b")]["reverse_ppl"] == pytest.approx(on_b.total, rel=1e-9)
    assert rows[("real_log", "fit_a_score_b")]["n_real"] == on_b.n_serps
