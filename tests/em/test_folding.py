"""Identical SERPs folded into weighted rows (`codec.fold_rows`) give the same EM pass as the SERPs themselves.

The oracle is the unfolded block: every model's `em_block` over a log full of repeats,
row by row, against the same log folded, for several passes with the beta prior's
M-step, held-out scoring and the perplexity terms.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from pyspark.sql import functions as F

from clickeval_spark.models import MODELS, get_model
from clickeval_spark.em.codec import decode_data, decode_keys, fold_rows, pack_block
from clickeval_spark.em.passes import PassMode, PassPlan
from clickeval_spark.em.step import BlockArrays, em_block, global_params
from clickeval_spark.em.sums import split_stats
from clickeval_spark.models.priors import model_prior, pooled_mean
from clickeval_spark.em.blocks import pack_serps
from tests.models.numpy_em import simulate

M, B, N_TRAIN, LISTS = 6, 4000, 3000, 25


def test_fold_rows_by_hand():
    clicks = np.array([[1, 0], [0, 0], [1, 0], [1, 0], [0, 1]], dtype=np.int8)
    pair = np.array([[0, 1], [0, 1], [0, 1], [2, 3], [0, 1]], dtype=np.int32)
    c, p, w = fold_rows(clicks, pair)
    got = sorted(zip(map(tuple, p.tolist()), map(tuple, c.tolist()), w.tolist()))
    assert got == [((0, 1), (0, 0), 1), ((0, 1), (0, 1), 1), ((0, 1), (1, 0), 2), ((2, 3), (1, 0), 1)]
    assert w.dtype == np.int32 and c.dtype == np.int8 and p.dtype == np.int32
    # a fixed order, whatever order the SERPs came in
    c2, p2, w2 = fold_rows(clicks[::-1], pair[::-1])
    assert (c2 == c).all() and (p2 == p).all() and (w2 == w).all()


def _repeating_log(model, seed: int):
    """B SERPs drawn from LISTS doc lists of uneven length: many (list, clicks) repeats."""
    rng = np.random.default_rng(seed)
    lens = rng.integers(2, M + 1, LISTS)
    templates = np.where(np.arange(M)[None, :] < lens[:, None],
                         rng.integers(0, 60, (LISTS, M)), -1).astype(np.int32)
    pair = templates[rng.integers(0, LISTS, B)]
    mask = pair >= 0
    qd_true = {p: rng.uniform(0.1, 0.9, 60)[np.where(mask, pair, 0)] for p in model.qd_params}
    g_true = {k: rng.uniform(0.2, 0.9, s) for k, s in model.global_shapes(M).items()}
    return simulate(model, qd_true, g_true, mask, rng), pair


def _passes(model, clicks, pair, n_train, weight, passes=4):
    prior = model_prior(model, M, "beta", 3.0)
    k_qd = np.array([prior.qd[q].k for q in model.qd_params])
    state, update, g, vecs = None, None, model.init_global(M), []
    block = BlockArrays.of(model, clicks, pair, 60, n_train, weight)
    for _ in range(passes):
        state, vec = em_block(model, block, state, PassPlan(PassMode.STEP, g, update, ppl_eps=1e-6), slice_rows=900)
        sums = split_stats(model, M, vec)
        g, _ = global_params(model, M, sums, g, prior.glob)
        update = (k_qd, np.array([pooled_mean(*sums[f"pool_{q}"]) for q in model.qd_params]))
        vecs.append(vec)
    return state, g, vecs


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_folded_block_gives_the_pass_of_its_serps(name):
    model = get_model(name)
    clicks, pair = _repeating_log(model, seed=len(name))
    train, held = fold_rows(clicks[:N_TRAIN], pair[:N_TRAIN]), fold_rows(clicks[N_TRAIN:], pair[N_TRAIN:])
    fc, fp, fw = (np.concatenate([t, h]) for t, h in zip(train, held))
    assert len(fw) < B / 3 and fw[:len(train[2])].sum() == N_TRAIN and fw.sum() == B   # the fold bites

    state, g, vecs = _passes(model, clicks, pair, N_TRAIN, None)
    f_state, f_g, f_vecs = _passes(model, fc, fp, len(train[2]), fw)
    np.testing.assert_allclose(f_state, state, rtol=1e-11, atol=1e-12)
    for key in g:
        np.testing.assert_allclose(f_g[key], g[key], rtol=1e-11, atol=1e-12, err_msg=key)
    for vec, f_vec in zip(vecs, f_vecs):
        sums, f_sums = split_stats(model, M, vec), split_stats(model, M, f_vec)
        assert f_sums["n"][0] == N_TRAIN and f_sums["n_valid"][0] == (pair[N_TRAIN:] >= 0).sum()
        for key in sums:  # ll, ll_valid, ppl terms, pooled and global sums
            np.testing.assert_allclose(f_sums[key], sums[key], rtol=1e-11, atol=1e-9, err_msg=key)


def test_fold_rows_adds_up_weighted_rows():
    clicks = np.array([[1, 0], [0, 0], [1, 0]], dtype=np.int8)
    pair = np.array([[0, 1], [0, 1], [0, 1]], dtype=np.int32)
    c, p, w = fold_rows(clicks, pair, np.array([5, 2, 3]))
    assert c.tolist() == [[0, 0], [1, 0]] and p.tolist() == [[0, 1], [0, 1]] and w.tolist() == [2, 8]


def _rows(query_ids, doc_ids, clicks, held_out, weight=None) -> pa.Table:
    return pa.table({"query_id": pa.array(query_ids, pa.string()), "doc_ids": pa.array(doc_ids, pa.list_(pa.string())),
                     "clicks": pa.array(clicks, pa.list_(pa.int32())), "held_out": pa.array(held_out, pa.bool_()),
                     "weight": pa.array(weight or [1] * len(query_ids), pa.int64())})


def test_pack_block_folds_train_and_held_out_apart():
    # rows 1, 2, 4 are one training SERP four times (row 2 already stands for two);
    # row 3 is the same SERP held out: it stays its own row
    rows = _rows(["q"] * 5, [["a", "b"], ["a", "b"], ["a", "b"], ["a", "b"], ["b", "a"]],
                 [[1, 0], [1, 0], [1, 0], [1, 0], [0, 0]], [False, False, True, False, False], [1, 2, 1, 1, 1])
    data, keys, counts = pack_block(rows, 3)
    clicks, pair, weight, n_pairs, n_train = decode_data(data)
    # 5 training SERPs, 1 held out, whose two positions are both of pairs the training rows show
    assert counts == (5, 1, 2, 2)
    assert (n_pairs, n_train) == (2, 2)
    assert pair.tolist() == [[0, 1, -1], [1, 0, -1], [0, 1, -1]]
    assert clicks.tolist() == [[1, 0, 0], [0, 0, 0], [1, 0, 0]]
    assert weight.tolist() == [4, 1, 1]
    k = decode_keys(keys)
    assert k.column("doc_id").to_pylist() == ["a", "b"] and k.column("n_obs").to_pylist() == [5, 5]


def test_pack_block_numbers_pairs_in_python_string_order_whatever_the_row_order():
    # upper case, accents and a prefix: the (query_id, doc_id) order is Python's sorted() order
    queries = ["zq", "Zq", "éq", "zq", "z"]
    docs = [["é", "e"], ["b", "B"], ["a"], ["E", "é"], ["ab", "a"]]
    rows = _rows(queries, docs, [[0, 1], [1, 1], [0], [0, 0], [1, 0]], [False, False, True, False, False])
    expected = sorted({(q, d) for q, ds in zip(queries, docs) for d in ds})
    for order in ([0, 1, 2, 3, 4], [4, 3, 2, 1, 0], [2, 0, 4, 1, 3]):
        data, keys, counts = pack_block(rows.take(order), 2)
        k = decode_keys(keys)
        assert counts == (4, 1, 1, 0)   # held out: ("éq", "a") alone, which no training row shows
        assert list(zip(k.column("query_id").to_pylist(), k.column("doc_id").to_pylist())) == expected
        # held-out impressions ("éq", "a") are indexed but not counted
        assert dict(zip(expected, k.column("n_obs").to_pylist()))[("éq", "a")] == 0
        if order == [0, 1, 2, 3, 4]:
            first = data
        assert data == first

def test_packing_with_or_without_spark_folding_gives_the_same_blocks(spark, make_log):
    """`pack_log(fold=...)`: Spark's fold before the shuffle is an optimisation only; every block's data and keys
    are the same bytes (repeated SERPs: fixed lists, so many fold)."""
    model = get_model("ubm")
    log = make_log(model, n_serps=600, M=2, seed=5, n_queries=12, pool=3, extra=0)
    serps = log.df(spark)
    held = serps.where(F.col("serp_pos") == 2)
    train = serps.where(F.col("serp_pos") != 2)
    got = {}
    for fold in (True, False):
        packed = pack_serps(train, max_rank=2, held_out=held, fold=fold)
        try:
            got[fold] = sorted((r["block"], bytes(r["data"]), bytes(r["keys"])) for r in packed.blocks.collect())
        finally:
            packed.unpersist()
    assert got[True] == got[False]
    assert len(got[True]) == 4
    weights = [decode_data(data)[2] for _, data, _ in got[True]]
    assert sum(int(w.sum()) for w in weights) == 600 and max(int(w.max()) for w in weights) > 1   # folded rows
