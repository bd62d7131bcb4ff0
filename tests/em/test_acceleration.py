"""SQUAREM's continuation of the chosen fit (fit.converge.accelerate, `em.acceleration`): the extrapolation, the
block step's kept points, and a fit that reaches the same fixed point as plain EM in fewer passes."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from pyspark.sql import functions as F

from clickeval_spark.em import EMOptions, fit, pack_serps
from clickeval_spark.em.passes import PassMode, PassPlan
from clickeval_spark.em.extrapolation import EXTRAPOLATION_MARGIN, extrapolated
from clickeval_spark.em.step import BlockArrays, em_block, stats_layout
from clickeval_spark.em.sums import block_pass, split_stats
from clickeval_spark.models import get_model
from clickeval_spark.models.priors import model_prior

from tests.em.logs import split_log
from tests.em.test_stop_rule import TARGET, _dense_log


def test_the_extrapolation_of_a_linear_map_lands_on_its_fixed_point():
    """p -> p* + rho (p - p*): r = (rho - 1) e, v = (rho - 1)^2 e, so the step length |r| / |v| = 1 / (1 - rho)
    gives p0 + e (1 + a (rho - 1))^2 = p*; a = 1 gives p2."""
    star, rho = np.array([0.2, 0.7, 0.45]), 0.97
    p0 = np.array([0.5, 0.5, 0.1])
    p1 = star + rho * (p0 - star)
    p2 = star + rho * (p1 - star)
    r, v = p1 - p0, p2 - 2 * p1 + p0
    alpha = np.linalg.norm(r) / np.linalg.norm(v)
    assert alpha == pytest.approx(1 / (1 - rho))
    np.testing.assert_allclose(extrapolated(p0, p1, p2, alpha), star, atol=1e-12)
    np.testing.assert_array_equal(extrapolated(p0, p1, p2, 1.0), p2)


def test_the_extrapolation_stays_inside_the_unit_interval():
    """A long step past 0 or 1 stops EXTRAPOLATION_MARGIN inside; a third point already outside keeps its side."""
    p0, p1, p2 = np.array([0.5, 0.5, 1e-9]), np.array([0.3, 0.7, 1e-9]), np.array([0.12, 0.88, 1e-9])
    out = extrapolated(p0, p1, p2, 10.0)
    assert out[0] == EXTRAPOLATION_MARGIN and out[1] == 1 - EXTRAPOLATION_MARGIN and out[2] == 1e-9


def _block():
    rng = np.random.default_rng(5)
    B, M, n_pairs = 200, 4, 12
    pair = rng.integers(0, n_pairs, size=(B, M)).astype(np.int32)
    pair[rng.random((B, M)) < 0.1] = -1
    clicks = ((rng.random((B, M)) < 0.3) & (pair >= 0)).astype(np.int8)
    return BlockArrays.of(get_model("ubm"), clicks, pair, n_pairs, n_train=170)


def test_a_cycles_passes_keep_their_points_and_sum_their_norms():
    """The block step of a cycle (UBM, a prior with a pooled mean): keep 0, keep 1, NORM (the M-step kept as the
    third point; its norms against numpy's), then the extrapolated point, or the third point restored."""
    model, block = get_model("ubm"), _block()
    M = block.clicks.shape[1]
    g = model.init_global(M)
    update = (np.array([3.0]), np.array([0.3]))
    state, _ = em_block(model, block, None, PassPlan(PassMode.STEP, g, update))
    assert state.shape[0] == 3   # nothing kept: the plain state
    s0, _ = em_block(model, block, state, PassPlan(PassMode.STEP, g, update, keep=0))
    s1, _ = em_block(model, block, s0, PassPlan(PassMode.STEP, g, update, keep=1))
    assert s1.shape[0] == 6
    np.testing.assert_array_equal(s1[3], s0[0])   # p0: the values the first pass ran at
    np.testing.assert_array_equal(s1[4], s1[0])   # p1
    plain, _ = em_block(model, block, s1, PassPlan(PassMode.STEP, g, update))
    norm, vec = em_block(model, block, s1, PassPlan(PassMode.NORM, g, update))
    np.testing.assert_array_equal(norm[5], plain[0])   # p2: the M-step a plain pass would have run at
    np.testing.assert_array_equal(norm[1:3], s1[1:3])   # no E-step: the last one's sums stay
    sums = split_stats(model, M, vec)
    r, v = s1[4] - s1[3], plain[0] - 2 * s1[4] + s1[3]
    assert sums["accel"][0] == pytest.approx(float(np.sum(r * r)), rel=1e-12)
    assert sums["accel"][1] == pytest.approx(float(np.sum(v * v)), rel=1e-12)
    assert sums["accel"][0] > 0 and sums["ll"][0] == 0 and len(vec) == sum(n for _, n in stats_layout(model, M))
    jump, _ = em_block(model, block, norm, PassPlan(PassMode.STEP, g, update, extrapolate=2.5))
    np.testing.assert_array_equal(jump[0], extrapolated(s1[3], s1[4], plain[0], 2.5))
    np.testing.assert_array_equal(jump[3:], norm[3:])   # kept: a refused point restores the third
    back, back_vec = em_block(model, block, jump, PassPlan(PassMode.STEP, g, update, restore=True))
    np.testing.assert_array_equal(back[0], plain[0])
    assert back.shape[0] == 3
    np.testing.assert_array_equal(back_vec, em_block(model, block, s1, PassPlan(PassMode.STEP, g, update))[1])
    with pytest.raises(ValueError, match="needs the points a cycle kept"):
        em_block(model, block, state, PassPlan(PassMode.STEP, g, update, extrapolate=2.0))


def test_a_held_candidate_keeps_its_state_while_another_keeps_points():
    """Two candidates of one group in a block: while the first keeps points (depth 6), the held one's rows are its
    own 3 and zeros; once no plan keeps any, the block's state is 3 rows deep again, the held one's unchanged."""
    model, block = get_model("ubm"), _block()
    g, update = model.init_global(block.clicks.shape[1]), (np.array([3.0]), np.array([0.3]))
    lanes = [[0, 1]]
    step = PassPlan(PassMode.STEP, g, update)
    state, _ = block_pass(model, [step, step], lanes, (0,), 0, block, None)
    kept, _ = block_pass(model, [replace(step, keep=0), PassPlan(PassMode.HOLD, g, update)], lanes, (0,), 0, block,
                         state)
    assert kept.shape == (2, 6) + state.shape[2:]
    np.testing.assert_array_equal(kept[0], em_block(model, block, state[0], replace(step, keep=0))[0])
    np.testing.assert_array_equal(kept[1, :3], state[1])
    assert not kept[1, 3:].any()
    back, _ = block_pass(model, [step, PassPlan(PassMode.HOLD, g, update)], lanes, (0,), 0, block, kept)
    assert back.shape == state.shape
    np.testing.assert_array_equal(back[1], state[1])
    np.testing.assert_array_equal(back[0], em_block(model, block, kept[0], step)[0])


#: CCM's training LL per SERP after 300 plain passes on the dense log below (k = 1), as `test_stop_rule.LL_300`
#: is PBM's: fit(packed, ccm, EMOptions(prior=model_prior(ccm, 10, "beta", 1.0), iterations=300, tol=None))
CCM_LL_300 = -3.546062751512708


def test_squarem_reaches_plain_ems_fixed_point_in_fewer_passes(spark, make_log):
    """CCM on the dense log of test_stop_rule (its slowest EM there: 124 plain passes to the converging stop):
    by SQUAREM's cycles the chosen fit stops as near LL_300 (within TARGET) in under 60% of the E-step passes."""
    log = _dense_log(make_log)
    held = np.arange(len(log.rows)) % 10 == 9
    per_position = (~held).sum() / log.mask[~held].sum()
    train, valid = split_log(spark, log, held)
    packed = pack_serps(train, max_rank=10, held_out=valid.withColumn("split", F.lit("valid")))
    ccm = get_model("ccm")
    try:
        plain, fast = (fit(packed, ccm, EMOptions(prior=model_prior(ccm, 10, "beta", 1.0), converge_accelerate=acc))
                       for acc in (False, True))
    finally:
        packed.unpersist()
    p, s = plain.prior_spec["stop"], fast.prior_spec["stop"]
    assert p["rule"] == s["rule"] == "converged" and p["tol_passes"] == s["tol_passes"] < s["passes"]
    assert "accelerate" not in p and s["accelerate"] == "squarem" and s["cycles"] >= 1
    assert s["passes"] == len(fast.history) - 1 and s["norm_passes"] == s["cycles"] + s["refused"]
    assert s["passes"] + s["refused"] < 0.6 * p["passes"]   # E-step passes; a NORM pass runs no E-step
    for f in (plain, fast):
        assert abs(CCM_LL_300 - f.history[-1][1]) * per_position < TARGET


def test_both_engines_run_the_cycles_to_the_same_bits(spark, make_log):
    """PBM on the dense log, by one Spark job per pass (the kept points cross each pass in the blocks' state
    column) and by the resident stage (kept in its tasks): the same history, global and per-pair values; its
    cycles include a refused extrapolation (the kept third point restored)."""
    log = _dense_log(make_log)
    held = np.arange(len(log.rows)) % 10 == 9
    train, valid = split_log(spark, log, held)
    packed = pack_serps(train, max_rank=10, held_out=valid.withColumn("split", F.lit("valid")))
    pbm = get_model("pbm")
    got = {}
    try:
        for engine in ("stages", "resident"):
            f = fit(packed, pbm, EMOptions(prior=model_prior(pbm, 10, "beta", 1.0), engine=engine))
            got[engine] = ([h[1] for h in f.history], {k: v.tolist() for k, v in f.glob.items()},
                           sorted(tuple(r) for r in f.qd.collect()), f.prior_spec["stop"])
    finally:
        packed.unpersist()
    assert got["stages"] == got["resident"]
    stop = got["stages"][3]
    assert stop["accelerate"] == "squarem" and stop["cycles"] >= 1 and stop["refused"] >= 1
