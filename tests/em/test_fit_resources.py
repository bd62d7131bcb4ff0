"""What a Spark EM fit holds and leaves behind: no local checkpoint persisted after it, and results
under a 1 MB driver limit on a log of >= 200k (query, doc) pairs."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from clickeval_spark.models import get_model
from clickeval_spark.em import blocks
from clickeval_spark.em.driver import fit



@pytest.mark.slow
def test_a_fit_leaves_no_local_checkpoint_persisted(spark, make_log):
    """The stage engine cuts its lineage with a local checkpoint every checkpoint_interval passes; each one is freed once the
    next pass is cached. Before the fix every checkpoint stayed persisted until the session ended (one copy of
    the whole EM state each: a 10M-SERP fit ran out of heap). Only the fit's qd table stays."""
    before = set(spark.sparkContext._jsc.getPersistentRDDs().keySet())

    def new_persisted() -> int:   # by id: other tests' leftovers may be cleaned meanwhile
        return len(set(spark.sparkContext._jsc.getPersistentRDDs().keySet()) - before)

    log = make_log(get_model("pbm"), n_serps=300, M=5, seed=3)
    packed = blocks.pack_serps(log.df(spark), max_rank=5)
    fitted = fit(packed, get_model("pbm"), iterations=9, tol=None, max_rank=5, checkpoint_interval=2, engine="stages")
    assert fitted.history[-1][0] == 9
    assert new_persisted() == 2   # the packed log and the qd table
    # the resident engine's final blocks (a local checkpoint of its barrier stage) are freed as well
    fit(packed, get_model("pbm"), iterations=3, tol=None, max_rank=5, engine="resident")
    assert new_persisted() == 3   # and the second fit's qd table
    packed.unpersist()
    assert new_persisted() == 2

ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------
# scale: 1 MB driver result limit, >= 200k (query, doc) pairs generated in Spark
# ---------------------------------------------------------------------------

N_SCALE = 50_000
SCALE_SCRIPT = textwrap.dedent("""
    import json, sys, time
    from pyspark.sql import functions as F
    from clickeval_spark.session import build_session
    from clickeval_spark.models import get_model
    from clickeval_spark.em.driver import fit

    N_SERPS, N_QUERIES, POOL, M = {n_serps}, {n_queries}, {pool}, 10
    spark = build_session("scale-test", master="local[2]", warehouse=sys.argv[1], embedded=True, conf={{
        "spark.driver.maxResultSize": "1m",
        "spark.sql.shuffle.partitions": "8",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
    }})
    assert spark.sparkContext.getConf().get("spark.driver.maxResultSize") == "1m"
    # the limit bites: collecting ~5 MB of rows fails
    try:
        spark.range(600_000).collect()
        sys.exit("maxResultSize did not stop a 5 MB collect")
    except Exception as e:
        assert "maxResultSize" in str(e), e
    # every SERP: a query, 10 consecutive docs of the query's pool from a hashed offset,
    # clicks from a hashed coin whose rate falls with rank
    serps = spark.range(N_SERPS).select(
        F.lit("scale").alias("dataset"), F.lit("train").alias("split"),
        F.col("id").cast("string").alias("session_id"), F.concat(F.lit("s"), F.col("id")).alias("serp_id"),
        F.lit(1).alias("serp_pos"),
        F.concat(F.lit("q"), (F.col("id") % N_QUERIES).cast("string")).alias("query_id"),
        F.transform(F.sequence(F.lit(0), F.lit(M - 1)), lambda r: F.concat(
            F.lit("d"), F.pmod(F.xxhash64(F.col("id"), F.lit(7)) + r, F.lit(POOL)).cast("string"))).alias("doc_ids"),
        F.lit(None).cast("array<string>").alias("vtypes"),
        F.transform(F.sequence(F.lit(0), F.lit(M - 1)), lambda r: (
            F.pmod(F.xxhash64(F.col("id"), r), F.lit(1000)) < F.lit(400) / (r + 1)).cast("int")).alias("clicks"),
        F.lit(None).cast("date").alias("log_date"),
    )
    serps = serps.cache()
    out = {{"n_serps": serps.count()}}
    out["n_pairs"] = serps.select("query_id", F.explode("doc_ids").alias("d")).distinct().count()
    for name in ("pbm", "dbn"):
        t = time.perf_counter()
        fitted = fit(serps, get_model(name), iterations=2, tol=None, max_rank=M)
        out[name] = {{
            "seconds": time.perf_counter() - t,
            "iteration_seconds": [h[2] for h in fitted.history[1:]],
            "ll": [h[1] for h in fitted.history],
            "qd_rows": fitted.qd.count(),
        }}
    print("RESULT " + json.dumps(out))
    spark.stop()
""")


@pytest.fixture(scope="module", autouse=True)
def scale_run(request, tmp_path_factory):
    """Fit PBM and DBN in a dedicated session: spark.driver.maxResultSize = 1m must be set
    before its SparkContext starts, so it runs in a subprocess and the shared test session
    is untouched. Started when the module starts (if the scale test is selected) so it
    overlaps with the other tests, which mostly wait on job scheduling."""
    if not any(item.name == "test_scale_fit_under_1mb_driver_results" for item in request.session.items):
        yield None
        return
    script = tmp_path_factory.mktemp("scale") / "scale_fit.py"
    script.write_text(SCALE_SCRIPT.format(n_serps=N_SCALE, n_queries=22_000, pool=14))
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, str(script), str(script.parent / "wh")], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_scale_fit_under_1mb_driver_results(scale_run):
    stdout, stderr = scale_run.communicate(timeout=900)
    assert scale_run.returncode == 0, stderr[-5000:]
    line = [ln for ln in stdout.splitlines() if ln.startswith("RESULT ")][-1]
    out = json.loads(line[len("RESULT "):])
    print(json.dumps(out, indent=1))
    assert out["n_serps"] == N_SCALE
    assert out["n_pairs"] >= 200_000
    for name in ("pbm", "dbn"):
        r = out[name]
        assert r["qd_rows"] == out["n_pairs"]
        assert len(r["ll"]) == 3 and all(math.isfinite(x) for x in r["ll"])
        assert r["ll"][2] > r["ll"][0]
