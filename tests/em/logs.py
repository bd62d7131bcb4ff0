"""Simulated logs and hand-built fits shared by the EM, fitted-model and prior tests: a helper module, not a test
module. The tests under tests/em, tests/fitted and tests/models take its builders (`Log`, `hand_fitted`,
`sparse_log`) as fixtures from their conftest and import only its constants and plain functions; a module with no
conftest of its own to ask (tests/test_progress.py, tests/reliability/test_task_retries.py, tests/learned/sim.py)
imports it."""

from __future__ import annotations

from datetime import date

import numpy as np
from pyspark.sql import types as T

from clickeval_spark.fitted import FittedModel

from tests.models.numpy_em import gather, simulate


SERPS_SCHEMA = T.StructType([
    T.StructField("dataset", T.StringType(), False),
    T.StructField("split", T.StringType(), False),
    T.StructField("session_id", T.StringType(), False),
    T.StructField("serp_id", T.StringType(), False),
    T.StructField("serp_pos", T.IntegerType(), False),
    T.StructField("query_id", T.StringType(), False),
    T.StructField("doc_ids", T.ArrayType(T.StringType(), False), False),
    T.StructField("vtypes", T.ArrayType(T.StringType(), True), True),
    T.StructField("clicks", T.ArrayType(T.IntegerType(), False), False),
    T.StructField("log_date", T.DateType(), True),
])

QD_KEYS = [T.StructField("query_id", T.StringType(), True), T.StructField("doc_id", T.StringType(), True)]


# ---------------------------------------------------------------------------
# simulated logs
# ---------------------------------------------------------------------------

class Log:
    """A simulated log: Spark rows plus the padded numpy view of its first M ranks."""

    def __init__(self, model, *, n_serps, M, seed, n_queries=30, pool=14, extra=2, qd_true=None,
                 g_true=None):
        rng = np.random.default_rng(seed)
        L = M + extra                                   # lists up to M+extra: ranks > M are ignored
        assert pool >= L
        self.M, self.pool, self.n_queries = M, pool, n_queries
        self.n_pairs = n_queries * pool
        lens = rng.integers(1, L + 1, n_serps)
        q = rng.integers(0, n_queries, n_serps)
        docs = np.stack([rng.permutation(pool)[:L] for _ in range(n_serps)])
        mask_full = np.arange(L)[None, :] < lens[:, None]
        self.mask = mask_full[:, :M]
        self.pair = q[:, None] * pool + docs            # (B, L) pair index
        self.qd_index = self.pair[:, :M]
        self.qd_true = qd_true or {p: rng.uniform(0.05, 0.95, self.n_pairs) for p in model.qd_params}
        self.g_true = g_true or {k: rng.uniform(0.2, 0.9, s) for k, s in model.global_shapes(M).items()}
        self.clicks = simulate(model, gather(self.qd_true, self.qd_index, self.mask), self.g_true,
                               self.mask, rng)
        tail = ((rng.random((n_serps, extra)) < 0.5) & mask_full[:, M:]).astype(np.int8)
        clicks_full = np.concatenate([self.clicks, tail], axis=1)
        self.rows = [
            ("sim", "train", f"s{i // 3}", f"serp{i}", i % 3 + 1, f"q{q[i]}",
             [self.doc_name(docs[i, r]) for r in range(lens[i])],
             None if i % 5 == 0 else ["web"] * int(lens[i]), [int(c) for c in clicks_full[i, :lens[i]]],
             None if i % 7 == 0 else date(2024, 1, 1 + i % 28))
            for i in range(n_serps)
        ]

    @staticmethod
    def doc_name(j):
        return f"d{j}"

    def pair_key(self, idx):
        return f"q{idx // self.pool}", self.doc_name(idx % self.pool)

    def df(self, spark):
        return spark.createDataFrame(self.rows, SERPS_SCHEMA)

    def seen_pairs(self):
        idx = self.qd_index[self.mask]
        counts = np.bincount(idx, minlength=self.n_pairs)
        return np.nonzero(counts)[0], counts


def qd_frame(spark, log, params, values, counts, pairs):
    schema = T.StructType(QD_KEYS + [T.StructField(p, T.DoubleType(), True) for p in params]
                          + [T.StructField("n_obs", T.DoubleType(), True)])
    rows = [(*log.pair_key(i), *[float(values[p][i]) for p in params], float(counts[i])) for i in pairs]
    return spark.createDataFrame(rows, schema)


def hand_fitted(spark, model, log, seed, prior_value=0.37):
    """A FittedModel with random parameters for half of the pairs; the rest are unseen."""
    rng = np.random.default_rng(seed)
    params = list(model.qd_params)
    values = {p: rng.uniform(0.05, 0.95, log.n_pairs) for p in params}
    known = np.arange(log.n_pairs)[rng.random(log.n_pairs) < 0.5]
    counts = rng.integers(1, 50, log.n_pairs)
    qd = (qd_frame(spark, log, params, values, counts, known) if params
          else spark.createDataFrame([], "query_id string, doc_id string, n_obs double"))
    glob = {k: rng.uniform(0.2, 0.9, s) for k, s in model.global_shapes(log.M).items()}
    prior = {p: prior_value + 0.1 * i for i, p in enumerate(params)}
    # the numpy view: every pair's value, unseen pairs at the prior
    full = {p: np.where(np.isin(np.arange(log.n_pairs), known), values[p], prior[p]) for p in params}
    return FittedModel(model=model, max_rank=log.M, qd=qd, glob=glob, prior=prior), full, known


def sorted_rows(df):
    return df.orderBy("serp_id", "sample_idx")


def fit_values(f):
    """Everything a fit returns, as exact values (arrays as bytes)."""
    return (sorted(tuple(r) for r in f.qd.collect()), {k: v.tobytes() for k, v in f.glob.items()}, f.prior,
            f.history and [h[:2] for h in f.history], f.log_posterior, f.valid_ll, f.selection,
            f.held_out_ppl and [a.tobytes() for a in f.held_out_ppl])


# q1/d1 shown 3 times, clicked twice; q1/d2 shown once, never clicked; q2/d3 shown twice, clicked once
DCTR_ROWS = [
    ("t", "train", "s1", "r1", 1, "q1", ["d1", "d2"], None, [1, 0], None),
    ("t", "train", "s2", "r2", 1, "q1", ["d1"], None, [1], None),
    ("t", "train", "s3", "r3", 1, "q1", ["d1"], None, [0], None),
    ("t", "train", "s4", "r4", 1, "q2", ["d3", "d3"], None, [1, 0], None),
]


def sparse_log(model, seed=4):
    """Many queries, few SERPs each: most pairs are seen a handful of times (where priors matter)."""
    return Log(model, n_serps=1500, M=6, seed=seed, n_queries=150, pool=9, extra=0)


def split_log(spark, log, held):
    """(training SERPs, held-out SERPs) of ``log`` as DataFrames; ``held``: a bool per row."""
    train = [r for r, h in zip(log.rows, held) if not h]
    valid = [r for r, h in zip(log.rows, held) if h]
    return spark.createDataFrame(train, SERPS_SCHEMA), spark.createDataFrame(valid, SERPS_SCHEMA)
