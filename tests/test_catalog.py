"""The result tables in a catalog (issue 39, DESIGN §6): external Delta tables and the by-rank view, registered
by the stages, read by name from `clickeval sql`, and from the real `spark-sql` and `beeline` clients against
a Hive metastore (embedded Derby in a temp folder)."""

from __future__ import annotations

import glob
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from chispa import assert_df_equality
from delta.tables import DeltaTable
from pyspark.errors import AnalysisException
from pyspark.sql import functions as F

from clickeval_spark import tables
from clickeval_spark.catalog import check_locations, register_in_catalog, register_temp_views, sql, with_time_travel
from clickeval_spark.config import AppConfig, CatalogConfig, IngestConfig, TablesConfig
from clickeval_spark.context import StageContext
from clickeval_spark.errors import ClickevalError
from clickeval_spark.metrics.click_prediction import by_rank
from clickeval_spark.stages import STAGES
from jobs import pipeline as pipeline_job
from jobs import sql as sql_job
from tests.spark_settings import PROCESS_CONF

RUN = "cat-1"


def _fill(spark, warehouse: str) -> None:
    metrics = [(RUN, m, "d", "test", "LL", None, v, 10, v - 0.1, v + 0.1, None) for m, v in (("pbm", -0.25), ("dbn", -0.5))]
    tables.replace_slice(spark.createDataFrame(metrics, tables.METRICS), warehouse, "metrics", {"run_id": RUN}, RUN)
    preds = [(RUN, "pbm", "d", "test", "s1", [0, 1], [0.5, 0.25], [0.5, 0.2]),
             (RUN, "pbm", "d", "test", "s2", [1], [0.75], [0.75])]
    tables.replace_slice(spark.createDataFrame(preds, tables.CLICK_PREDICTIONS), warehouse, "click_predictions",
                         {"run_id": RUN, "model": "pbm"}, RUN)


def _catalog_tables(spark, database: str) -> dict[str, str]:
    """{name: EXTERNAL / MANAGED / VIEW} of the database's tables (SQL: the test session's interpreted
    expressions cannot decode spark.catalog.listTables' rows)."""
    names = [r["tableName"] for r in spark.sql(f"SHOW TABLES IN {database}").where("NOT isTemporary").collect()]
    return {n: spark.sql(f"DESCRIBE TABLE EXTENDED {database}.{n}").where("col_name = 'Type'").first()["data_type"]
            for n in names}


@pytest.mark.slow
def test_tables_register_as_external_delta_tables_with_the_view(spark, tmp_path):
    warehouse = str(tmp_path / "wh")
    _fill(spark, warehouse)
    # temp views of the same names (an earlier `clickeval sql` in this session) give way to the catalog's tables
    assert "click_predictions" in register_temp_views(spark, warehouse)
    # the temp by-rank view and the catalog's share one SQL definition: the rows of `by_rank`
    assert_df_equality(spark.table("click_predictions_by_rank"),
                       by_rank(tables.read_table(spark, warehouse, "click_predictions")),
                       ignore_row_order=True, ignore_nullable=True)
    try:
        assert register_in_catalog(spark, warehouse, "ce_unit") == ["click_predictions", "metrics",
                                                                    "click_predictions_by_rank"]
        assert not spark.sql("SHOW VIEWS").where("isTemporary AND viewName = 'click_predictions'").count()
        assert _catalog_tables(spark, "ce_unit") == {
            "click_predictions": "EXTERNAL", "metrics": "EXTERNAL", "click_predictions_by_rank": "VIEW"}
        assert_df_equality(spark.table("ce_unit.metrics"), tables.read_table(spark, warehouse, "metrics"),
                           ignore_row_order=True)
        view = spark.table("ce_unit.click_predictions_by_rank")
        assert_df_equality(view, by_rank(tables.read_table(spark, warehouse, "click_predictions")),
                           ignore_row_order=True, ignore_nullable=True)
        assert sorted((r["serp_id"], r["rank"], r["click"], r["p_click_cond"], r["p_click"]) for r in view.collect()) == [
            ("s1", 1, 0, 0.5, 0.5), ("s1", 2, 1, 0.25, 0.2), ("s2", 1, 1, 0.75, 0.75)]

        # idempotent; and a later write shows through the catalog at once (the Delta log is the table's truth)
        assert register_in_catalog(spark, warehouse, "ce_unit") == ["click_predictions", "metrics",
                                                                    "click_predictions_by_rank"]
        later = [("cat-2", "ubm", "d", "test", "LL", None, -0.125, 10, -0.2, -0.1, None)]
        tables.replace_slice(spark.createDataFrame(later, tables.METRICS), warehouse, "metrics", {"run_id": "cat-2"}, "cat-2")
        assert spark.table("ce_unit.metrics").count() == 3

        # the same database over another warehouse: one clear error naming both tables, nothing re-pointed
        other = str(tmp_path / "other")
        _fill(spark, other)
        with pytest.raises(ClickevalError, match=r"catalog table spark_catalog\.ce_unit\.click_predictions is the Delta "
                                                 r"table at .*/wh/click_predictions, not this warehouse's .*/other/click_predictions"):
            register_in_catalog(spark, other, "ce_unit")
        # the same check runs before a stage writes anything
        with pytest.raises(ClickevalError, match=r"catalog table spark_catalog\.ce_unit\.click_predictions is the Delta"):
            check_locations(spark, other, "ce_unit")
        check_locations(spark, warehouse, "ce_unit")
    finally:
        spark.sql("DROP DATABASE IF EXISTS ce_unit CASCADE")
    # external: dropping the catalog entries leaves the Delta tables as they were
    assert tables.read_table(spark, warehouse, "metrics").count() == 3


