"""The resident EM engine (one barrier stage for every pass) against the stage engine (one Spark job per pass)."""

from __future__ import annotations

import logging
import socket

import numpy as np
import pytest
from pyspark.sql import functions as F

from clickeval_spark.models import get_model
from clickeval_spark.fitted import attach
from clickeval_spark.em import blocks, codec, driver, passes, resident
from clickeval_spark.em.stage_passes import StagePasses
from tests.em.logs import fit_values


def _grouped_log(spark, make_log, model, M):
    """Two logs side by side, each with held-out SERPs (the surrogate stage's shape)."""
    cut = lambda df: attach.truncate_serps(df, M, keep=("serp_id",))  # noqa: E731
    prep = None
    for g, (n, seed) in enumerate(((240, 41), (90, 42))):
        log, held = make_log(model, n_serps=n, M=M, seed=seed), make_log(model, n_serps=40, M=M, seed=seed + 10)
        part = (cut(log.df(spark)).withColumn("held_out", F.lit(False))
                .unionByName(cut(held.df(spark)).withColumn("held_out", F.lit(True))).withColumn("group", F.lit(g)))
        prep = part if prep is None else prep.unionByName(part)
    return blocks.pack_log(prep, M)


@pytest.mark.parametrize("name", ["ubm", "dbn"])
@pytest.mark.slow
def test_resident_fit_is_bit_identical_to_the_stage_engine(spark, make_log, name, caplog):
    """k: auto (a candidate per grid strength, picked on held-out SERPs), tol, pooled priors: every value of the
    fit, the history's LLs and the chosen strength equal the stage engine's bit for bit."""
    model, M = get_model(name), 5
    log, valid = make_log(model, n_serps=400, M=M, seed=51), make_log(model, n_serps=80, M=M, seed=52)
    packed = blocks.pack_serps(log.df(spark), max_rank=M, held_out=valid.df(spark))
    options = dict(iterations=8, tol=1e-3, max_rank=M, k_grid=(0.5, 4.0, 32.0))
    try:
        stages = driver.fit(packed, model, engine="stages", **options)
        with caplog.at_level(logging.DEBUG, logger="clickeval_spark.em.driver"):   # the pass lines too
            res = driver.fit(packed, model, engine="resident", **options)
    finally:
        packed.unpersist()
    assert "resident EM stage: 2 tasks up" in caplog.text   # local[2]: one task per slot
    assert "fitting again" not in caplog.text
    assert res.selection is not None and len(res.history) > 2
    assert fit_values(res) == fit_values(stages)


@pytest.mark.slow
def test_resident_groups_fit_bit_identical_with_held_out_perplexity(spark, make_log):
    """Several logs in one pack, held-out SERPs only scored, the final pass's perplexity terms (the surrogate
    stage's call): each group's fit equals the stage engine's."""
    model, M = get_model("dcm"), 5
    packed = _grouped_log(spark, make_log, model, M)
    options = dict(iterations=4, tol=None, select_on_held_out=False, ppl_eps=1e-6)
    try:
        stages = driver.fit_groups(packed, model, engine="stages", **options)
        res = driver.fit_groups(packed, model, engine="resident", **options)
    finally:
        packed.unpersist()
    assert [fit_values(f) for f in res] == [fit_values(f) for f in stages]
    assert fit_values(res[0])[1] != fit_values(res[1])[1]   # two logs, two fits


@pytest.mark.parametrize("loss", ["job cancelled", "connection broken"])
@pytest.mark.slow
def test_a_lost_resident_stage_fits_again_with_stages(spark, make_log, monkeypatch, caplog, loss):
    """After three passes the barrier job is cancelled (as a lost executor ends it), or a task's connection
    breaks: the driver notices, cancels what is left and the fit starts again with one Spark job per pass,
    with the same result."""
    model, M = get_model("pbm"), 5
    log = make_log(model, n_serps=300, M=M, seed=61)
    packed = blocks.pack_serps(log.df(spark), max_rank=M)
    real_run, calls = resident.ResidentPasses.run, []

    def run_then_lose(self, plans):
        calls.append(1)
        if len(calls) == 4 and loss == "job cancelled":   # the job ends (its Python workers may live on a while)
            self._sc.cancelJobGroup(self._group)
            self._thread.join(60)
        elif len(calls) == 4:
            self._conns[0][0].shutdown(socket.SHUT_RDWR)
        return real_run(self, plans)

    options = dict(iterations=6, tol=None, max_rank=M)
    try:
        expected = driver.fit(packed, model, engine="stages", **options)
        monkeypatch.setattr(resident.ResidentPasses, "run", run_then_lose)
        with caplog.at_level(logging.WARNING, logger="clickeval_spark.em.driver"):
            got = driver.fit(packed, model, engine="resident", **options)
    finally:
        packed.unpersist()
    assert len(calls) == 4
    assert "the resident EM stage was lost" in caplog.text and "fitting again with one Spark stage" in caplog.text
    assert fit_values(got) == fit_values(expected)


