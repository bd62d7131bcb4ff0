import pytest

from clickeval_spark.session import build_session


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    warehouse = tmp_path_factory.mktemp("warehouse")
    session = build_session(
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
    yield session
    session.stop()


@pytest.fixture
def warehouse(tmp_path):
    """A fresh warehouse root per test, for jobs that write Delta tables."""
    return str(tmp_path / "wh")
