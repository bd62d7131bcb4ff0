import contextlib
import fcntl
import json
from collections import Counter
from importlib.metadata import version
from pathlib import Path

import pytest

from clickeval_spark.session import build_session
from tests.spark_settings import INTERPRETED


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    warehouse = tmp_path_factory.mktemp("warehouse")
    # `make test` runs two pytest-xdist workers, each with its own session. On a cold Ivy cache their JVMs
    # start one at a time, so only the first downloads Delta's jars; the second finds them cached. With the
    # jars cached they start together: Spark resolves each launch under its own module id (SPARK-10878).
    # The lock file sits in the run's shared temp root (the workers' basetemps' parent).
    with open(tmp_path_factory.getbasetemp().parent / "spark-session.lock", "w") as lock:
        with contextlib.nullcontext() if _delta_jars_cached() else _locked(lock):
            session = _test_session(warehouse)
    yield session
    session.stop()


@contextlib.contextmanager
def _locked(lock):
    fcntl.flock(lock, fcntl.LOCK_EX)
    yield


def _delta_jars_cached() -> bool:
    """Delta's jars of this delta-spark version in Ivy's cache (spark.jars.ivy's default, ~/.ivy2.5.2)."""
    return any((Path.home() / ".ivy2.5.2" / "jars").glob(f"io.delta_delta-spark_*-{version('delta-spark')}.jar"))


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


@pytest.fixture
def job_conf(tmp_path, warehouse) -> str:
    """A job config file naming only the test's warehouse (no Spark settings: main() keeps the shared session)."""
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps({"spark": {"warehouse": warehouse, "conf": {}}}))
    return str(path)


# Test files that share the reliability baseline and the concurrent pipeline pair (tests/reliability/baseline.py:
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
    "standalone-cluster", "reliability-baseline", "tests/reliability/test_hostile_input.py",
    "tests/test_log_date_windows.py", "tests/test_stages_trec.py", "tests/deploy/test_airflow_dag.py",
    "tests/cluster/test_em_faults.py",
)


# Test files that submit deploy/package.sh's artefacts to the standalone cluster (session fixtures of
# tests/cluster/conftest.py: a minute to build, a minute to start): one xdist worker builds them once.
_STANDALONE_FILES = frozenset({
    "tests/cluster/test_airflow_daily.py", "tests/cluster/test_artefacts.py",
    "tests/cluster/test_other_python_path.py",
})


def _scope(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    if path in _STANDALONE_FILES:
        return "standalone-cluster"
    return "reliability-baseline" if path in _BASELINE_FILES else path


# Exhaustive parametrizations: `make test-fast` runs the first case of each (every rule still has a case),
# `make test` all of them.
_FIRST_CASE_IN_FAST = frozenset({
    "tests/test_sql_readonly.py::test_statements_that_are_not_queries_are_refused",
    "tests/test_sql_readonly.py::test_java_reflection_is_refused",
    "tests/test_sql_readonly.py::test_functions_that_are_not_spark_built_ins_are_refused",
    "tests/test_sql_readonly.py::test_queries_and_read_only_commands_run",
    "tests/metrics/test_external.py::test_each_violation_names_rule_path_and_rows",
    "tests/metrics/test_external.py::test_per_serp_predictions_are_held_to_the_same_rules",
    "tests/metrics/test_external.py::test_scores_rules",
    # per model; test_models_predicted_together_match_each_kernel checks every kernel at once
    "tests/fitted/test_predict.py::test_predict_matches_kernel",
    "tests/fitted/test_sampling.py::test_sampled_click_rates_match_click_probs",
    "tests/metrics/test_ndcg.py::test_two_models_with_unscored_and_unjudged_docs_equal_a_brute_force_oracle",
    "tests/models/test_priors.py::test_dctr_estimators_by_hand",
})


@pytest.hookimpl(tryfirst=True)   # before -m deselects: the marks below count
def pytest_collection_modifyitems(config, items):
    """Later cases of _FIRST_CASE_IN_FAST marked slow."""
    seen = set()
    for item in items:
        test = item.nodeid.split("[", 1)[0]
        if test in _FIRST_CASE_IN_FAST:
            if test in seen:
                item.add_marker(pytest.mark.slow)
            seen.add(test)


@pytest.hookimpl(tryfirst=True)   # after -m deselected, before an xdist worker reports its collection
def pytest_collection_finish(session):
    """The long scopes first, in _LONG_SCOPES order, then the rest by number of selected tests (xdist's own
    order). A stable sort: each file's tests keep their order and stay together."""
    items = session.items
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