@pytest.mark.slow
def test_the_driver_ignores_a_connection_without_the_token(spark, make_log, monkeypatch):
    """A stranger connecting to the driver's port while the tasks join is dropped; the fit goes on."""
    model, M = get_model("pbm"), 4
    log = make_log(model, n_serps=120, M=M, seed=71)
    packed = blocks.pack_serps(log.df(spark), max_rank=M)
    real_accept, strangers = resident.ResidentPasses._accept, []

    def accept_after_a_stranger(self, token, timeout):
        stranger = socket.create_connection(self._server.getsockname()[:2])
        resident._send(stranger, b"x" * (resident._TOKEN_BYTES + 40))
        strangers.append(stranger)
        real_accept(self, token, timeout)
        assert stranger.recv(1) == b""   # closed by the driver

    monkeypatch.setattr(resident.ResidentPasses, "_accept", accept_after_a_stranger)
    try:
        got = driver.fit(packed, model, engine="resident", iterations=3, tol=None, max_rank=M)
        expected = driver.fit(packed, model, engine="stages", iterations=3, tol=None, max_rank=M)
    finally:
        packed.unpersist()
        for s in strangers:
            s.close()
    assert len(strangers) == 1
    assert fit_values(got) == fit_values(expected)


def test_auto_engine_choice(spark, make_log, monkeypatch):
    """auto: resident for an iterative model when the cluster has slots; stages for a counting model or
    with no slot (dynamic allocation); an explicit resident request without a slot is an error."""
    log = make_log(get_model("pbm"), n_serps=60, M=3, seed=81)
    packed = blocks.pack_serps(log.df(spark), max_rank=3)
    try:
        assert blocks.cluster_slots(packed.blocks) == 2
        assert driver.resident_tasks(packed, get_model("pbm"), "auto") == 2
        assert driver.resident_tasks(packed, get_model("dctr"), "auto") == 0
        assert driver.resident_tasks(packed, get_model("pbm"), "stages") == 0
        monkeypatch.setattr(driver, "cluster_slots", lambda df: 0)
        assert driver.resident_tasks(packed, get_model("pbm"), "auto") == 0
        with pytest.raises(ValueError, match="no slot for a barrier stage"):
            driver.resident_tasks(packed, get_model("pbm"), "resident")
        with pytest.raises(ValueError, match="engine must be one of"):
            driver.fit(packed, get_model("pbm"), engine="fast")
    finally:
        packed.unpersist()


def test_pass_plans_cross_the_socket_as_exact_json():
    """The driver's plans reach the tasks as JSON (data, not pickle) and come back bit for bit."""
    rng = np.random.default_rng(5)
    plans = [passes.PassPlan("step", {"gamma": rng.random((3, 4)) ** 7, "lambda": np.array(-0.0)},
                             (np.array([0.5, 4.0]), np.array([1 / 3, 2 ** -1074])), 1, 1e-6),
             passes.PassPlan("hold", {"gamma": np.full((3, 4), np.nextafter(0.5, 1))}, None)]
    wire = resident.encode_plans(plans)
    back = resident.decode_plans(bytearray(wire))
    assert b"pickle" not in wire and wire.startswith(b'{"command": "pass"')
    assert [(p.mode, p.group, p.ppl_eps) for p in back] == [("step", 1, 1e-6), ("hold", 0, None)]
    for p, q in zip(plans, back):
        assert {k: (v.shape, v.tobytes()) for k, v in p.g.items()} == {k: (v.shape, v.tobytes()) for k, v in q.g.items()}
    assert [a.tobytes() for a in back[0].update] == [a.tobytes() for a in plans[0].update] and back[1].update is None
    assert resident.decode_plans(resident.encode_plans(None)) is None


