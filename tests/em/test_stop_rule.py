"""The converging stop (fit.converge, on by default on a dense log): there it lands within 1e-5 nats per training
position of the fit's fixed point (its training LL after 300 passes), where fit.tol alone does not; on a sparse
log (few valid positions of pairs seen in training) tol's stop stands."""

from __future__ import annotations

import math

import numpy as np
import pytest
from pyspark.sql import functions as F

from clickeval_spark.em import EMOptions, fit, pack_serps
from clickeval_spark.em.candidates import remaining_gain
from clickeval_spark.models import get_model
from clickeval_spark.models.priors import model_prior

from tests.em.logs import split_log

TARGET = 1e-5   # nats per training position


def test_remaining_gain_is_the_tail_of_geometric_steps():
    """LL_t = L - c r^t: the gain still to come after entry t is c r^t, which the rule reads off three steps."""
    r, c, per_position = 0.97, 0.5, 0.25
    ll = [-2.0 - c * r ** t for t in range(40)]
    assert remaining_gain(ll, per_position) == pytest.approx(c * r ** 39 * per_position, rel=1e-6)
    assert remaining_gain(ll[:4], per_position) == math.inf   # too few steps to read a rate
    # a step that is not a rise counts at rate 0.99: 99 |d|
    assert remaining_gain([0.0, 1e-3, 2e-3, 3e-3, 3e-3 - 1e-8], 1.0) == pytest.approx(99e-8)


#: the training LL per SERP of the test's fit after 300 passes (tol None), the same bits on both engines:
#: fit(packed, pbm, EMOptions(prior=model_prior(pbm, 10, "beta", 1.0), iterations=300, tol=None)) on the log
#: below. A pass costs ~0.1 s of engine round trip whatever the log's size, so the 300 passes (~28 s) are not
#: run here; recompute it so if a kernel's LL changes.
LL_300 = -3.4591087628387247


def _dense_log(make_log):
    """1,500 SERPs a query (4 queries: the density of issue 57's 20 x 1,500) from a UBM (examination by rank and
    distance to the last click)."""
    return make_log(get_model("ubm"), n_serps=6000, M=10, seed=2, n_queries=4, pool=14)


def _fit_pbm(spark, log, held, **options):
    """PBM with one prior (k = 1), so the fit is one candidate's passes, on ``log`` less ``held`` rows, which
    valid scores; the package's default stop unless ``options`` say otherwise."""
    train, valid = split_log(spark, log, held)
    packed = pack_serps(train, max_rank=10, held_out=valid.withColumn("split", F.lit("valid")))
    pbm = get_model("pbm")
    try:
        return fit(packed, pbm, EMOptions(prior=model_prior(pbm, 10, "beta", 1.0), **options))
    finally:
        packed.unpersist()


def test_the_default_stop_lands_near_the_fixed_point_on_a_dense_log(spark, make_log):
    """Every tenth SERP held out: every valid position is of a pair seen in training, so the log is dense and
    the chosen fit goes on (the package's default: gain 3e-6, min_seen_share 0.9). fit.tol alone (the
    candidates' stop) was 1.5e-5 nats per position short of LL_300; the default stop is within 1e-5."""
    log = _dense_log(make_log)
    held = np.arange(len(log.rows)) % 10 == 9
    fitted = _fit_pbm(spark, log, held)
    per_position = (~held).sum() / log.mask[~held].sum()   # training SERPs per training position
    ll = [h[1] for h in fitted.history]
    stop = fitted.prior_spec["stop"]
    assert stop["seen_share"] == 1.0 and stop["min_seen_share"] == 0.9 and stop["converge"] == 3e-6
    assert len(ll) - 1 == stop["passes"] > stop["tol_passes"] and stop["rule"] == "converged"
    assert stop["gain"] < stop["converge"]
    assert (LL_300 - ll[stop["tol_passes"]]) * per_position > TARGET   # where fit.tol alone stops: short
    assert abs(LL_300 - ll[-1]) * per_position < TARGET


def test_on_a_sparse_log_the_candidates_stop_stands(spark, make_log):
    """The same log with query q3's SERPs held out instead: no valid position is of a pair seen in training
    (seen share 0 < 0.9), so the chosen fit ends where fit.tol ended it; with min_seen_share 0 it goes on."""
    log = _dense_log(make_log)
    held = np.array([row[5] == "q3" for row in log.rows])
    stop = _fit_pbm(spark, log, held).prior_spec["stop"]
    assert stop["seen_share"] == 0.0 and stop["rule"] == "tol" and stop["passes"] == stop["tol_passes"]
    anyway = _fit_pbm(spark, log, held, converge_min_seen=0.0).prior_spec["stop"]
    assert anyway["tol_passes"] == stop["tol_passes"] and anyway["passes"] > stop["passes"]
    assert anyway["rule"] == "converged"
