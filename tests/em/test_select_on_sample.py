"""`k: auto` on a large log: the candidates compete on a sample of whole queries, the chosen one fits the whole log
(`em.driver.fit` with `EMOptions.select_serps`)."""

from __future__ import annotations

import logging
import logging.handlers

import numpy as np
import pytest
from pyspark.sql import functions as F

from clickeval_spark.em.blocks import pack_serps
from clickeval_spark.em.driver import fit
from clickeval_spark.models import get_model
from tests.em.logs import split_log

M = 5
OPTIONS = dict(iterations=12, tol=None, max_rank=M, k_grid=(1.0, 16.0))


@pytest.fixture(scope="module")
def fits(spark, make_log):
    """UBM on 2,400 SERPs of 160 queries (a quarter held out), 4 blocks: candidates on the whole log, and on a
    sample of about 1,200 SERPs (2 blocks); and the sample's SERPs fitted alone."""
    model = get_model("ubm")
    log = make_log(model, n_serps=2400, M=M, seed=23, n_queries=160)
    held = np.arange(len(log.rows)) % 4 == 0
    train_df, valid_df = split_log(spark, log, held)
    # the blocks' rule (blocks.pack_log), written out: a query's SERPs go to block xxhash64 mod 4; the sample's
    # 2 blocks of 4 are spread over the range: 0 and 2
    in_sample = F.pmod(F.xxhash64(F.lit("clickeval-block"), F.col("query_id")), F.lit(4)).isin(0, 2)
    packed = pack_serps(train_df, max_rank=M, held_out=valid_df)
    alone = pack_serps(train_df.where(in_sample), max_rank=M, held_out=valid_df.where(in_sample))
    log = logging.getLogger("tests.select_on_sample")
    log.setLevel(logging.INFO)
    said = logging.handlers.BufferingHandler(10_000)
    log.addHandler(said)
    try:
        sampled = fit(packed, model, select_serps=1200, logger=log, **OPTIONS)   # auto: resident on local[2]
        yield {"whole": fit(packed, model, select_serps=None, **OPTIONS),
               "sampled": sampled, "log": "\n".join(r.getMessage() for r in said.buffer),
               "sampled_stages": fit(packed, model, select_serps=1200, engine="stages", **OPTIONS),
               "alone": fit(alone, model, select_serps=None, **OPTIONS),
               "n_sample": (train_df.where(in_sample).count(), valid_df.where(in_sample).count())}
    finally:
        log.removeHandler(said)
        packed.unpersist()
        alone.unpersist()


def test_the_sample_is_whole_queries_of_blocks_spread_over_the_log(fits):
    assert fits["sampled"].selection["sample"] == {"blocks": 2, "of_blocks": 4, "train_serps": fits["n_sample"][0],
                                                   "valid_serps": fits["n_sample"][1]}
    assert 900 < sum(fits["n_sample"]) < 1500
    assert "sample" not in fits["whole"].selection


def test_candidates_are_scored_as_on_the_samples_serps_alone(fits):
    """Each grid entry's valid LL is the one a fit of the sample's SERPs alone gives it (packed into other
    blocks, so summed in another order: equal to rounding)."""
    grid, alone = fits["sampled"].selection["grid"], fits["alone"].selection["grid"]
    assert [(g["k"], g["seen_means"]) for g in grid] == [(g["k"], g["seen_means"]) for g in alone]
    assert [g["valid_ll"] for g in grid] == pytest.approx([g["valid_ll"] for g in alone], rel=1e-10, abs=0)
    assert len({round(g["valid_ll"], 6) for g in grid}) > 1   # the candidates differ
    assert fits["sampled"].selection["n_valid_serps"] == fits["n_sample"][1]


def test_the_chosen_candidate_fits_the_whole_log_as_among_all_candidates(fits):
    """The sample chooses what the whole log chooses here (with 4 in the grid it would not: the sample takes 4,
    the whole log 16); the fit of the whole log is then the same bits
    (a candidate's passes do not depend on the others')."""
    sampled, whole = fits["sampled"], fits["whole"]
    chosen = (whole.selection["chosen_k"], whole.selection["chosen_seen_means"])
    assert (sampled.selection["chosen_k"], sampled.selection["chosen_seen_means"]) == chosen
    assert sorted(tuple(r) for r in sampled.qd.collect()) == sorted(tuple(r) for r in whole.qd.collect())
    assert {k: v.tobytes() for k, v in sampled.glob.items()} == {k: v.tobytes() for k, v in whole.glob.items()}
    assert (sampled.prior, sampled.log_posterior, sampled.valid_ll) == (whole.prior, whole.log_posterior,
                                                                        whole.valid_ll)
    assert [h[:2] for h in sampled.history] == [h[:2] for h in whole.history]
    assert sampled.prior_spec == whole.prior_spec


def test_resident_tasks_share_out_the_candidates_with_the_stage_engines_bits(fits):
    """On local[2] the sample's stage holds every sample block in each task and runs every other candidate;
    its selection (every grid entry's valid LL and passes) and the fit after it are the stage engine's bits."""
    assert "resident EM stage: 2 tasks up" in fits["log"] and "candidates shared out" in fits["log"]
    sampled, stages = fits["sampled"], fits["sampled_stages"]
    assert sampled.selection == stages.selection
    assert sorted(tuple(r) for r in sampled.qd.collect()) == sorted(tuple(r) for r in stages.qd.collect())
    assert {k: v.tobytes() for k, v in sampled.glob.items()} == {k: v.tobytes() for k, v in stages.glob.items()}
    assert sampled.log_posterior == stages.log_posterior
