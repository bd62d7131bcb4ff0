import fcntl

import pytest

from clickeval_spark.session import build_session


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


def pytest_xdist_make_scheduler(config, log):
    """Whole files to each worker (module fixtures built once), the baseline's users as one unit."""
    from xdist.scheduler import LoadScopeScheduling

    class FileScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "reliability-baseline" if path in _BASELINE_FILES else path

    return FileScheduling(config, log)
