"""Benchmark of `spark_em.attach_qd`: per-query maps vs the impression join.

Builds two synthetic logs in Spark (spark.range + SQL expressions, nothing
generated on the driver) and times EM passes of PBM and DBN with three
attach variants, in the same local session:

  maps    every query through one map<doc_id, params> joined per SERP (the
          attach before MAP_MAX_DOCS, copied here as `attach_maps`; a lookup is
          a linear scan of the map, done once per rank and parameter)
  join    every query through explode -> join on (query_id, doc_id) -> regroup
  hybrid  the current `attach_qd`: maps for queries with <= MAP_MAX_DOCS pairs,
          the join for larger ones
  maponly the current `attach_qd` with an infinite MAP_MAX_DOCS (its map route,
          which looks a rank's struct up once for all parameters, for every query)

Logs:

  tiangong  --serps SERPs, 10 results, --queries queries drawn log-uniformly
            (P(q) ~ 1 / (q + 1), a Zipf law with s = 1), every query a pool of
            15 docs; a SERP shows 10 consecutive pool docs from a hashed offset
  head      the same, but a --head-share of the SERPs go to --head-queries
            queries with a pool of --head-docs docs each (all of them seen)

Clicks are a hashed coin with P = attractiveness(query, doc) * 1 / rank^0.7.

Timing: per (log, model), `fit`'s first EM pass (no qd table yet, so no attach)
runs once, untimed; then every variant runs --iterations further passes
(`spark_em._em_pass`, exactly what `fit` runs) from that same state, and
s/iteration is their mean wall time. The variants take turns pass by pass, the
order rotating every round. All variants must print the same LL.

--sweep DOCS,... adds logs where every query has the same pool size (and so the
same number of pairs in the qd table), to find where the join overtakes the
maps; that is how MAP_MAX_DOCS was chosen.

    .venv/bin/python benchmarks/attach_bench.py                      # both logs, pbm + dbn (~12 min
                                                                     # on 2 shared cores: split it with
                                                                     # --logs / --models to keep runs short)
    .venv/bin/python benchmarks/attach_bench.py --logs head --models dbn --variants maps,hybrid
    .venv/bin/python benchmarks/attach_bench.py --logs none --sweep 100,300,1000 --variants maponly,join
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
from pyspark.sql import DataFrame, SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

from clickeval_spark.models import get_model, spark_em  # noqa: E402
from clickeval_spark.models.base import INIT_VALUE  # noqa: E402
from clickeval_spark.session import build_session  # noqa: E402

M = 10


def _uniform(*cols) -> F.Column:
    return F.xxhash64(*cols).bitwiseAND(F.lit((1 << 53) - 1)).cast("double") / float(1 << 53)


def make_log(spark: SparkSession, *, n_serps: int, n_queries: int, pool: int, head_queries: int = 0,
             head_docs: int = 0, head_share: float = 0.0, uniform_queries: bool = False,
             seed: int = 1) -> DataFrame:
    """query_id, serp_id, doc_ids (10), clicks; see the module docstring."""
    ids = spark.range(n_serps)
    u_head = _uniform(F.col("id"), F.lit(seed), F.lit(1))
    u_q = _uniform(F.col("id"), F.lit(seed), F.lit(2))
    if uniform_queries:
        tail_q = F.pmod(F.xxhash64(F.col("id"), F.lit(seed), F.lit(3)), F.lit(n_queries))
    else:  # log-uniform: floor((Q + 1)^u) - 1 in [0, Q - 1], P(q) ~ log((q + 2) / (q + 1))
        tail_q = F.least(F.floor(F.exp(u_q * F.log(F.lit(float(n_queries + 1))))) - 1, F.lit(n_queries - 1))
    is_head = u_head < F.lit(float(head_share)) if head_queries else F.lit(False)
    head_q = F.pmod(F.xxhash64(F.col("id"), F.lit(seed), F.lit(4)), F.lit(max(head_queries, 1)))
    df = ids.select(
        "id",
        is_head.alias("is_head"),
        F.when(is_head, F.concat(F.lit("h"), head_q.cast("string")))
        .otherwise(F.concat(F.lit("q"), tail_q.cast("long").cast("string"))).alias("query_id"),
    )
    n_pool = F.when(F.col("is_head"), F.lit(int(head_docs or pool))).otherwise(F.lit(int(pool)))
    start = F.pmod(F.xxhash64(F.col("id"), F.lit(seed), F.lit(5)), n_pool)
    df = df.select("id", "query_id", start.alias("start"), n_pool.alias("n_pool"))
    docs = F.transform(F.sequence(F.lit(0), F.lit(M - 1)),
                       lambda r: F.concat(F.lit("d"), F.pmod(F.col("start") + r, F.col("n_pool")).cast("string")))
    df = df.select("id", "query_id", docs.alias("doc_ids"))

    def click(d, r):
        attr = 0.1 + 0.8 * _uniform(F.col("query_id"), d, F.lit(seed), F.lit(6))
        exam = F.pow(r.cast("double") + 1.0, F.lit(-0.7))
        return (_uniform(F.col("id"), r, F.lit(seed), F.lit(7)) < attr * exam).cast("int")

    return df.select(
        F.concat(F.lit("s"), F.col("id").cast("string")).alias("serp_id"), "query_id", "doc_ids",
        F.transform(F.col("doc_ids"), click).alias("clicks"),
    )


def log_sizes(serps: DataFrame) -> dict:
    """SERPs, queries, (query, doc) pairs, docs of the largest query: a few aggregates, computed in Spark."""
    pairs = serps.select("query_id", F.explode("doc_ids").alias("doc_id")).distinct()
    per_q = pairs.groupBy("query_id").count()
    serps_per_q = serps.groupBy("query_id").count()
    r = per_q.agg(F.count(F.lit(1)).alias("q"), F.sum("count").alias("pairs"), F.max("count").alias("max_docs"),
                  F.sum(F.when(F.col("count") > spark_em.MAP_MAX_DOCS, 1).otherwise(0)).alias("big_q")).first()
    s = serps_per_q.agg(F.max("count").alias("max_serps")).first()
    return {"serps": serps.count(), "queries": r["q"], "pairs": r["pairs"], "max_docs_per_query": r["max_docs"],
            "queries_over_threshold": r["big_q"], "max_serps_per_query": s["max_serps"]}


def _lookup(p: str, default: float):
    def fn(d: F.Column) -> F.Column:
        return F.coalesce(F.try_element_at(F.col("_qd_map"), d).getField(p), F.lit(float(default)))

    return fn


def attach_maps(df: DataFrame, qd: DataFrame, params, prior: dict[str, float]) -> DataFrame:
    """The attach before this change (git 13b2179), verbatim: a map per query for every query."""
    maps = (
        qd.groupBy("query_id")
        .agg(F.map_from_entries(F.collect_list(
            F.struct(F.col("doc_id"), F.struct(*[F.col(p).alias(p) for p in params]))
        )).alias("_qd_map"))
        .select("query_id", "_qd_map")
    )
    joined = df.join(maps.hint("merge"), on="query_id", how="left")
    arrays = [F.transform(F.col("doc_ids"), _lookup(p, prior[p])).alias(spark_em.qd_array_col(p))
              for p in params]
    return joined.select(*df.columns, *arrays)


class Variant:
    """Context manager that routes `attach_qd` (as called by `fit`) to one implementation."""

    def __init__(self, name: str):
        self.name = name

    def __enter__(self):
        self._saved = (spark_em._attach_by_size, spark_em.MAP_MAX_DOCS)
        if self.name == "maps":
            spark_em._attach_by_size = lambda df, qd, params, prior, _t: attach_maps(df, qd, params, prior)
        elif self.name == "join":
            spark_em.MAP_MAX_DOCS = 0
        elif self.name == "maponly":
            spark_em.MAP_MAX_DOCS = 1 << 62
        elif self.name != "hybrid":
            raise ValueError(self.name)
        return self

    def __exit__(self, *exc):
        spark_em._attach_by_size, spark_em.MAP_MAX_DOCS = self._saved


def time_passes(serps: DataFrame, model_name: str, variants: list[str], iterations: int) -> dict:
    """Seconds of `iterations` EM passes per variant, every variant starting from the same state.

    Variants take turns pass by pass (rotating who goes first), so that varying load
    on a shared machine spreads over all of them.

    The passes are `fit`'s own (`spark_em._em_pass` on the truncated, query-partitioned,
    cached SERPs); pass 1 (no qd table yet, so no attach) runs once, untimed, and its
    parameters are where every variant starts.
    """
    model = get_model(model_name)
    params = list(model.qd_params)
    prep = spark_em.truncate_serps(serps, M).repartition("query_id").cache()
    g = {k: np.asarray(v, dtype=np.float64) for k, v in model.init_global(M).items()}
    first = spark_em._em_pass(prep, model, None, g, {p: INIT_VALUE for p in params}, M)
    prior0 = {p: (num / den if den > 0 else INIT_VALUE) for p, (num, den) in first.pooled.items()}
    # round robin, the order rotating per round: load from other work on the machine and
    # warm-up then hit every variant alike
    state = {v: (first.qd, first.glob, prior0) for v in variants}
    secs: dict[str, list[float]] = {v: [] for v in variants}
    lls: dict[str, float] = {}
    keep = []
    for i in range(iterations):
        for v in variants[i % len(variants):] + variants[:i % len(variants)]:
            qd, g_v, prior = state[v]
            with Variant(v):
                t0 = time.perf_counter()
                res = spark_em._em_pass(prep, model, qd, g_v, prior, M)
                secs[v].append(time.perf_counter() - t0)
            keep.append(res.agg)
            state[v] = (res.qd, res.glob,
                        {p: (num / den if den > 0 else INIT_VALUE) for p, (num, den) in res.pooled.items()})
            # the LL this pass computed (of its input parameters): equal across variants
            lls[v] = res.ll_sum / res.n_serps
    out = {}
    for v in variants:
        out[v] = {"per_iter": sum(secs[v]) / len(secs[v]), "passes": secs[v], "ll": lls[v]}
        print(f"  {model_name:4s} {v:7s}: {out[v]['per_iter']:8.2f} s/iter  passes "
              f"{[round(x, 2) for x in secs[v]]}  LL {lls[v]:.9f}", flush=True)
    for agg in keep:
        agg.unpersist()
    first.agg.unpersist()
    prep.unpersist()
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--logs", default="tiangong,head", help="tiangong,head or none")
    ap.add_argument("--models", default="pbm,dbn")
    ap.add_argument("--variants", default="maps,join,hybrid")
    ap.add_argument("--iterations", type=int, default=2, help="timed EM passes per variant")
    ap.add_argument("--serps", type=int, default=200_000)
    ap.add_argument("--queries", type=int, default=20_000)
    ap.add_argument("--pool", type=int, default=15)
    ap.add_argument("--head-queries", type=int, default=4)
    ap.add_argument("--head-docs", type=int, default=5_000)
    ap.add_argument("--head-share", type=float, default=0.1)
    ap.add_argument("--sweep", default="", help="pool sizes for equal-size-query logs, e.g. 30,100,300")
    ap.add_argument("--sweep-serps", type=int, default=100_000)
    ap.add_argument("--shuffle-partitions", default="8")
    args = ap.parse_args(argv)
    if args.iterations < 1:
        ap.error("--iterations must be >= 1")

    command = " ".join(shlex.quote(a) for a in [".venv/bin/python", "benchmarks/attach_bench.py",
                                                   *(sys.argv[1:] if argv is None else argv)])
    spark = build_session("attach-bench", master="local[2]", warehouse=tempfile.mkdtemp(prefix="attach-bench-"),
                          embedded=True, conf={
                              "spark.sql.shuffle.partitions": args.shuffle_partitions,
                              "spark.default.parallelism": args.shuffle_partitions,
                              "spark.driver.memory": "4g",
                              "spark.driver.maxResultSize": "1m",   # nothing big may reach the driver
                              "spark.ui.enabled": "false",
                              "spark.ui.showConsoleProgress": "false",
                              "spark.sql.execution.arrow.pyspark.enabled": "true",
                          })
    logs: list[tuple[str, dict]] = []
    for name in [x for x in args.logs.split(",") if x and x != "none"]:
        if name == "tiangong":
            logs.append((name, dict(n_serps=args.serps, n_queries=args.queries, pool=args.pool)))
        elif name == "head":
            logs.append((name, dict(n_serps=args.serps, n_queries=args.queries, pool=args.pool,
                                    head_queries=args.head_queries, head_docs=args.head_docs,
                                    head_share=args.head_share)))
        else:
            ap.error(f"unknown log {name}")
    for docs in [int(x) for x in args.sweep.split(",") if x]:
        # every query gets ~ 5 * docs / 10 SERPs, enough to see all its docs
        n_q = max(1, args.sweep_serps // max(1, docs // 2))
        logs.append((f"sweep{docs}", dict(n_serps=args.sweep_serps, n_queries=n_q, pool=docs, uniform_queries=True)))

    print(f"command: {command}")
    print(f"spark {spark.version}, master local[2], shuffle partitions {args.shuffle_partitions}, "
          f"MAP_MAX_DOCS {spark_em.MAP_MAX_DOCS}, {args.iterations} timed EM passes per variant "
          f"after one shared untimed first pass", flush=True)
    variants = args.variants.split(",")
    results = []
    for log_name, spec in logs:
        serps = make_log(spark, **spec).cache()
        sizes = log_sizes(serps)
        print(f"\n[{log_name}] {sizes}", flush=True)
        for model in args.models.split(","):
            results.append((log_name, model, time_passes(serps, model, variants, args.iterations)))
        serps.unpersist()

    print("\nsummary (s/iteration; ratio = variant / maps)")
    print(f"  {'log':10s} {'model':5s} " + " ".join(f"{v:>9s}" for v in variants)
          + "".join(f" {v + '/maps':>12s}" for v in variants if v != "maps" and "maps" in variants))
    for log_name, model, row in results:
        line = f"  {log_name:10s} {model:5s} " + " ".join(f"{row[v]['per_iter']:9.2f}" for v in variants)
        if "maps" in row:
            line += "".join(f" {row[v]['per_iter'] / row['maps']['per_iter']:12.3f}" for v in variants if v != "maps")
        print(line)
    print(f"command: {command}")
    spark.stop()


if __name__ == "__main__":
    main()
