"""LL and PPL@t (conditional and unconditional) against an independent numpy computation."""

import numpy as np
import pandas as pd
import pytest

from clickeval_spark.metrics import bootstrap
from clickeval_spark.metrics.evaluate import MetricOptions, compute_metrics
from clickeval_spark.metrics.click_prediction import per_serp
from tests.metrics.helpers import PREDICTIONS_SCHEMA, SERPS_SCHEMA, random_log

EPS = 1e-6


def numpy_metrics(preds, max_rank=10):
    """DESIGN §5 written directly: LL over all positions, PPL@t = 2^(-mean log2), total = mean over t."""
    c = preds["click"].to_numpy()
    out = {}
    for name, col in (("cond", "p_click_cond"), ("uncond", "p_click")):
        p = np.clip(preds[col].to_numpy(), EPS, 1 - EPS)
        log2 = c * np.log2(p) + (1 - c) * np.log2(1 - p)
        ppl_t = {t: 2.0 ** (-log2[preds["rank"].to_numpy() == t].mean())
                 for t in range(1, max_rank + 1) if (preds["rank"] == t).any()}
        out[name] = (ppl_t, float(np.mean(list(ppl_t.values()))))
        out[f"clipped_{name}"] = int((p != preds[col].to_numpy()).sum())
    pc = np.clip(preds["p_click_cond"].to_numpy(), EPS, 1 - EPS)
    out["LL"] = float(np.mean(c * np.log(pc) + (1 - c) * np.log(1 - pc)))
    return out


@pytest.fixture(scope="module")
def random_case(spark):
    rng = np.random.default_rng(11)
    serps, preds = random_log(rng, n_sessions=60)
    opts = MetricOptions(replicates=50, seed=3)
    rows = compute_metrics(spark.createDataFrame(preds, PREDICTIONS_SCHEMA).transform(per_serp),
                           spark.createDataFrame(serps, SERPS_SCHEMA), None, None, [], opts,
                           reference_model="a")
    return serps, preds, rows, opts


def _value(rows, model, metric, cutoff=None, field="value"):
    [row] = [r for r in rows if r["model"] == model and r["metric"] == metric and r["cutoff"] == cutoff]
    return row[field]


def test_ll_and_ppl_equal_numpy(random_case):
    _, preds, rows, _ = random_case
    for model in ("a", "b"):
        expected = numpy_metrics(preds[preds["model"] == model])
        assert _value(rows, model, "LL") == pytest.approx(expected["LL"], abs=1e-9)
        for metric, key in (("PPL", "uncond"), ("PPL_cond", "cond")):
            per_rank, total = expected[key]
            assert _value(rows, model, metric) == pytest.approx(total, abs=1e-9)
            for t, ppl in per_rank.items():
                assert _value(rows, model, metric, t) == pytest.approx(ppl, abs=1e-9)
        assert _value(rows, model, "clipped_p_click_cond") == expected["clipped_cond"] > 0
        assert _value(rows, model, "clipped_p_click") == expected["clipped_uncond"] > 0


def test_n_counts_serps_and_ranks(random_case):
    serps, _, rows, _ = random_case
    assert _value(rows, "a", "LL", field="n") == len(serps)
    assert _value(rows, "a", "PPL", 10, field="n") == sum(len(s[5]) >= 10 for s in serps)


def test_intervals_are_the_session_bootstrap(spark, random_case):
    """The interval equals a numpy bootstrap with the same session weights: sessions, not SERPs, are resampled."""
    serps, preds, rows, opts = random_case
    session_of = {s[3]: s[2] for s in serps}
    a = preds[preds["model"] == "a"].assign(session=lambda d: d["serp_id"].map(session_of))
    sessions = sorted(a["session"].unique())
    # only the per-session hash comes from Spark (xxhash64); weights and sums are recomputed here
    hash_of = {r["session_id"]: r["h"] for r in
               spark.createDataFrame([(s,) for s in sessions], "session_id string")
               .select("session_id", bootstrap.session_hash(opts.seed).alias("h")).collect()}
    w = bootstrap.numpy_poisson_weights(np.array([hash_of[s] for s in sessions]), opts.replicates)
    idx = a["session"].map({s: i for i, s in enumerate(sessions)}).to_numpy()
    pc = np.clip(a["p_click_cond"].to_numpy(), EPS, 1 - EPS)
    c = a["click"].to_numpy()
    term = c * np.log(pc) + (1 - c) * np.log(1 - pc)
    rep_ll = (w[idx].T @ term) / w[idx].sum(axis=0)
    low, high = np.quantile(rep_ll[1:], [0.025, 0.975])
    assert _value(rows, "a", "LL", field="ci_low") == pytest.approx(low, abs=1e-9)
    assert _value(rows, "a", "LL", field="ci_high") == pytest.approx(high, abs=1e-9)
    assert low < _value(rows, "a", "LL") < high


