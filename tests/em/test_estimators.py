"""A model with a counting estimator beside its EM (SDBN): PyClick's prior fits by counting, any other prior
fits both and the valid split keeps the better, with both scores in the fit's prior record."""

from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from clickeval_spark.em import fit, pack_serps
from clickeval_spark.models import get_model
from clickeval_spark.models.priors import model_prior
from clickeval_spark.models.sdbn import SDBN


class _EMOnly(SDBN):
    counting = None


def test_the_valid_split_chooses_between_em_and_counting(spark, make_log):
    sdbn = get_model("sdbn")
    # clicks from DBN at gamma = 1: SDBN's own likelihood is the right one
    log = make_log(get_model("dbn"), n_serps=3000, M=6, seed=23, g_true={"gamma": 1.0})
    df = log.df(spark)
    valid = F.substring("serp_id", -1, 1).isin("0", "5")
    packed = pack_serps(df.where(~valid), max_rank=6, held_out=df.where(valid).withColumn("split", F.lit("valid")))
    try:
        prior = model_prior(sdbn, 6, "beta", 2.0)
        chosen = fit(packed, sdbn, iterations=15, tol=None, prior=prior)
        em = fit(packed, _EMOnly(), iterations=15, tol=None, prior=prior)
        counted = fit(packed, sdbn.counting, iterations=15, tol=None, prior=prior)
        pyclick = fit(packed, sdbn, iterations=15, tol=None, prior=model_prior(sdbn, 6, "pyclick"))
    finally:
        packed.unpersist()
    scores = chosen.prior_spec["estimator_valid_ll"]
    # the same fits again (sums over tasks may reassociate: equal to rounding)
    assert scores == pytest.approx({"em": em.valid_ll, "counting": counted.valid_ll}, rel=1e-12)
    best = max(scores, key=scores.get)
    assert chosen.prior_spec["estimator"] == best and chosen.valid_ll == scores[best]
    assert abs(scores["em"] - scores["counting"]) > 1e-6   # a choice the test can see
    assert chosen.model is sdbn
    assert [h[1] for h in chosen.history] == pytest.approx([h[1] for h in (em if best == "em" else counted).history],
                                                           rel=1e-12)
    print(f"valid LL per position: em {em.valid_ll:.5f}, counting {counted.valid_ll:.5f}")
    assert best == "em" and em.valid_ll > counted.valid_ll + 1e-3   # measured: -0.46217 against -0.48246
    assert pyclick.prior_spec["estimator"] == "counting" and "estimator_valid_ll" not in pyclick.prior_spec
    assert len(pyclick.history) == 2   # a counting pass: iteration 0 and one more
