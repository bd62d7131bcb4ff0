"""The result tables by name: as temp views of the session (`clickeval sql`), or in the session's catalog
(DESIGN §6), for any SQL client.

With `tables.catalog.database` set, every table under the warehouse is registered as an external Delta
table of that database at its location, and `click_predictions_by_rank` as a view over it. The catalog is
whatever the session is configured with: Hive's metastore (`spark.sql.catalogImplementation=hive`), Glue
through a Hive client, Unity (`catalog.schema`). spark-sql, the Thrift server (JDBC, BI tools) and
notebooks then query `clickeval.metrics`; the Delta log stays the table's truth, so delta-rs and DuckDB read
the same paths. Registration is idempotent: a stage registers its tables after it writes them.

Time travel (`metrics VERSION AS OF 3`, `TIMESTAMP AS OF '2024-05-01'`): Delta's catalog resolves it on the
catalog's tables. Spark refuses it on any view, so on the temp views `with_time_travel` (and `sql`) puts a
temp view of that version of the table, read by Delta, in place of the relation.
"""

from __future__ import annotations

import re
from typing import Callable

from delta.tables import DeltaTable
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession

from clickeval_spark import tables
from clickeval_spark.errors import ClickevalError
from clickeval_spark.spark_internals import jvm, qualified_path, session_catalog_location, session_state

BY_RANK_VIEW = "click_predictions_by_rank"
_ANALYSIS = "org.apache.spark.sql.catalyst.analysis."
_NOT_WORD = re.compile(r"\W")
# the columns click_predictions holds one array element per rank of; the others are the view's keys
_PER_RANK = ("clicks", "p_click_cond", "p_click")
_KEYS = ", ".join(f.name for f in tables.CLICK_PREDICTIONS.fields if f.name not in _PER_RANK)
# one row per (SERP, rank), the rows `metrics.click_prediction.by_rank` gives, in SQL a catalog can store: the
# one definition of the view, over whatever `click_predictions` resolves to where it is made (a temp view, or
# the catalog's table: a view keeps the namespace it was made in)
BY_RANK_SELECT = (
    f"SELECT {_KEYS}, CAST(_pos + 1 AS INT) AS rank, clicks[_pos] AS click, _p_cond AS p_click_cond, "
    "p_click[_pos] AS p_click FROM click_predictions LATERAL VIEW posexplode(p_click_cond) _r AS _pos, _p_cond")
# IF NOT EXISTS: its text is fixed, and a Hive catalog replaces a view by a drop and a create, which two runs
# registering at once would race on
BY_RANK_VIEW_SQL = f"CREATE VIEW IF NOT EXISTS {BY_RANK_VIEW} AS {BY_RANK_SELECT}"
BY_RANK_TEMP_VIEW_SQL = f"CREATE OR REPLACE TEMP VIEW {BY_RANK_VIEW} AS {BY_RANK_SELECT}"


def register_temp_views(spark: SparkSession, warehouse: str) -> list[str]:
    """Expose every existing table as a temp view, so `spark.sql("SELECT ... FROM serps")` works; with
    click_predictions also `click_predictions_by_rank`, one row per (SERP, rank). The names registered."""
    registered = []
    for name in tables.SCHEMAS:
        if tables.exists(spark, warehouse, name):
            tables.read_table(spark, warehouse, name).createOrReplaceTempView(name)
            registered.append(name)
            if name == "click_predictions":
                spark.sql(BY_RANK_TEMP_VIEW_SQL)
                registered.append(BY_RANK_VIEW)
    return registered


def with_time_travel(spark: SparkSession, warehouse: str, statement: str,
                     check: Callable[[str], None] | None = None) -> str:
    """The statement with each `<table> VERSION | TIMESTAMP AS OF x` over a temp view of one of the tables (as
    register_temp_views makes them) replaced by a temp view of that version of the table; the same text when
    there is none. The relation's place in the text is the parser's own (its origin), never a text search.
    A timestamp is an expression without subqueries, as Spark requires: evaluated by a query, which `check`
    (clickeval sql's read-only check) is given before it runs."""
    state = session_state(spark)
    plan = state.sqlParser().parsePlan(statement)
    session_catalog = state.catalog()
    edits, ctes = [], _cte_names(plan)
    for travel, aliased in _time_travels(plan):
        relation = travel.relation()
        if relation.getClass().getName() != _ANALYSIS + "UnresolvedRelation":
            continue   # IDENTIFIER(...) VERSION AS OF: left to Spark
        parts = _strings(relation.multipartIdentifier())
        # a table's temp view; a CTE of a table's name is the CTE
        if len(parts) != 1 or parts[0].lower() not in tables.SCHEMAS or parts[0].lower() in ctes \
                or not session_catalog.getRawTempView(parts[0]).isDefined():
            continue
        table, reader = parts[0].lower(), spark.read.format("delta")
        if travel.version().isDefined():
            version = travel.version().get()
            view, reader = f"{table}_version_{_NOT_WORD.sub('_', version)}", reader.option("versionAsOf", version)
        else:
            timestamp, micros = _timestamp(spark, statement, travel.timestamp().get(), check)
            view, reader = f"{table}_as_of_{micros}".replace("-", "_"), reader.option("timestampAsOf", timestamp)
        reader.load(tables.table_path(warehouse, table)).createOrReplaceTempView(view)
        # the view under the name's own alias (columns qualified `metrics.value`), unless the query gave one
        edits.append((relation.origin().startIndex().get(), travel.origin().stopIndex().get(),
                      view if aliased else f"{view} AS `{parts[0]}`"))
    for start, stop, text in sorted(edits, reverse=True):
        statement = statement[:start] + text + statement[stop + 1:]
    return statement


