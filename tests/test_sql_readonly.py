"""Issue 15: `clickeval sql` runs queries only (Spark's parser decides, not the text), unless --allow-writes.
Issue 39: and a query calls only Spark's built-in functions, never Java reflection.
Issue 54: and reads the warehouse's tables by name, never files by path; IDENTIFIER and time travel work."""

from __future__ import annotations

import json

import pytest
from delta.tables import DeltaTable
from pyspark.sql import functions as F
from pyspark.sql.functions import udtf

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
    # IDENTIFIER('serps') is checked as the statement it builds
    ("INSERT INTO IDENTIFIER('serps') SELECT * FROM serps", "InsertIntoStatement"),
    ("DROP TABLE IDENTIFIER('serps')", "DropTable"),
])
def test_statements_that_are_not_queries_are_refused(spark, filled, capsys, statement, kind):
    warehouse, conf = filled
    before = _state(spark, warehouse)
    _assert_refused(conf, capsys, statement, kind)
    assert _state(spark, warehouse) == before


def _assert_refused(conf, capsys, statement, kind):
    rc = sql_job.main(["--conf", conf, statement])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    if kind.startswith("call to"):
        assert err == [f"clickeval sql: error: refused: the query makes a {kind}; clickeval sql runs only Spark's "
                       "built-in functions, without Java reflection, unless --allow-writes is given"]
    else:
        assert err == [f"clickeval sql: error: refused: the statement is a {kind}, not a query; clickeval sql runs "
                       "only SELECT, WITH, VALUES, SHOW, DESCRIBE and EXPLAIN unless --allow-writes is given"]


REFLECT = "reflect('java.lang.String', 'valueOf', 1)"


@pytest.mark.parametrize("statement,kind", [
    ("SELECT reflect('java.lang.System', 'setProperty', 'clickeval.ro', '1')", "call to reflect (Java reflection)"),
    ("SELECT java_method('java.lang.Thread', 'sleep', 1L)", "call to java_method (Java reflection)"),
    ("SELECT try_reflect('java.lang.Thread', 'sleep', 1L)", "call to try_reflect (Java reflection)"),
    # hidden: in a CTE, a subquery, a lambda, a lateral view, a window (inline or named), a name given by IDENTIFIER
    (f"WITH c AS (SELECT {REFLECT} AS r) SELECT r FROM c", "call to reflect (Java reflection)"),
    (f"SELECT serp_id FROM serps WHERE serp_id IN (SELECT {REFLECT})", "call to reflect (Java reflection)"),
    ("SELECT transform(array(1), x -> reflect('java.lang.String', 'valueOf', x))", "call to reflect (Java reflection)"),
    (f"SELECT r FROM serps LATERAL VIEW explode(array({REFLECT})) t AS r", "call to reflect (Java reflection)"),
    (f"SELECT serp_id, count(*) OVER (PARTITION BY {REFLECT}) FROM serps", "call to reflect (Java reflection)"),
    (f"SELECT count(*) OVER w FROM serps WINDOW w AS (ORDER BY {REFLECT})", "call to reflect (Java reflection)"),
    ("SELECT IDENTIFIER('java_method')('java.lang.String', 'valueOf', 1)", "call to java_method (Java reflection)"),
])
def test_java_reflection_is_refused(spark, filled, capsys, statement, kind):
    warehouse, conf = filled
    before = _state(spark, warehouse)
    _assert_refused(conf, capsys, statement, kind)
    assert _state(spark, warehouse) == before
    assert spark._jvm.java.lang.System.getProperty("clickeval.ro") is None


@udtf(returnType="n: int")
class _Udtf:
    def eval(self, n: int):
        yield (n,)


@pytest.fixture
def session_functions(spark):
    """Functions that are not Spark's own, in the session `clickeval sql` runs in (the test session, shared with
    other test files: dropped after, and the built-in soundex put back in place of the Python UDF named soundex)."""
    spark.udf.register("py_udf", lambda x: x, "string")
    spark.udf.register("soundex", lambda x: x, "string")  # replaces the built-in in the session
    spark.udtf.register("py_udtf", _Udtf)
    spark.sql("CREATE OR REPLACE TEMPORARY FUNCTION sql_udf(x INT) RETURNS INT RETURN x + 1")
    spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW reflecting AS SELECT {REFLECT} AS r")
    spark.sql("CREATE OR REPLACE TEMPORARY VIEW udf_view AS SELECT py_udf('a') AS a")
    yield
    spark.sql("DROP VIEW IF EXISTS reflecting")
    spark.sql("DROP VIEW IF EXISTS udf_view")
    for name in ("py_udf", "py_udtf", "sql_udf"):
        spark.sql(f"DROP TEMPORARY FUNCTION IF EXISTS {name}")
    jvm = spark._jvm
    builtin, soundex = jvm.org.apache.spark.sql.catalyst.analysis.FunctionRegistry.builtin(), \
        jvm.org.apache.spark.sql.catalyst.FunctionIdentifier.apply("soundex")
    spark._jsparkSession.sessionState().functionRegistry().registerFunction(
        soundex, builtin.lookupFunction(soundex).get(), builtin.lookupFunctionBuilder(soundex).get())
    assert spark.sql("SELECT soundex('Robert')").first()[0] == "R163"


