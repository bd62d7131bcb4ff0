"""PyClick's own test LL on the real TREC Session 2014 sample, reproduced through our code (issue 37 point 5).

`fit.prior.kind: pyclick` is PyClick's estimator: k = 2, m = 0.5 in every update (ParamMLE and ParamEM
start at numerator 1 / denominator 2, ParamEM since PyClick's commit a3e505d of 2016-12, and every EM pass
starts again from a fresh copy), pairs unseen in training 0.5 (QueryDocumentParamContainer's defaultdict).
PyClick's pass counts: EMInference.ITERATION_NUM = 50 passes for PBM and UBM, always all of them (PyClick
has no convergence test, so `fit.tol` is off), and one counting pass for GCTR / RCTR / DCTR / SDBN
(MLEInference; our non-iterative models make one pass whatever `fit.iterations` says). Every TREC list has
10 results, so PyClick's UBM cell for "no click above", (rank, M - 1), is a cell of its own as our (rank, 0)
is: the two indexings label the same cells. PyClick's LL (Evaluation.LogLikelihood: the mean over SERPs of
each SERP's mean log P(C_r | clicks above), unclipped) is then the metrics table's LL (DESIGN.md §5) on the
test split: every SERP has 10 ranks and no probability here comes near the 1e-6 clip (0.0019 to 0.8).

The pins are PyClick's numbers to 8 decimals (so +-5e-9); ours are within 3.6e-9 of every one. The issue
asks for 1e-6, but at 1e-6 the test LL cannot tell PyClick's 50 passes from any count above 35 (EM has
nearly converged: PBM is 1.1e-6 off after 35 passes, 5e-7 after 40, 2.6e-7 after 100). At `PIN_TOL` = 1e-8
it fails with 49 or 51 passes (PBM 2.8e-8 / 3.1e-8 off, UBM 2.1e-8 / 1.8e-8), with the default `fit.tol`
(PBM stops after 17 passes: 1.6e-5), with PyClick's default before July 2015 of 5 passes (7.5e-3),
and with the default `beta` prior (DCTR 0.44).
"""

from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from clickeval_spark import ingestion
from clickeval_spark.config import FitConfig, IngestConfig, PriorConfig
from clickeval_spark.metrics.click_prediction import log_likelihood_by_split
from clickeval_spark.models import get_model
from clickeval_spark.fitted.predict import predict_models
from clickeval_spark.models.priors import model_prior
from clickeval_spark.em.blocks import pack_serps
from clickeval_spark.em.driver import fit
from tests.data import TREC_SAMPLE as DATA

pytestmark = pytest.mark.slow

#: PyClick's test LL on this sample, per model
PYCLICK_TEST_LL = {
    "gctr": -0.18490927,
    "rctr": -0.16980228,
    "dctr": -0.61870230,
    "pbm": -0.16781382,
    "ubm": -0.15675760,
    "sdbn": -0.54901195,
}
#: EMInference.ITERATION_NUM (pyclick/click_models/Inference.py); PyClick runs every pass
PYCLICK = FitConfig(models=tuple(PYCLICK_TEST_LL), iterations=50, tol=None, prior=PriorConfig(kind="pyclick"))
#: tighter than the issue's 1e-6, and above the pins' rounding: one EM pass more or less breaks it (docstring)
PIN_TOL = 1e-8


@pytest.fixture(scope="module")
def trec_serps(spark):
    """The TREC sample's accepted SERPs, parsed and validated as the ingest stage of tests/test_stages_trec.py
    (and conf/trec-demo.yaml) does, without writing them to Delta tables."""
    icfg = IngestConfig(dataset="trec2014", format="per_query_text", text_variant="graphcm",
                        paths={s: str(DATA / f"{s}_per_query_quid.txt") for s in ("train", "valid", "test")})
    out = ingestion.run_ingest(spark, icfg, ingestion.parse_serps(spark, icfg), None, "pyclick-pin")
    serps = out.serps.cache()
    yield serps
    serps.unpersist()


def test_pyclick_prior_and_pass_counts_reproduce_pyclicks_trec_test_ll(spark, trec_serps):
    train, test = trec_serps.where("split = 'train'"), trec_serps.where("split = 'test'")
    packed = pack_serps(train, PYCLICK.max_rank)
    fitted = {}
    try:
        for name in PYCLICK.models:   # as the fit stage does, from the config
            model = get_model(name)
            kind, k, families = PYCLICK.prior_overrides(name)
            fitted[name] = fit(packed, model, iterations=PYCLICK.iterations, tol=PYCLICK.tol,
                               prior=model_prior(model, packed.max_rank, kind, k, families))
    finally:
        packed.unpersist()
    assert {m: len(f.history) - 1 for m, f in fitted.items()} == {
        m: PYCLICK.iterations if m in ("pbm", "ubm") else 1 for m in PYCLICK_TEST_LL}
    assert all(f.prior_spec["kind"] == "pyclick" for f in fitted.values())
    # the metrics table's LL on test (tests/test_stages_trec.py checks the evaluate stage gives this number)
    predictions = predict_models(test, fitted).cache()
    try:
        assert dict(predictions.groupBy("model").count().collect()) == {m: 363 for m in PYCLICK_TEST_LL}
        got = {m: log_likelihood_by_split(predictions.where(F.col("model") == m))["test"] for m in PYCLICK_TEST_LL}
    finally:
        predictions.unpersist()
    off = {m: got[m] - pin for m, pin in PYCLICK_TEST_LL.items() if not abs(got[m] - pin) <= PIN_TOL}
    assert not off, f"test LL minus PyClick's, where more than {PIN_TOL:g} apart: {off} (ours: {got})"
