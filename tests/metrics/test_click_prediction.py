"""LL and PPL@t (conditional and unconditional) against an independent numpy computation."""

import numpy as np
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
    w = bootstrap.poisson_weights(np.array([hash_of[s] for s in sessions]), opts.replicates)
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