def test_end_returns_no_state_and_frees_the_stage(spark, make_log, monkeypatch):
    """`end` (a selection sample's passes): the barrier job completes, its rows carry no state or sums (18
    candidates' states of a DBN block are hundreds of MB: a 1g executor ran out of heap taking them in), and
    the checkpointed rows are released; `finish` after the same pass returns every block's values, and is
    refused on a stage of shared candidates (each task holds every block: no one state per block)."""
    model, M = get_model("dbn"), 4
    log = make_log(model, n_serps=200, M=M, seed=83)
    packed = blocks.pack_serps(log.df(spark), max_rank=M)
    released = []
    real_release = resident.release

    def spy(df):
        released.append(sorted((r["block"], r["state"], r["stats"]) for r in df.collect()))
        real_release(df)

    monkeypatch.setattr(resident, "release", spy)
    plan = passes.PassPlan("step", {k: np.asarray(v, dtype=np.float64) for k, v in model.init_global(M).items()}, None)
    try:
        for how in ("end", "finish", "shared"):
            engine = resident.ResidentPasses(packed.blocks, model, M, packed.first_blocks, 2, shared=how == "shared")
            try:
                engine.run([plan, plan])
                if how == "shared":
                    with pytest.raises(ValueError, match="shared candidates"):
                        engine.finish(((0, 2),))
                    assert engine.end() is None and not engine._thread.is_alive()
                elif how == "end":
                    assert engine.end() is None and not engine._thread.is_alive() and engine._final is None
                    [rows] = released
                    assert [b for b, _, _ in rows] == list(range(packed.n_blocks))
                    assert all(state is None and stats is None for _, state, stats in rows)
                else:
                    states = {r["block"]: r["state"] for r in engine.finish(((0, 2),)).collect()}
                    assert sorted(states) == list(range(packed.n_blocks))
                    assert all(s is not None and len(s) > 0 for s in states.values())
            finally:
                engine.close()
    finally:
        packed.unpersist()


def test_finish_returns_only_the_chosen_candidates_values(spark, make_log):
    """`finish` of either engine: per block, exactly the values (row 0) of the chosen slot in the full state the
    stage engine's last pass left (decoded here with `decode_state`), P x n_pairs doubles; two groups, each
    with its own chosen slot, and candidates whose values differ (their own qd M-steps)."""
    model, M = get_model("dbn"), 4
    packed = _grouped_log(spark, make_log, model, M)
    P = len(model.qd_params)
    g = {k: np.asarray(v, dtype=np.float64) for k, v in model.init_global(M).items()}
    first = [passes.PassPlan("step", g, None, group) for group in (0, 0, 1, 1)]
    second = [passes.PassPlan("step", g, (np.full(P, k), np.full(P, m)), group)
              for k, m, group in ((1.0, 0.5, 0), (8.0, 0.2, 0), (2.0, 0.3, 1), (0.5, 0.7, 1))]
    chosen = ((1, 2), (0, 2))
    try:
        stage = StagePasses(packed, model)
        stage.run(first)
        stage.run(second)
        full = {r["block"]: r["state"] for r in stage._blocks.select("block", "state").collect()}
        keys = {r["block"]: blocks.decode_keys(r["keys"]).num_rows for r in packed.blocks.select("block", "keys").collect()}
        want = {b: codec.decode_state(full[b], 2, P, keys[b])[chosen[codec.group_of(b, packed.first_blocks)][0], 0]
                for b in full}
        assert any(not np.array_equal(codec.decode_state(full[b], 2, P, keys[b])[0, 0],
                                      codec.decode_state(full[b], 2, P, keys[b])[1, 0]) for b in full)
        finished = stage.finish(chosen).collect()
        assert all(r["data"] == b"" for r in finished)   # the packed log keeps the data: none crosses again
        got_stage = {r["block"]: r["state"] for r in finished}
        stage.close()
        engine = resident.ResidentPasses(packed.blocks, model, M, packed.first_blocks, 2)
        try:
            engine.run(first)
            engine.run(second)
            got_resident = {r["block"]: r["state"] for r in engine.finish(chosen).collect()}
        finally:
            engine.close()
    finally:
        packed.unpersist()
    assert sorted(want) == sorted(got_stage) == sorted(got_resident) == list(range(packed.n_blocks))
    for b, values in want.items():
        assert len(got_stage[b]) == len(got_resident[b]) == P * keys[b] * 8
        assert np.frombuffer(got_stage[b]).reshape(P, keys[b]).tobytes() == values.tobytes()
        assert got_resident[b] == got_stage[b]