@pytest.mark.parametrize("statement,kind", [
    ("SELECT py_udf(serp_id) FROM serps", "call to py_udf (not a Spark built-in function)"),
    ("SELECT * FROM py_udtf(1)", "call to py_udtf (not a Spark built-in function)"),
    ("SELECT sql_udf(serp_pos) FROM serps", "call to sql_udf (not a Spark built-in function)"),
    ("SELECT upper(py_udf(serp_id)) FROM serps", "call to py_udf (not a Spark built-in function)"),
    ("SELECT soundex(serp_id) FROM serps", "call to soundex (a session function in place of the Spark built-in)"),
    ("SELECT default.sql_udf(1)", "call to default.sql_udf (not a Spark built-in function)"),
    ("SELECT * FROM table_changes('serps', 0)", "call to table_changes (not a Spark built-in function)"),  # Delta's
    # views: the names are in the view's definition, the analysed plan holds what they resolved to
    ("SELECT r FROM reflecting", "call to reflect (Java reflection)"),
    ("SELECT a FROM udf_view", "call to py_udf (not a Spark built-in function)"),
])
def test_functions_that_are_not_spark_built_ins_are_refused(spark, filled, capsys, session_functions, statement,
                                                            kind):
    _assert_refused(filled[1], capsys, statement, kind)


@pytest.mark.parametrize("statement,shown", [
    ("SELECT serp_id FROM serps ORDER BY serp_id", "|s0-1   |"),
    ("WITH c AS (SELECT count(*) AS n FROM serps) SELECT n FROM c", "|3  |"),
    ("VALUES (41 + 1)", "|42  |"),
    ("SELECT split, count(*) AS n FROM serps GROUP BY split HAVING count(*) > 1", "|test |3  |"),
    ("SELECT serp_id FROM serps WHERE serp_id IN (SELECT serp_id FROM serps) ORDER BY 1 LIMIT 1", "|s0-1   |"),
    # built-in functions wherever they are: windows, lateral views, lambdas, table-valued functions
    ("SELECT serp_id, row_number() OVER (PARTITION BY query_id ORDER BY serp_id) AS r FROM serps ORDER BY 1",
     "|s2-1   |3  |"),
    ("SELECT serp_id, count(*) OVER w AS n FROM serps WINDOW w AS (PARTITION BY query_id) ORDER BY 1 LIMIT 1",
     "|s0-1   |3  |"),
    ("SELECT serp_id, p, d FROM serps LATERAL VIEW posexplode(doc_ids) t AS p, d WHERE serp_id = 's0-1' ORDER BY p",
     "|s0-1   |1  |b  |"),
    ("SELECT transform(clicks, x -> x + 1) AS t, aggregate(clicks, 0, (acc, x) -> acc + x) AS n FROM serps LIMIT 1",
     "|[1, 2]|1  |"),
    ("SELECT sum(id) AS s FROM range(4)", "|6  |"),
    ("SELECT col FROM explode(array('x', 'y')) ORDER BY col DESC LIMIT 1", "|y  |"),
    # LIKE: the shared test session holds other temp views, which would widen the column
    ("SHOW TABLES LIKE 'serps'", "|serps    |true       |"),
    ("DESCRIBE serps", "|serp_id      |string       |NULL   |"),
    ("EXPLAIN SELECT * FROM serps", "== Physical Plan =="),
    ("EXPLAIN DELETE FROM serps", "== Physical Plan =="),  # planned, not run
    ("EXPLAIN SELECT reflect('java.lang.System', 'setProperty', 'clickeval.ro', '1')", "== Physical Plan =="),
    ("SELECT serp_id FROM IDENTIFIER('serps') ORDER BY 1 LIMIT 1", "|s0-1   |"),
    ("SELECT count(*) AS n FROM serps s JOIN IDENTIFIER('serps') t USING (serp_id)", "|3  |"),
    ("DESCRIBE IDENTIFIER('serps')", "|serp_id      |string       |NULL   |"),
])
def test_queries_and_read_only_commands_run(spark, filled, capsys, statement, shown):
    warehouse, conf = filled
    before = _state(spark, warehouse)
    rc = sql_job.main(["--conf", conf, statement])
    out = capsys.readouterr().out
    assert rc == 0 and shown in out, out
    assert _state(spark, warehouse) == before
    assert spark._jvm.java.lang.System.getProperty("clickeval.ro") is None  # EXPLAIN reflect(...) ran nothing


