"""Successive halving of `k: auto`'s candidates (`em.selection.halve`, `fit.prior.halving`): the candidates left run
exactly as among all of them, a dropped one is never chosen, and on the TREC sample and `make run`'s log the
choice is the full selection's."""

from __future__ import annotations

import json

import numpy as np
import pytest

from clickeval_spark.config import PROJECT_ROOT, load_config
from clickeval_spark.context import StageContext
from clickeval_spark.em import EMOptions, fit, pack_serps
from clickeval_spark.models import get_model
from clickeval_spark.report_html import priors_html
from clickeval_spark.sources import synthetic
from clickeval_spark.splits import assign_splits
from clickeval_spark.stages import STAGES
from tests.em.logs import split_log

M = 5
OPTIONS = dict(iterations=10, tol=None, max_rank=M, k_grid=(0.5, 4.0, 64.0))


@pytest.fixture(scope="module")
def small(spark, make_log):
    """PBM on 1,600 SERPs of 120 queries, a quarter held out: packed train + valid."""
    log = make_log(get_model("pbm"), n_serps=1600, M=M, seed=31, n_queries=120)
    train_df, valid_df = split_log(spark, log, np.arange(len(log.rows)) % 4 == 0)
    return pack_serps(train_df, max_rank=M, held_out=valid_df)


def _grid(fitted) -> dict[str, dict]:
    return {f"{e['k']}/{e['seen_means']}": e for e in fitted.selection["grid"]}


def test_the_candidates_left_run_as_among_all_and_the_dropped_ones_stop(small):
    model = get_model("pbm")
    full = fit(small, model, halving=(), **OPTIONS)
    # a margin no candidate but the leader of iteration 2 can stay within: one candidate goes on
    one = fit(small, model, halving=((2, 1e-12),), **OPTIONS)
    at_2 = {key: e for key, e in _grid(one).items() if "dropped_at" not in e}
    [kept] = at_2
    dropped = {key: e for key, e in _grid(one).items() if key != kept}
    assert len(dropped) == len(full.selection["grid"]) - 1
    # each dropped candidate made the pass that scored iteration 2 (its valid LL there is recorded) and no more
    assert {(e["dropped_at"], e["iterations"]) for e in dropped.values()} == {(2, 3)}
    assert all(e["valid_ll"] < at_2[kept]["valid_ll"] for e in dropped.values())
    # the one left ran exactly as it did among all of them: the same passes, bit for bit
    assert _grid(full)[kept]["valid_ll"] == at_2[kept]["valid_ll"]
    assert _grid(full)[kept]["iterations"] == at_2[kept]["iterations"] == OPTIONS["iterations"]
    # and it is chosen, whatever the full selection chose: a dropped candidate is not
    assert f"{one.selection['chosen_k']}/{one.selection['chosen_seen_means']}" == kept
    if f"{full.selection['chosen_k']}/{full.selection['chosen_seen_means']}" == kept:
        assert [h[1] for h in one.history] == [h[1] for h in full.history]
        assert one.valid_ll == full.valid_ll


def test_the_default_rounds_keep_the_full_selections_fit(small):
    model = get_model("pbm")
    full = fit(small, model, halving=(), **OPTIONS)
    halved = fit(small, model, **OPTIONS)   # the default rounds: iterations 6 and 8 fall within 10 passes
    assert EMOptions().halving == ((6, 2e-3), (8, 1e-3), (12, 3e-4), (16, 1e-4))
    assert (halved.selection["chosen_k"], halved.selection["chosen_seen_means"]) == (
        full.selection["chosen_k"], full.selection["chosen_seen_means"])
    assert [h[1] for h in halved.history] == [h[1] for h in full.history]
    assert halved.valid_ll == full.valid_ll
    assert sum("dropped_at" in e for e in halved.selection["grid"]) >= 1


def test_the_report_says_which_candidates_halving_stopped():
    sel = {"chosen_k": 4.0, "chosen_seen_means": "rank",
           "grid": [{"k": 4.0, "seen_means": "rank", "valid_ll": -0.29381, "iterations": 41},
                    {"k": 0.5, "seen_means": "pooled", "valid_ll": -0.31012, "iterations": 7, "dropped_at": 6}]}
    params = [{"model": "pbm", "param": "prior_kind:beta", "rank": None, "value": 1.0}]
    page = priors_html(params, [{"job": "fit:pbm", "details": json.dumps({"prior_selection": sel})}], ["pbm"])
    assert "k = 4/rank of {k = 4/rank: -0.2938, k = 0.5: -0.3101 (out after iteration 6)}" in page


def test_halving_rounds_are_checked():
    with pytest.raises(ValueError, match="halving"):
        EMOptions(halving=((0, 1e-3),))
    with pytest.raises(ValueError, match="halving"):
        EMOptions(halving=((8, 0.0),))


# the full selection's choice of each EM model with candidates: the same fits with halving off
# (`fit.prior.halving: {}`, the selection before halving existed; benchmarks/RESULTS.md, "Successive halving")
TREC_CHOICE = {"pbm": "4.0/rank", "ubm": "4.0/pooled", "dcm": "16.0/rank", "ccm": "16.0/pooled",
               "dbn": "16.0/pooled", "sdbn": "16.0/rank"}
MAKE_RUN_CHOICE = {"pbm": "2.0/rank", "ubm": "2.0/rank", "dcm": "eb/rank", "ccm": "4.0/rank",
                   "dbn": "8.0/rank", "sdbn": "eb/rank"}


@pytest.fixture(scope="module")
def trec(spark, tmp_path_factory):
    """conf/trec-demo.yaml's log (the TREC sample the repository carries) as its fit stage packs it."""
    warehouse = str(tmp_path_factory.mktemp("wh_halving"))
    cfg = load_config(PROJECT_ROOT / "conf" / "trec-demo.yaml", {"spark.warehouse": warehouse})
    ctx = StageContext(spark, cfg, warehouse, "halving-trec")
    STAGES["ingest"](ctx)
    return cfg, pack_serps(ctx.serps(("train",)), max_rank=cfg.fit.max_rank, held_out=ctx.serps(("valid",)))


@pytest.fixture(scope="module")
def make_run(spark):
    """conf/local.yaml's synthetic log (the one `make run` ingests), packed as its fit stage packs it."""
    cfg = load_config(PROJECT_ROOT / "conf" / "local.yaml")
    serps = assign_splits(synthetic.generate(spark, cfg.ingest)[0], cfg.ingest.split)
    return cfg, pack_serps(serps.where("split = 'train'"), max_rank=cfg.fit.max_rank,
                           held_out=serps.where("split = 'valid'"))


@pytest.mark.slow
@pytest.mark.parametrize("log,choices", [("trec", TREC_CHOICE), ("make_run", MAKE_RUN_CHOICE)])
def test_halving_keeps_the_full_selections_choice(request, log, choices):
    cfg, packed = request.getfixturevalue(log)
    got, dropped = {}, {}
    for name in choices:
        model = get_model(name)
        fitted = fit(packed, model, EMOptions.from_config(cfg.fit, model, packed.max_rank))
        got[name] = f"{fitted.selection['chosen_k']}/{fitted.selection['chosen_seen_means']}"
        dropped[name] = sum("dropped_at" in e for e in fitted.selection["grid"])
    assert got == choices
    assert all(n >= 5 for n in dropped.values()), dropped   # halving did its work: of 18 candidates
