"""The session-level Poisson bootstrap: exact sums, 1/sqrt(n) narrowing, and coverage of the true LL."""

import numpy as np
import pandas as pd
import pytest

from clickeval_spark.metrics import bootstrap
from clickeval_spark.metrics.evaluate import MetricOptions, compute_metrics
from clickeval_spark.metrics.click_prediction import per_serp
from tests.metrics.helpers import PREDICTIONS_SCHEMA, SERPS_SCHEMA

GAMMA = 1.0 / np.arange(1, 11) ** 0.7
ALPHA_RANGE = (0.05, 0.95)
SERPS_PER_SESSION = 3


def simulate_pbm(rng, model, n_sessions):
    """Sessions of 3 SERPs of one query (shared attractiveness, so SERPs of a session are correlated);
    predictions are the true PBM probabilities."""
    alpha = rng.uniform(*ALPHA_RANGE, size=(n_sessions, 1, 10)).repeat(SERPS_PER_SESSION, axis=1)
    p = (alpha * GAMMA).reshape(-1, 10)
    clicks = (rng.uniform(size=p.shape) < p).astype(int)
    n = len(p)
    serp_ids = np.array([f"{model}-{i}" for i in range(n)])
    session_ids = np.array([f"{model}-s{i // SERPS_PER_SESSION}" for i in range(n)])
    preds = pd.DataFrame({
        "model": model, "dataset": "sim", "split": "test", "serp_id": serp_ids.repeat(10),
        "rank": np.tile(np.arange(1, 11, dtype=np.int32), n), "click": clicks.ravel().astype(np.int32),
        "p_click_cond": p.ravel(), "p_click": p.ravel()})
    serps = pd.DataFrame({"dataset": "sim", "split": "test", "session_id": session_ids, "serp_id": serp_ids,
                          "query_id": session_ids, "doc_ids": [["x"] * 10] * n, "clicks": clicks.tolist()})
    return preds, serps


def true_expected_ll():
    """E[LL] under the simulation: mean over ranks of E_alpha[p ln p + (1-p) ln(1-p)], p = gamma_t alpha."""
    lo, hi = ALPHA_RANGE
    alpha = lo + (np.arange(200_000) + 0.5) * (hi - lo) / 200_000
    p = alpha[:, None] * GAMMA[None, :]
    return float(np.mean(p * np.log(p) + (1 - p) * np.log(1 - p)))


@pytest.fixture(scope="module")
def repeats(spark):
    """100 seeded repeats of 100 sessions and 10 repeats of 400 sessions, evaluated in one pass (one 'model' each)."""
    rng = np.random.default_rng(2021)
    frames = [simulate_pbm(rng, f"r{i:03d}", 100) for i in range(100)]
    frames += [simulate_pbm(rng, f"x4-{i}", 400) for i in range(10)]
    preds = pd.concat([f[0] for f in frames], ignore_index=True)
    serps = pd.concat([f[1] for f in frames], ignore_index=True)
    rows = compute_metrics(spark.createDataFrame(preds, PREDICTIONS_SCHEMA).transform(per_serp),
                           spark.createDataFrame(serps, SERPS_SCHEMA), None, None, [],
                           MetricOptions(replicates=200, seed=9))
    return {r["model"]: r for r in rows if r["metric"] == "LL"}


@pytest.mark.slow
def test_interval_covers_true_expected_ll(repeats):
    truth = true_expected_ll()
    covered = sum(repeats[f"r{i:03d}"]["ci_low"] <= truth <= repeats[f"r{i:03d}"]["ci_high"] for i in range(100))
    print(f"true E[LL] {truth:.5f}; covered in {covered}/100 repeats")
    assert covered >= 85
    # and an interval is not trivially wide: well under the spread of the point estimates
    widths = [repeats[f"r{i:03d}"]["ci_high"] - repeats[f"r{i:03d}"]["ci_low"] for i in range(100)]
    spread = np.std([repeats[f"r{i:03d}"]["value"] for i in range(100)])
    assert 3.0 * spread < np.mean(widths) < 5.0 * spread  # ~2 x 1.96 sd for a 95% interval