@pytest.mark.slow
def test_a_stage_registers_what_it_wrote_and_sql_resolves_through_the_catalog(spark, tmp_path, capsys):
    warehouse = str(tmp_path / "wh")
    log = tmp_path / "train.txt"
    log.write_text("".join(f's{i}\tq1\t["a", "b"]\t[0, 0]\t[{i % 2}, 0]\n' for i in range(4)))
    cfg = AppConfig(ingest=IngestConfig(dataset="d", format="per_query_text", paths={"train": str(log)}),
                    tables=TablesConfig(catalog=CatalogConfig(database="ce_stage")))
    conf = tmp_path / "c.yaml"
    conf.write_text(yaml.safe_dump({"spark": {"warehouse": warehouse, "conf": {}},
                                    "tables": {"catalog": {"database": "ce_stage"}}}))
    try:
        STAGES["ingest"](StageContext(spark, cfg, warehouse, "cat-ingest"))
        assert _catalog_tables(spark, "ce_stage") == {"serps": "EXTERNAL", "quarantine": "EXTERNAL", "runs": "EXTERNAL"}
        capsys.readouterr()
        # unqualified names resolve through the catalog's database (no temp views in this mode)
        assert sql_job.main(["--conf", str(conf), "SELECT split, count(*) AS n FROM serps GROUP BY split"]) == 0
        assert re.search(r"\|train\s*\|4\s*\|", capsys.readouterr().out)
        assert not spark.sql("SHOW VIEWS").where("isTemporary AND viewName = 'serps'").count()
        # a database no stage has registered: one line saying what to run
        other = tmp_path / "other.yaml"
        other.write_text(yaml.safe_dump({"spark": {"warehouse": warehouse, "conf": {}},
                                         "tables": {"catalog": {"database": "ce_never"}}}))
        assert sql_job.main(["--conf", str(other), "SELECT 1"]) == 2
        assert capsys.readouterr().err.strip() == (
            "clickeval sql: error: tables.catalog.database: spark_catalog.ce_never does not exist in the session's "
            "catalog; run a stage with tables.catalog set (e.g. `clickeval report`) to register the tables")
    finally:
        spark.sql("USE default")
        spark.sql("DROP DATABASE IF EXISTS ce_stage CASCADE")


