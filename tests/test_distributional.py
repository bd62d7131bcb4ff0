"""Generate + surrogate on a log simulated from a known UBM: Reverse PPL separates good and degenerate generators."""

import math

import pytest
from pyspark.sql import functions as F

from clickeval_spark import tables
from clickeval_spark.config import (AppConfig, ExternalSequencesConfig, FitConfig, GenerateConfig, IngestConfig,
                                    SplitConfig, SurrogateConfig, SyntheticConfig)
from clickeval_spark.generation import generate, reorder
from clickeval_spark.models import get_model
from clickeval_spark.models.params_io import from_param_rows
from clickeval_spark.context import StageContext
from clickeval_spark.stages import STAGES

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
    return warehouse, written, {(r["generator_model"], r["list_order"]): r for r in rows}


def test_true_generator_reverse_ppl_matches_the_real_log(simulated):
    _, written, rows = simulated
    real = rows[("real_log", "original")]
    true_ubm = rows[("ubm", "original")]
    assert written["ubm"] == 3 * 7 * real["n_real"]  # 3 list orders x 7 samples per test SERP
    print(f"real-log PPL {real['reverse_ppl']:.4f}, true UBM reverse {true_ubm['reverse_ppl']:.4f} "
          f"forward {true_ubm['forward_ppl']:.4f}")
    assert true_ubm["reverse_ppl"] == pytest.approx(real["reverse_ppl"], rel=0.02)
    assert len(true_ubm["reverse_ppl_at"]) == 10


def test_degenerate_generators_score_clearly_worse(simulated):
    _, _, rows = simulated
    good = rows[("ubm", "original")]["reverse_ppl"]
    never, coin = rows[("never", "original")]["reverse_ppl"], rows[("coin", "original")]["reverse_ppl"]
    print(f"reverse PPL: true UBM {good:.4f}, coin {coin:.4f}, never {never:.4f}")
    assert good * 1.1 < coin and good * 1.1 < never


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


def test_same_seed_same_rows_on_1_and_8_partitions(spark, simulated):
    warehouse, _, _ = simulated
    params = tables.read_table(spark, warehouse, "model_params")
    fitted = from_param_rows(params, get_model("ubm"), RUN, 10)
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