@pytest.mark.slow
def test_four_times_the_data_halves_the_interval(repeats):
    small = np.mean([repeats[f"r{i:03d}"]["ci_high"] - repeats[f"r{i:03d}"]["ci_low"] for i in range(100)])
    large = np.mean([repeats[f"x4-{i}"]["ci_high"] - repeats[f"x4-{i}"]["ci_low"] for i in range(10)])
    print(f"mean 95% width: 100 sessions {small:.5f}, 400 sessions {large:.5f}, ratio {large / small:.3f}")
    assert 0.4 <= large / small <= 0.6


def test_weights_are_poisson_one_and_pure_functions_of_the_hash():
    hashes = np.random.default_rng(0).integers(-2**63, 2**63 - 1, size=50_000, dtype=np.int64)
    w = bootstrap.poisson_weights(hashes, 40)
    assert (w[:, 0] == 1).all()
    draws = w[:, 1:].ravel()
    assert draws.mean() == pytest.approx(1.0, abs=0.01) and draws.var() == pytest.approx(1.0, abs=0.02)
    assert (np.bincount(draws)[:3] / draws.size) == pytest.approx([np.exp(-1), np.exp(-1), np.exp(-1) / 2], abs=0.005)
    # a session's weights do not depend on which other sessions share its batch
    assert (bootstrap.poisson_weights(hashes[7:9], 40) == w[7:9]).all()


def test_compiled_weights_are_the_numpy_draws():
    """The compiled draws (`poisson_weights`) against the numpy ones, integer for integer, past the
    eight CDF entries the compiled loop reads without branching."""
    rng = np.random.default_rng(3)
    hashes = np.r_[rng.integers(-2**63, 2**63 - 1, size=30_000, dtype=np.int64),
                   np.array([0, -1, 1, 2**63 - 1, -2**63], dtype=np.int64)]
    w = bootstrap.poisson_weights(hashes, 200)
    assert np.array_equal(w, bootstrap.numpy_poisson_weights(hashes, 200))
    assert w.max() >= 9 and w.dtype == np.int64


def test_a_sessions_rows_weigh_as_their_sum(spark):
    """`replicate_sums` over one row per SERP, over one summed row per session, and over the SERP rows'
    statistics as one array column: the same exact sums, and those of a numpy oracle
    (weights.T @ statistics per key group, in Python integers)."""
    from pyspark.sql import functions as F

    rng = np.random.default_rng(11)
    cols, R, seed, keys = ["a", "b", "c"], 30, 99, ["model", "dataset", "split"]
    rows = []
    for i in range(60):
        split = ("train", "test")[i % 2]
        for model in ("m1", "m2"):
            for _ in range(int(rng.integers(1, 5))):
                rows.append((model, "d", split, f"s{i}", *[int(v) for v in rng.integers(-2**40, 2**40, 3)]))
    serp_rows = pd.DataFrame(rows, columns=[*keys, "session_id", *cols])
    schema = "model string, dataset string, split string, session_id string, a long, b long, c long"
    per_serp = spark.createDataFrame(serp_rows, schema)
    per_session = spark.createDataFrame(serp_rows.groupby([*keys, "session_id"], as_index=False)[cols].sum(), schema)

    def sums(df, vector=None):
        got = bootstrap.replicate_sums(df, keys, cols, seed, R, vector).collect()
        return {(r["model"], r["split"], r["replicate"]): tuple(int(r[c]) for c in cols) for r in got}

    by_serp = sums(per_serp)
    assert by_serp == sums(per_session)
    assert by_serp == sums(per_serp.select(*keys, "session_id", F.array(*cols).alias("v")), vector="v")
    hash_of = {r["session_id"]: r["h"] for r in
               per_serp.select("session_id", bootstrap.session_hash(seed).alias("h")).distinct().collect()}
    for (model, split), group in serp_rows.groupby(["model", "split"]):
        w = bootstrap.numpy_poisson_weights(group["session_id"].map(hash_of).to_numpy(), R)
        oracle = w.T.astype(object) @ group[cols].to_numpy().astype(object)
        assert [by_serp[(model, split, r)] for r in range(R + 1)] == [tuple(row) for row in oracle]


def test_weighted_sums_are_exact_for_large_integers():
    rng = np.random.default_rng(1)
    stats = rng.integers(-2**42, 2**42, size=(3000, 7), dtype=np.int64)
    w = bootstrap.poisson_weights(rng.integers(-2**63, 2**63 - 1, size=3000, dtype=np.int64), 30)
    exact = w.T.astype(object) @ stats.astype(object)
    assert (bootstrap.weighted_sums(w, stats).astype(object) == exact).all()