def test_time_travel_on_the_temp_views_and_on_the_catalogs_tables(spark, tmp_path, capsys):
    """VERSION AS OF and TIMESTAMP AS OF give that version's rows: on the temp views through `catalog.sql`
    (Spark refuses time travel on a view), on the catalog's external tables natively, and through `clickeval
    sql` in both modes."""
    warehouse = str(tmp_path / "wh")
    _fill(spark, warehouse)
    later = [(RUN, "pbm", "d", "test", "LL", None, -0.125, 10, -0.2, -0.1, None)]
    tables.replace_slice(spark.createDataFrame(later, tables.METRICS), warehouse, "metrics", {"run_id": RUN}, RUN)
    history = (DeltaTable.forPath(spark, tables.table_path(warehouse, "metrics")).history(2)
               .select("version", F.col("timestamp").cast("string").alias("ts")).orderBy("version").collect())
    (old, old_ts), (new, _) = [(r["version"], r["ts"]) for r in history]
    old_rows, new_rows = [("dbn", -0.5), ("pbm", -0.25)], [("pbm", -0.125)]

    def rows(df):
        return [(r["model"], r["value"]) for r in df.collect()]

    def printed(statement, database=None):
        conf = tmp_path / "c.yaml"
        conf.write_text(yaml.safe_dump({"spark": {"warehouse": warehouse, "conf": {}},
                                        **({"tables": {"catalog": {"database": database}}} if database else {})}))
        capsys.readouterr()
        assert sql_job.main(["--conf", str(conf), statement]) == 0, capsys.readouterr().err
        return [tuple(c.strip() for c in line.split("|")[1:-1]) for line in capsys.readouterr().out.splitlines()
                if line.startswith("|")][1:]

    query = "SELECT model, value FROM metrics {} ORDER BY model"
    register_temp_views(spark, warehouse)
    with pytest.raises(AnalysisException, match="TIME_TRAVEL"):   # what with_time_travel is for
        spark.sql(query.format(f"VERSION AS OF {old}")).collect()
    assert rows(sql(spark, warehouse, query.format(f"VERSION AS OF {old}"))) == old_rows
    assert rows(sql(spark, warehouse, query.format(f"VERSION AS OF {new}"))) == new_rows
    assert rows(sql(spark, warehouse, query.format(f"TIMESTAMP AS OF '{old_ts}'"))) == old_rows
    assert rows(sql(spark, warehouse, query.format(""))) == new_rows
    assert printed(query.format(f"VERSION AS OF {old}")) == [("dbn", "-0.5"), ("pbm", "-0.25")]
    try:
        register_in_catalog(spark, warehouse, "ce_travel")
        in_catalog = "SELECT model, value FROM ce_travel.metrics {} ORDER BY model"
        # Delta's catalog resolves it on the external table; nothing to rewrite
        assert with_time_travel(spark, warehouse, in_catalog.format(f"VERSION AS OF {old}")) == \
            in_catalog.format(f"VERSION AS OF {old}")
        assert rows(spark.sql(in_catalog.format(f"VERSION AS OF {old}"))) == old_rows
        assert rows(spark.sql(in_catalog.format(f"TIMESTAMP AS OF '{old_ts}'"))) == old_rows
        assert rows(spark.sql(in_catalog.format(""))) == new_rows
        assert printed(query.format(f"TIMESTAMP AS OF '{old_ts}'"), "ce_travel") == [("dbn", "-0.5"), ("pbm", "-0.25")]
        assert printed(query.format(f"VERSION AS OF {new}"), "ce_travel") == [("pbm", "-0.125")]
    finally:
        spark.sql("USE default")
        spark.sql("DROP DATABASE IF EXISTS ce_travel CASCADE")


# ---------------------------------------------------------------------------------------------------------------
# Real clients: a stage registers the pipeline's tables in a Hive metastore (embedded Derby); spark-sql and beeline
# through the Thrift server, both from the pyspark wheel, get the rows `clickeval sql` prints.

def _spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def _delta_jars() -> list[str]:
    """Delta's jars as Ivy cached them for the session fixture (spark.jars.packages)."""
    jars = sorted(glob.glob(str(Path.home() / ".ivy2.5.2" / "jars" / "io.delta_delta-*.jar")))
    assert len(jars) == 2, jars
    return jars


def _hive_conf(root: Path) -> dict[str, str]:
    return {
        "spark.sql.catalogImplementation": "hive",
        "spark.sql.warehouse.dir": str(root / "hive-warehouse"),
        "spark.hadoop.javax.jdo.option.ConnectionURL": f"jdbc:derby:;databaseName={root / 'metastore_db'};create=true",
    }


def _client_args(root: Path) -> list[str]:
    jars = _delta_jars()
    args = ["--master", "local[2]", "--jars", ",".join(jars), "--driver-class-path", ":".join(jars),
            # started as the suite starts its processes (tests/spark_settings.py)
            *[arg for key, value in PROCESS_CONF.items() for arg in ("--conf", f"{key}={value}")],
            "--conf", "spark.ui.enabled=false", "--conf", "spark.sql.shuffle.partitions=2",
            "--conf", "spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension",
            "--conf", "spark.sql.catalog.spark_catalog=org.apache.spark.sql.delta.catalog.DeltaCatalog"]
    for key, value in _hive_conf(root).items():
        if key != "spark.sql.catalogImplementation":   # the clients are Hive's
            args += ["--conf", f"{key}={value}"]
    return args


def _env() -> dict[str, str]:
    return {**os.environ, "SPARK_HOME": str(_spark_home()), "PYSPARK_PYTHON": sys.executable}


def _run(cmd: list[str], cwd: Path, timeout: int = 600, quiet: bool = False) -> str:
    t0 = time.monotonic()
    done = subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout)
    print(f"{Path(cmd[0]).name} {cmd[1]}: {time.monotonic() - t0:.1f} s")
    assert done.returncode == 0, f"{cmd[0]} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    if quiet:   # clickeval: on stderr only its own log records (EM progress), no line from Spark, Ivy or the JVM
        assert [line for line in done.stderr.splitlines() if not re.match(r"[0-9-]+ [0-9:,]+ clickeval ", line)] == []
    return done.stdout