def test_paired_difference_against_reference(random_case):
    _, _, rows, _ = random_case
    diff = [r for r in rows if r["metric"] == "LL_diff"]
    assert [(r["model"], r["reference_model"]) for r in diff] == [("b", "a")]
    assert diff[0]["value"] == pytest.approx(_value(rows, "b", "LL") - _value(rows, "a", "LL"), abs=1e-12)
    # paired: the difference's interval is not the naive combination of the two marginal intervals
    assert diff[0]["ci_low"] < diff[0]["value"] < diff[0]["ci_high"]


def test_serp_stats_equal_spark_sql_to_the_last_fixed_point_unit(spark):
    """The vectorised per-SERP statistics against the same DESIGN §5 terms written as Spark SQL
    expressions (element t of each array, clipped, logged, rounded by `bootstrap.to_fixed`): equal as
    longs. Edge cases: probabilities at and beyond the clip bounds, NaN (Spark orders it above every
    number, so it clips to 1 - eps), lists longer than max_rank, an empty list."""
    from pyspark.sql import functions as F
    from clickeval_spark.metrics.click_prediction import log_lik, clipped, serp_stats, stat_columns

    M, eps = 4, 1e-3
    rng = np.random.default_rng(5)
    rows = [("m", "d", "test", "s0", [1, 0, 1], [0.0, 1.0, 0.0005], [1e-3, 0.9995, float("nan")]),
            ("m", "d", "test", "s1", [0, 1, 0, 1, 1, 0], [0.3, 0.6, 0.2, 0.7, 0.8, 0.1], [0.4, 0.5, 0.1, 0.9, 0.2, 0.3]),
            ("m", "d", "test", "s2", [], [], [])]
    for i in range(40):
        n = int(rng.integers(1, 7))
        rows.append(("m2", "d", "valid", f"r{i}", rng.integers(0, 2, n).tolist(), rng.random(n).tolist(),
                     rng.random(n).tolist()))
    df = spark.createDataFrame(rows, "model string, dataset string, split string, serp_id string, clicks array<int>, "
                                     "p_click_cond array<double>, p_click array<double>")
    n = F.size("p_click_cond")
    cols = []
    for t in range(1, M + 1):
        here = n >= t
        for name, col in (("cond", "p_click_cond"), ("uncond", "p_click")):
            term = log_lik(clipped(F.element_at(col, t), eps), F.element_at("clicks", t))
            cols.append(F.when(here, bootstrap.to_fixed(term)).otherwise(F.lit(0).cast("long")).alias(f"ln_{name}_{t}"))
        cols.append(here.cast("long").alias(f"n_{t}"))
    for name, col in (("cond", "p_click_cond"), ("uncond", "p_click")):
        cols.append(F.size(F.filter(F.slice(col, 1, M), lambda p: p != clipped(p, eps))).cast("long").alias(f"clipped_{name}"))
    cols.append(F.least(n, F.lit(1)).cast("long").alias("n_serps"))
    stats = stat_columns(M)
    expected = {r["serp_id"]: [r[c] for c in stats] for r in df.select("serp_id", *cols).collect()}
    got = {r["serp_id"]: r["stats"] for r in serp_stats(df, M, eps).collect()}
    assert got == expected
    assert got["s0"][1:3] == [3, 2]      # 0.0, 1.0, 0.0005 clipped; of p_click 0.9995 and NaN, eps itself not
    assert got["s1"][stats.index("n_4")] == 1 and got["s2"][stats.index("n_1")] == 0


def test_observed_log_likelihood_is_taken_by_the_write(spark, tmp_path):
    """`observe_log_likelihood`: per model and split, the numpy LL of the rows the write wrote and their SERP
    count, summed by the write itself; groups without rows left out; the written rows untouched."""
    from clickeval_spark.metrics.click_prediction import observe_log_likelihood

    rng = np.random.default_rng(23)
    train = random_log(rng, n_sessions=30, split="train")[1]
    test = random_log(rng, n_sessions=20, split="test")[1]
    preds = pd.concat([train, test], ignore_index=True)
    df = spark.createDataFrame(preds, PREDICTIONS_SCHEMA).transform(per_serp)
    observed, log_likelihoods = observe_log_likelihood(df, ["a", "b", "never-fitted"], ["train", "valid", "test"], EPS)
    path = str(tmp_path / "click_predictions")
    observed.write.format("delta").save(path)

    got = log_likelihoods()
    assert set(got) == {"a", "b"}
    for model in ("a", "b"):
        by_split, n = got[model]
        assert set(by_split) == {"train", "test"}
        for split, rows in (("train", train), ("test", test)):
            mine = rows[rows["model"] == model]
            assert by_split[split] == pytest.approx(numpy_metrics(mine)["LL"], abs=1e-12)
        assert n == train[train["model"] == model]["serp_id"].nunique() + test[test["model"] == model]["serp_id"].nunique()
    written = spark.read.format("delta").load(path)
    assert written.columns == df.columns
    assert written.count() == df.count() == len(preds.groupby(["model", "split", "serp_id"]))