def sql(spark: SparkSession, warehouse: str, statement: str) -> DataFrame:
    """`spark.sql` over the temp views of register_temp_views, time travel included."""
    return spark.sql(with_time_travel(spark, warehouse, statement))


def _strings(seq) -> list[str]:
    it, out = seq.iterator(), []
    while it.hasNext():
        out.append(it.next())
    return out


def _time_travels(plan, aliased: bool = False):
    """(RelationTimeTravel, whether an alias names it) of every time travel in the parsed plan: its nodes and
    their inner children (CTE definitions, subquery plans)."""
    name = plan.getClass().getName()
    if name == _ANALYSIS + "RelationTimeTravel":
        yield plan, aliased
        return
    alias = name == "org.apache.spark.sql.catalyst.plans.logical.SubqueryAlias"
    for seq in (plan.children(), plan.innerChildren()):
        for i in range(seq.size()):
            yield from _time_travels(seq.apply(i), alias)


def _cte_names(plan) -> set[str]:
    """The names the statement's WITH clauses define, lower case."""
    names = set()
    stack = [plan]
    while stack:
        node = stack.pop()
        if node.getClass().getName() == _ANALYSIS + "UnresolvedWith":
            it = node.cteRelations().iterator()
            while it.hasNext():
                names.add(it.next()._1().lower())
        for seq in (node.children(), node.innerChildren()):
            stack.extend(seq.apply(i) for i in range(seq.size()))
    return names


def _timestamp(spark: SparkSession, statement: str, expr, check: Callable[[str], None] | None) -> tuple[str, int]:
    """A TIMESTAMP AS OF expression's value: as a timestamp string of the session's time zone, and in
    microseconds since the epoch."""
    if jvm(spark).org.apache.spark.sql.catalyst.expressions.SubqueryExpression.hasSubquery(expr):
        raise ClickevalError("TIMESTAMP AS OF takes an expression without subqueries")
    text = statement[expr.origin().startIndex().get():expr.origin().stopIndex().get() + 1]
    query = f"SELECT CAST(t AS STRING) AS ts, unix_micros(t) AS micros FROM (SELECT CAST(({text}) AS TIMESTAMP) AS t)"
    if check:
        check(query)
    row = spark.sql(query).first()
    if row["ts"] is None:
        raise ClickevalError(f"TIMESTAMP AS OF {text} is NULL")
    return row["ts"], row["micros"]


def namespace(spark: SparkSession, database: str) -> str:
    """`catalog.database`: a one-part database lives in the session's current catalog. Every name below is
    given with its catalog (Delta's forName sends a two-part name to spark_catalog whatever the current one)."""
    return database if "." in database else f"{spark.catalog.currentCatalog()}.{database}"


def check_locations(spark: SparkSession, warehouse: str, database: str) -> None:
    """Every name of `database` already registered for a table of this warehouse points at it: checked before
    a stage writes, so a catalog that belongs to another warehouse fails the stage before anything changes."""
    ns = namespace(spark, database)
    if not spark.catalog.databaseExists(ns):
        return
    for name in tables.SCHEMAS:
        if spark.catalog.tableExists(f"{ns}.{name}"):
            _check_location(spark, f"{ns}.{name}", tables.table_path(warehouse, name))


def register_in_catalog(spark: SparkSession, warehouse: str, database: str) -> list[str]:
    """Register every Delta table under `warehouse` in `database` (created if missing), plus the by-rank view;
    the names registered. A name already there must point at this warehouse's table: anything else is a
    user error naming both locations, never a silent second copy. Temp views of the tables' names are
    dropped from the session: the catalog's tables take their place (and a permanent view may not read a
    temp view)."""
    ns = namespace(spark, database)
    # the name goes in as a parameter (IDENTIFIER), never as SQL text; the config checked its pattern already
    spark.sql("CREATE DATABASE IF NOT EXISTS IDENTIFIER(:database)", args={"database": ns})
    registered = []
    for name in tables.SCHEMAS:
        if not tables.exists(spark, warehouse, name):
            continue
        path = tables.table_path(warehouse, name)
        qualified = f"{ns}.{name}"
        if not spark.catalog.tableExists(qualified):
            try:
                spark.catalog.createTable(qualified, path=path, source="delta")
            except AnalysisException:
                if not spark.catalog.tableExists(qualified):   # not a concurrent run registering it first
                    raise
        _check_location(spark, qualified, path)
        registered.append(name)
    for name in (*registered, BY_RANK_VIEW):
        spark.catalog.dropTempView(name)
    if "click_predictions" in registered:
        if not spark.catalog.tableExists(f"{ns}.{BY_RANK_VIEW}"):
            current = spark.catalog.currentCatalog(), spark.catalog.currentDatabase()
            spark.sql("USE IDENTIFIER(:database)", args={"database": ns})
            try:
                spark.sql(BY_RANK_VIEW_SQL)
            finally:
                spark.catalog.setCurrentCatalog(current[0])
                spark.catalog.setCurrentDatabase(current[1])
        registered.append(BY_RANK_VIEW)
    return registered


def _check_location(spark: SparkSession, qualified: str, path: str) -> None:
    location = _location(spark, qualified)
    if qualified_path(spark, location) != qualified_path(spark, path):
        raise ClickevalError(f"catalog table {qualified} is the Delta table at {location}, not this warehouse's "
                             f"{path}: set another tables.catalog.database, or drop that table from the catalog")


def _location(spark: SparkSession, qualified: str) -> str:
    """A catalog table's location: the session catalog's record of it (a metastore call), or in another catalog
    (Unity's `catalog.schema`) Delta's detail of the table."""
    catalog_name, database, table = qualified.split(".")
    if catalog_name == "spark_catalog":
        return session_catalog_location(spark, database, table)
    return DeltaTable.forName(spark, qualified).detail().select("location").first()[0]