def _shown_rows(out: str) -> list[tuple[str, ...]]:
    """The rows of a DataFrame.show() table."""
    lines = [line for line in out.splitlines() if line.startswith("|")]
    return [tuple(c.strip() for c in line.split("|")[1:-1]) for line in lines[1:]]


def _tab_rows(out: str, header: bool) -> list[tuple[str, ...]]:
    lines = [line.split("> ", 1)[-1] if "jdbc:hive2" in line else line for line in out.splitlines() if "\t" in line]
    return [tuple(line.split("\t")) for line in lines[1 if header else 0:]]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_spark_sql_and_beeline_read_the_pipelines_tables_by_name(spark, tmp_path):
    spark.range(1).count()   # the session fixture has Ivy-resolved Delta's jars by now
    warehouse = tmp_path / "wh"
    sections = {
        "ingest": {"dataset": "syn", "format": "synthetic",
                   "synthetic": {"model": "pbm", "n_serps": 600, "n_queries": 30, "seed": 3, "labels": "serp",
                                 "label_fraction": 0.3}},
        "fit": {"models": ["gctr", "pbm"], "iterations": 2},
        "evaluate": {"replicates": 20, "reference_model": None},
        "generate": {"samples": 1, "list_orders": ["original"]},
        "surrogate": {"model": "pbm", "iterations": 1},
        "report": {"path": str(tmp_path / "reports")},
    }
    # the pipeline's tables, written by this test's session (no catalog: it is not Hive's) ...
    local = tmp_path / "local.yaml"
    local.write_text(yaml.safe_dump({"spark": {"warehouse": str(warehouse), "conf": {}}, **sections}))
    assert pipeline_job.main(["--conf", str(local), "--run-id", "cat-run"]) == 0
    # ... then registered by the report stage of a run with the Hive metastore as its catalog: a stage
    # registers every table of the warehouse
    conf = tmp_path / "hive.yaml"
    conf.write_text(yaml.safe_dump({
        "env": "cat", "spark": {"mode": "embedded", "master": "local[2]", "warehouse": str(warehouse),
                                "conf": {"spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false",
                                         "spark.databricks.delta.snapshotPartitions": "2", **_hive_conf(tmp_path),
                                         **PROCESS_CONF}},
        **sections, "tables": {"catalog": {"database": "clickeval"}},
    }))
    clickeval = str(Path(sys.executable).parent / "clickeval")
    _run([clickeval, "report", "--conf", str(conf), "--run-id", "cat-run"], tmp_path, quiet=True)

    # one query over a table and the view, so each client starts once
    query = ("SELECT m.model, m.value, r.n, r.clicks FROM clickeval.metrics m JOIN (SELECT model, count(*) AS n, "
             "sum(click) AS clicks FROM clickeval.click_predictions_by_rank GROUP BY model) r ON m.model = r.model "
             "WHERE m.metric = 'LL' AND m.cutoff IS NULL AND m.reference_model IS NULL ORDER BY m.model")
    ours = _shown_rows(_run([clickeval, "sql", "--conf", str(conf), query], tmp_path, quiet=True))
    # the synthetic log's true model is scored beside the fitted ones
    assert [row[0] for row in ours] == ["gctr", "pbm", "truth"] and all(float(row[1]) < 0 for row in ours)
    assert ours[0][2] == ours[1][2] and int(ours[0][2]) > 0   # every SERP x rank, once per model

    spark_sql = str(_spark_home() / "bin" / "spark-sql")
    out = _run([spark_sql, *_client_args(tmp_path), "-e", f"SHOW TABLES IN clickeval; {query}"], tmp_path)
    assert _tab_rows(out, header=False) == ours
    shown = {line.strip() for line in out.splitlines() if line.strip() and "\t" not in line}   # SHOW TABLES
    assert shown == set(tables.SCHEMAS) | {"click_predictions_by_rank"}

    port = _free_port()
    server = subprocess.Popen(
        [str(_spark_home() / "bin" / "spark-submit"), "--class", "org.apache.spark.sql.hive.thriftserver.HiveThriftServer2",
         *_client_args(tmp_path), "spark-internal", "--hiveconf", f"hive.server2.thrift.port={port}",
         "--hiveconf", "hive.server2.thrift.bind.host=127.0.0.1"],
        cwd=tmp_path, env=_env(), stdout=open(tmp_path / "thrift.log", "w"), stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert server.poll() is None, (tmp_path / "thrift.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "the Thrift server did not listen within 180 s"
                time.sleep(1)
        beeline = str(_spark_home() / "bin" / "beeline")
        out = _run([beeline, "-u", f"jdbc:hive2://127.0.0.1:{port}", "-n", "analyst", "--silent=true",
                    "--outputformat=tsv2", "-e", query], tmp_path)
        assert _tab_rows(out, header=True) == ours
    finally:
        server.terminate()
        server.wait(60)
