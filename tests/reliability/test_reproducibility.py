"""Issue 7.6: the same config and seed give bit-identical `metrics` and `distributional_metrics`, across
two runs and across 2 vs 8 shuffle partitions (and default parallelism 4 vs 8).

Three runs of the same config and seeds, each from scratch (ingest of the simulated log to report):
  - the baseline: test session, spark.sql.shuffle.partitions=2, spark.default.parallelism=4;
  - SESSION_RUN: again in the test session with the same settings (the second run);
  - PROC_RUN: a separate `jobs.pipeline` process (a new JVM) with shuffle partitions 8 and default
    parallelism 8 (so file scans and local data are split differently too), and Spark's generated code,
    where the test session evaluates expressions interpreted (tests/spark_settings.py).
AQE's partition coalescing is off in all three, so the shuffles really have 2 and 8 partitions. The two
later runs are the pair _pipeline.concurrent_pair writes at the same time into one warehouse (test_concurrency
checks they land completely); their run_ids and dataset names differ from the baseline's and are replaced
by placeholders, every other column — value, n, ci_low, ci_high, reverse_ppl, forward_ppl, the per-rank
arrays, n_synthetic, n_real — must be equal bit for bit (exact reprs of the doubles, not approx).
"""

import json

import pytest

from clickeval_spark import tables
from tests.reliability import baseline as P

# minutes of Spark: `make test-fast` leaves it out (docs/development.md)
pytestmark = pytest.mark.slow

TABLES = ("metrics", "distributional_metrics")


def _rows(spark, warehouse, name, run_id, dataset):
    return P.table_rows(spark, warehouse, name, where=f"run_id = '{run_id}'",
                        rename={run_id: "<run>", dataset: "<dataset>"})


@pytest.fixture(scope="module")
def runs(spark, tmp_path_factory):
    base = P.baseline(spark, tmp_path_factory)
    pair = P.concurrent_pair(spark, tmp_path_factory)
    assert pair.returncode == 0, P.tail(pair.log, 60)
    baseline = {n: _rows(spark, base.warehouse, n, P.BASE_RUN, P.DATASET) for n in TABLES}
    return baseline, pair


def _assert_identical(expected, got, what):
    assert sum(expected.values()) > 0, what
    assert got == expected, f"{what} differs from the baseline:\n{P.diff(expected, got, limit=8)}"


@pytest.mark.parametrize("name", TABLES)
def test_second_run_same_settings_is_bit_identical(spark, runs, name):
    baseline, pair = runs
    _assert_identical(baseline[name], _rows(spark, pair.warehouse, name, P.SESSION_RUN, P.DATASETS[P.SESSION_RUN]),
                      f"{name} of a second run (2 shuffle partitions)")


@pytest.mark.parametrize("name", TABLES)
def test_8_vs_2_shuffle_partitions_is_bit_identical(spark, runs, name):
    baseline, pair = runs
    _assert_identical(baseline[name], _rows(spark, pair.warehouse, name, P.PROC_RUN, P.DATASETS[P.PROC_RUN]),
                      f"{name} of the run with 8 shuffle partitions and default parallelism 8")


def test_the_runs_had_the_partitionings_they_claim(spark, runs):
    """The job process was configured with 8 shuffle partitions / parallelism 8 (its config is in `runs`),
    the test session with 2."""
    _, pair = runs
    conf = {r["run_id"]: json.loads(r["config"])["spark"]["conf"] for r in
            tables.read_table(spark, pair.warehouse, "runs").where("job = 'evaluate'").collect()}
    assert conf[P.PROC_RUN]["spark.sql.shuffle.partitions"] == "8"
    assert conf[P.PROC_RUN]["spark.default.parallelism"] == "8"
    assert P.SESSION_CONF["spark.sql.shuffle.partitions"] == "2"
