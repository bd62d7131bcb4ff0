"""Simulated logs for the learned model's tests: a helper module, not a test module.

`simulate(rule, ...)` draws SERPs whose clicks follow ``rule(attr, exam, n_above)`` -> P(click | clicks above),
with attractiveness per (query, doc) and examination per rank; the sessions are split train / test by the
session index (1 SERP per session: the bootstrap's sessions are the SERPs)."""

from __future__ import annotations

import numpy as np

from tests.em.logs import SERPS_SCHEMA


def rank_only(attr, exam, n_above):
    """Clicks independent of the (query, doc) and of each other: P = the rank's rate."""
    return exam


def second_click(attr, exam, n_above):
    """A first click is attractiveness x examination; after exactly one click the next is much likelier
    (0.5 + a / 3, whatever the rank), after two almost none follow: a dependence on the count of clicks
    above that none of the classic models has (UBM sees the last click's rank only, the cascades' state
    has no count)."""
    return np.where(n_above == 0, attr * exam, np.where(n_above == 1, 0.5 + attr / 3, 0.02))


def simulate(rule, *, n_serps: int, seed: int, M: int = 10, n_queries: int = 40, pool: int = 15,
             test_fraction: float = 0.3):
    """Spark rows (SERPS_SCHEMA) of a simulated log: split 'train' or 'test'."""
    rng = np.random.default_rng(seed)
    attr = rng.uniform(0.05, 0.95, (n_queries, pool))
    exam = 0.9 / np.arange(1, M + 1) ** 0.7
    # Zipf-like query frequencies: head queries with many impressions, a tail with few
    qp = 1.0 / np.arange(1, n_queries + 1)
    q = rng.choice(n_queries, size=n_serps, p=qp / qp.sum())
    rows = []
    for i in range(n_serps):
        docs = rng.permutation(pool)[:M]
        clicks = np.zeros(M, dtype=int)
        for r in range(M):
            p = rule(attr[q[i], docs[r]], exam[r], clicks[:r].sum())
            clicks[r] = int(rng.random() < p)
        split = "test" if rng.random() < test_fraction else "train"
        rows.append(("sim", split, f"s{i}", f"serp{i}", 1, f"q{q[i]}", [f"d{d}" for d in docs], None,
                     [int(c) for c in clicks], None))
    return rows


def serps_frame(spark, rows):
    return spark.createDataFrame(rows, SERPS_SCHEMA)
