"""Issue 15: `clickeval sql` runs queries only (Spark's parser decides, not the text), unless --allow-writes."""

from __future__ import annotations

import json

import pytest
from delta.tables import DeltaTable

from clickeval_spark import tables
from jobs import sql as sql_job

RUN = "ro-1"


def _serps(spark):
    rows = [{"dataset": "d", "split": "test", "session_id": f"s{i}", "serp_id": f"s{i}-1", "serp_pos": 1,
             "query_id": "q1", "doc_ids": ["a", "b"], "vtypes": None, "clicks": [0, 1], "log_date": None,
             "ingest_run_id": RUN} for i in range(3)]
    return spark.createDataFrame(rows, tables.SERPS)


def _fill(spark, root) -> tuple[str, str]:
    warehouse = str(root / "wh")
    tables.replace_slice(_serps(spark), warehouse, "serps", {"dataset": "d"}, RUN)
    conf = root / "c.yaml"
    conf.write_text(json.dumps({"spark": {"warehouse": warehouse, "conf": {}}}))
    return warehouse, str(conf)


@pytest.fixture(scope="module")
def filled(spark, tmp_path_factory):
    return _fill(spark, tmp_path_factory.mktemp("sql"))


def _state(spark, warehouse) -> tuple[int, int]:
    """serps' latest Delta version and row count."""
    version = DeltaTable.forPath(spark, tables.table_path(warehouse, "serps")).history(1).first()["version"]
    return version, tables.read_table(spark, warehouse, "serps").count()


@pytest.mark.parametrize("statement,kind", [
    ("DELETE FROM serps", "DeleteFromTable"),
    ("INSERT INTO serps SELECT * FROM serps", "InsertIntoStatement"),
    ("UPDATE serps SET query_id = 'x'", "UpdateTable"),
    ("MERGE INTO serps t USING serps s ON t.serp_id = s.serp_id WHEN MATCHED THEN DELETE", "MergeIntoTable"),
    ("DROP TABLE serps", "DropTable"),
    ("VACUUM serps RETAIN 0 HOURS", "VacuumTableCommand"),
    ("CREATE TABLE x (a INT) USING delta", "CreateTable"),
    ("ALTER TABLE serps ADD COLUMN z INT", "AddColumns"),
    ("SET spark.databricks.delta.retentionDurationCheck.enabled = false", "SetCommand"),
    ("OPTIMIZE serps", "OptimizeTableCommand"),
    ("TRUNCATE TABLE serps", "TruncateTable"),
    ("RESTORE TABLE serps TO VERSION AS OF 0", "RestoreTableStatement"),
    # a write hidden behind a query-looking start, or run by a query
    ("WITH x AS (SELECT * FROM serps) INSERT INTO serps SELECT * FROM x", "InsertIntoStatement"),
    ("EXECUTE IMMEDIATE 'DELETE FROM serps'", "ExecuteImmediateQuery"),
    ("SELECT TRANSFORM(serp_id) USING 'cat' AS (x) FROM serps", "ScriptTransformation"),
    ("INSERT OVERWRITE DIRECTORY '/tmp/clickeval-ro' USING parquet SELECT 1", "InsertIntoDir"),
])
def test_statements_that_are_not_queries_are_refused(spark, filled, capsys, statement, kind):
    warehouse, conf = filled
    before = _state(spark, warehouse)
    rc = sql_job.main(["--conf", conf, statement])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert err == [f"clickeval sql: error: refused: the statement is a {kind}, not a query; clickeval sql runs "
                   "only SELECT, WITH, VALUES, SHOW, DESCRIBE and EXPLAIN unless --allow-writes is given"]
    assert _state(spark, warehouse) == before


@pytest.mark.parametrize("statement,shown", [
    ("SELECT serp_id FROM serps ORDER BY serp_id", "|s0-1   |"),
    ("WITH c AS (SELECT count(*) AS n FROM serps) SELECT n FROM c", "|3  |"),
    ("VALUES (41 + 1)", "|42  |"),
    ("SELECT split, count(*) AS n FROM serps GROUP BY split HAVING count(*) > 1", "|test |3  |"),
    ("SELECT serp_id FROM serps WHERE serp_id IN (SELECT serp_id FROM serps) ORDER BY 1 LIMIT 1", "|s0-1   |"),
    # LIKE: the shared test session holds other temp views, which would widen the column
    ("SHOW TABLES LIKE 'serps'", "|serps    |true       |"),
    ("DESCRIBE serps", "|serp_id      |string       |NULL   |"),
    ("EXPLAIN SELECT * FROM serps", "== Physical Plan =="),
    ("EXPLAIN DELETE FROM serps", "== Physical Plan =="),  # planned, not run
])
def test_queries_and_read_only_commands_run(spark, filled, capsys, statement, shown):
    warehouse, conf = filled
    before = _state(spark, warehouse)
    rc = sql_job.main(["--conf", conf, statement])
    out = capsys.readouterr().out
    assert rc == 0 and shown in out, out
    assert _state(spark, warehouse) == before


def test_a_syntax_error_is_one_line(spark, filled, capsys):
    _, conf = filled
    rc = sql_job.main(["--conf", conf, "SELEC 1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("clickeval sql: error: query failed: [PARSE_SYNTAX_ERROR]")


def test_allow_writes_runs_a_delete(spark, tmp_path, capsys):
    warehouse, conf = _fill(spark, tmp_path)
    version, rows = _state(spark, warehouse)
    assert sql_job.main(["--conf", conf, "--allow-writes", "DELETE FROM serps WHERE serp_id = 's1-1'"]) == 0
    assert _state(spark, warehouse) == (version + 1, rows - 1)
