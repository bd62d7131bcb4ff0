import fcntl
from collections import Counter

import pytest

from clickeval_spark.session import build_session
from tests.spark_settings import INTERPRETED


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    warehouse = tmp_path_factory.mktemp("warehouse")
    # `make test` runs two pytest-xdist workers, each with its own session. Their JVMs start one at a time,
    # so only the first resolves Delta's jars through Ivy (and downloads them on a cold cache); the second
    # finds them cached. The lock file sits in the run's shared temp root (the workers' basetemps' parent).
    with open(tmp_path_factory.getbasetemp().parent / "spark-session.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        session = _test_session(warehouse)
    yield session
    session.stop()


def _test_session(warehouse):
    return build_session(
        "clickeval-tests",
        master="local[2]",
        warehouse=str(warehouse),
        embedded=True,
        conf={
            "spark.sql.shuffle.partitions": "4",
            "spark.default.parallelism": "4",
            "spark.ui.enabled": "false",
            "spark.databricks.delta.snapshotPartitions": "2",
            "spark.ui.showConsoleProgress": "false",
            "spark.driver.memory": "4g",
            "spark.sql.execution.arrow.pyspark.enabled": "true",
            **INTERPRETED,
        },
    )


@pytest.fixture
def warehouse(tmp_path):
    """A fresh warehouse root per test, for jobs that write Delta tables."""
    return str(tmp_path / "wh")


# Test files that share the reliability baseline and the concurrent pipeline pair (tests/reliability/_pipeline.py:
# per-process caches, each minutes of Spark): one xdist worker runs them all, so each is computed once.
_BASELINE_FILES = frozenset({
    "tests/benchmarks/test_stage_reference.py", "tests/reliability/test_concurrency.py",
    "tests/reliability/test_crash_recovery.py", "tests/reliability/test_idempotence.py",
    "tests/reliability/test_reproducibility.py",
})
# Scopes of several minutes each, longest first (CI at f085731, 43 min on a slow day, from its slowest 25 items
# alone: the baseline group 13.6 min, standalone 9.9, hostile input 5.5, log_date windows 4.8, the TREC stages
# 4.2, Airflow 3.5, em_faults 2.7). xdist hands scopes out in collection order and by default sorts them by
# their number of tests: the one- and two-test cluster scopes, among the longest, went out last, and the
# standalone run took the last 8 minutes with few other tests left to share the machine. Longest first,
# the short files fill in around the long ones at the end.
_LONG_SCOPES = (
    "reliability-baseline", "tests/cluster/test_standalone_pipeline.py", "tests/reliability/test_hostile_input.py",
    "tests/test_log_date_windows.py", "tests/test_stages_trec.py", "tests/deploy/test_airflow_dag.py",
    "tests/cluster/test_em_faults.py",
)


def _scope(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    return "reliability-baseline" if path in _BASELINE_FILES else path


def pytest_collection_modifyitems(config, items):
    """The long scopes first, in _LONG_SCOPES order, then the rest by number of tests (xdist's own order).
    A stable sort: each file's tests keep their order and stay together."""
    scopes = {item.nodeid: _scope(item.nodeid) for item in items}
    sizes = Counter(scopes.values())
    rank = {scope: i for i, scope in enumerate(_LONG_SCOPES)}
    items.sort(key=lambda item: (rank.get(scopes[item.nodeid], len(rank)), -sizes[scopes[item.nodeid]]))


def pytest_xdist_make_scheduler(config, log):
    """Whole files to each worker (module fixtures built once), the baseline's users as one unit, in
    collection order (pytest_collection_modifyitems: the long scopes first)."""
    from xdist.scheduler import LoadScopeScheduling

    class FileScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _scope(nodeid)

    config.option.loadscopereorder = False
    return FileScheduling(config, log)