SECRET = "clickeval-secret-line"
PATH_RULE = ("clickeval sql: error: refused: the statement makes a read of files by path ({}); clickeval sql "
             "reads only the warehouse's tables, by their names, unless --allow-writes is given")


@pytest.fixture(scope="module")
def secret(tmp_path_factory) -> tuple[str, str]:
    """A file outside the warehouse, and a path next to it that does not exist."""
    folder = tmp_path_factory.mktemp("outside")
    (folder / "secret.txt").write_text(f"{SECRET}\n")
    return str(folder / "secret.txt"), str(folder / "missing.txt")


def _run(conf, capsys, statement) -> tuple[int, str, list[str]]:
    rc = sql_job.main(["--conf", conf, statement])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err.strip().splitlines()


@pytest.mark.parametrize("source", ["text", "csv", "json", "parquet", "orc", "avro", "binaryFile", "delta",
                                    "BinaryFile", "org.apache.spark.sql.parquet"])   # names as Spark takes them
def test_reading_files_by_path_is_refused_alike_for_existing_and_missing_paths(spark, filled, capsys, secret,
                                                                               source):
    warehouse, conf = filled
    before = _state(spark, warehouse)
    for path in secret:
        rc, out, err = _run(conf, capsys, f"SELECT * FROM `{source}`.`{path}`")
        assert (rc, err) == (2, [PATH_RULE.format(f"{source}.`<path>`")]), (path, err)
        assert SECRET not in out
    assert _state(spark, warehouse) == before
    assert spark.conf.get("spark.sql.runSQLOnFiles") == "true"   # the test session's own setting, put back


@pytest.mark.parametrize("template,shown", [
    # a path wherever a relation goes: a subquery, a CTE, a 3-part name, a name given by IDENTIFIER
    ("SELECT serp_id FROM serps WHERE serp_id IN (SELECT value FROM text.`{}`)", "text.`<path>`"),
    ("WITH c AS (SELECT * FROM json.`{}`) SELECT * FROM c", "json.`<path>`"),
    ("SELECT * FROM spark_catalog.delta.`{}`", "delta.`<path>`"),
    ("SELECT * FROM IDENTIFIER('text.`{}`')", "text.`<path>`"),
    ("SELECT * FROM delta.`{}` VERSION AS OF 0", "delta.`<path>`"),
    # read-only commands name relations too
    ("DESCRIBE json.`{}`", "json.`<path>`"),
    ("SHOW COLUMNS IN csv.`{}`", "csv.`<path>`"),
    ("EXPLAIN SELECT * FROM text.`{}`", "text.`<path>`"),
    ("DESCRIBE HISTORY '{}'", "'<path>' given to Delta"),
    ("DESCRIBE DETAIL '{}'", "'<path>' given to Delta"),
])
def test_paths_are_refused_in_every_place_a_relation_goes(spark, filled, capsys, secret, template, shown):
    _, conf = filled
    for path in secret:
        rc, out, err = _run(conf, capsys, template.format(path))
        assert (rc, err) == (2, [PATH_RULE.format(shown)]), (path, err)
        assert SECRET not in out


def test_a_warehouse_table_by_path_is_refused_too(spark, filled, capsys):
    warehouse, conf = filled
    for path in (tables.table_path(warehouse, "serps"), tables.table_path(warehouse, "nothing")):
        rc, out, err = _run(conf, capsys, f"SELECT count(*) FROM delta.`{path}`")
        assert (rc, err) == (2, [PATH_RULE.format("delta.`<path>`")]), err


def test_a_view_over_a_file_reads_nothing(spark, filled, capsys, tmp_path):
    """What the plan check cannot see by name (a session's view defined over a path) Spark's switch stops:
    spark.sql.runSQLOnFiles is false while `clickeval sql` runs, so the path is not even looked at: the same
    error with the file there and with it gone."""
    _, conf = filled
    secret_file = tmp_path / "secret.txt"
    secret_file.write_text(f"{SECRET}\n")
    spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW file_view AS SELECT * FROM text.`{secret_file}`")
    try:
        assert spark.table("file_view").first()[0] == SECRET   # the view reads the file outside `clickeval sql`
        errors = []
        for _ in ("there", "gone"):
            rc, out, err = _run(conf, capsys, "SELECT * FROM file_view")
            assert rc == 2 and SECRET not in out, err
            errors.append(err)
            secret_file.unlink(missing_ok=True)
    finally:
        spark.sql("DROP VIEW IF EXISTS file_view")
    assert errors[0] == errors[1] and len(errors[0]) == 1 and errors[0][0].startswith(
        "clickeval sql: error: query failed: [TABLE_OR_VIEW_NOT_FOUND] The table or view `text`.")
    assert spark.conf.get("spark.sql.runSQLOnFiles") == "true"


@pytest.fixture(scope="module")
def travelled(spark, tmp_path_factory):
    """serps written twice: 3 SERPs s*-1, then the same slice replaced by 2 SERPs n*-1; the two versions and
    their commit timestamps (as the session's time zone writes them)."""
    warehouse, conf = _fill(spark, tmp_path_factory.mktemp("travel"))
    rows = [{"dataset": "d", "split": "test", "session_id": f"n{i}", "serp_id": f"n{i}-1", "serp_pos": 1,
             "query_id": "q2", "doc_ids": ["c"], "vtypes": None, "clicks": [1], "log_date": None,
             "ingest_run_id": "ro-2"} for i in range(2)]
    tables.replace_slice(spark.createDataFrame(rows, tables.SERPS), warehouse, "serps", {"dataset": "d"}, "ro-2")
    history = (DeltaTable.forPath(spark, tables.table_path(warehouse, "serps")).history(2)
               .select("version", F.col("timestamp").cast("string").alias("ts")).orderBy("version").collect())
    (old, old_ts), (new, new_ts) = [(r["version"], r["ts"]) for r in history]
    return conf, {"old": old, "old_ts": old_ts, "new": new, "new_ts": new_ts}


OLD_SERPS, NEW_SERPS = ["s0-1", "s1-1", "s2-1"], ["n0-1", "n1-1"]


@pytest.mark.parametrize("template,expected", [
    ("SELECT serp_id FROM serps VERSION AS OF {old} ORDER BY 1", OLD_SERPS),
    ("SELECT serp_id FROM serps VERSION AS OF {new} ORDER BY 1", NEW_SERPS),
    ("SELECT serp_id FROM serps ORDER BY 1", NEW_SERPS),
    ("SELECT serp_id FROM serps TIMESTAMP AS OF '{old_ts}' ORDER BY 1", OLD_SERPS),
    ("SELECT serp_id FROM serps TIMESTAMP AS OF '{new_ts}' ORDER BY 1", NEW_SERPS),
    ("SELECT serp_id FROM serps FOR SYSTEM_TIME AS OF to_timestamp('{old_ts}') ORDER BY 1", OLD_SERPS),
    # the table's name and an alias still qualify its columns
    ("SELECT serps.serp_id FROM serps VERSION AS OF {old} ORDER BY 1", OLD_SERPS),
    ("SELECT s.serp_id FROM serps VERSION AS OF {old} AS s ORDER BY 1", OLD_SERPS),
    # both versions in one query, the older one in a subquery: what the newer write dropped
    ("SELECT serp_id FROM serps VERSION AS OF {old} WHERE serp_id NOT IN "
     "(SELECT serp_id FROM serps VERSION AS OF {new}) ORDER BY 1", OLD_SERPS),
    ("WITH o AS (SELECT * FROM serps TIMESTAMP AS OF '{old_ts}') SELECT serp_id FROM o ORDER BY 1", OLD_SERPS),
])
def test_time_travel_reads_that_version(spark, capsys, travelled, template, expected):
    conf, versions = travelled
    rc, out, err = _run(conf, capsys, template.format(**versions))
    assert rc == 0, err
    assert [line.strip("| ") for line in out.splitlines() if line.startswith("|")][1:] == expected, out


def test_time_travel_timestamps_are_checked_like_the_query(spark, capsys, travelled):
    conf, _ = travelled
    rc, _, err = _run(conf, capsys, "SELECT * FROM serps TIMESTAMP AS OF "
                                    "IDENTIFIER('reflect')('java.lang.System', 'setProperty', 'clickeval.ro', '1')")
    assert (rc, err) == (2, ["clickeval sql: error: refused: the query makes a call to reflect (Java reflection); "
                             "clickeval sql runs only Spark's built-in functions, without Java reflection, unless "
                             "--allow-writes is given"])
    assert spark._jvm.java.lang.System.getProperty("clickeval.ro") is None


def test_a_syntax_error_is_one_line(spark, filled, capsys):
    _, conf = filled
    rc = sql_job.main(["--conf", conf, "SELEC 1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("clickeval sql: error: query failed: [PARSE_SYNTAX_ERROR]")


@pytest.mark.slow
def test_allow_writes_runs_a_delete(spark, tmp_path, capsys):
    warehouse, conf = _fill(spark, tmp_path)
    version, rows = _state(spark, warehouse)
    assert sql_job.main(["--conf", conf, "--allow-writes", "DELETE FROM serps WHERE serp_id = 's1-1'"]) == 0
    assert _state(spark, warehouse) == (version + 1, rows - 1)
