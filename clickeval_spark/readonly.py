"""Which SQL statements `clickeval sql` runs without `--allow-writes`: queries only.

The statement is parsed by the session's own parser (Spark's, extended by Delta's), and the
logical plan it gives is checked against a list of what is allowed, never the other way round:
a statement kind not named here (DELETE, INSERT, MERGE, VACUUM, RESTORE, CALL, EXECUTE
IMMEDIATE, SET, CACHE, a SELECT TRANSFORM that runs a script, ...) is refused. Parsing runs
nothing; the refused statement never reaches `spark.sql`.
"""

from __future__ import annotations

from pyspark.errors import PySparkException
from pyspark.sql import SparkSession

from clickeval_spark.errors import ClickevalError

_LOGICAL = "org.apache.spark.sql.catalyst.plans.logical."
_ANALYSIS = "org.apache.spark.sql.catalyst.analysis."
_COMMAND = "org.apache.spark.sql.execution.command."

# read-only statements that are commands: SHOW, DESCRIBE (incl. Delta's HISTORY and DETAIL), EXPLAIN
# (which plans its statement without running it). What they name is not checked further.
READ_ONLY_COMMANDS = frozenset(
    [_LOGICAL + n for n in ("ShowTables", "ShowTablesExtended", "ShowViews", "ShowColumns", "ShowNamespaces",
                            "ShowFunctions", "ShowTableProperties", "ShowPartitions", "ShowCreateTable",
                            "DescribeRelation", "DescribeColumn", "DescribeNamespace", "DescribeFunction")]
    + [_COMMAND + n for n in ("ExplainCommand", "DescribeQueryCommand", "ShowCatalogsCommand",
                              "ShowCurrentNamespaceCommand")]
    + ["org.apache.spark.sql.delta.commands.DescribeDeltaHistory",
       "org.apache.spark.sql.delta.commands.DescribeDeltaDetailCommand"]
)
# the operators a query (SELECT, WITH, VALUES, TABLE, set operations, pipe syntax) is built of:
# every node of the plan, CTE definitions and subqueries included, must be one of these
QUERY_NODES = frozenset(
    [_LOGICAL + n for n in ("Project", "Filter", "Aggregate", "Join", "LateralJoin", "Sort", "GlobalLimit",
                            "LocalLimit", "Offset", "Tail", "Union", "Intersect", "Except", "Distinct",
                            "Deduplicate", "SubqueryAlias", "UnresolvedWith", "LocalRelation", "OneRowRelation",
                            "Window", "WithWindowDefinition", "Generate", "Pivot", "Unpivot", "Sample", "Range",
                            "Repartition", "RepartitionByExpression", "RebalancePartitions", "UnresolvedHint",
                            "Expand")]
    + [_ANALYSIS + n for n in ("UnresolvedRelation", "UnresolvedInlineTable", "UnresolvedTableValuedFunction",
                               "UnresolvedTVFAliases", "UnresolvedHaving", "UnresolvedSubqueryColumnAliases",
                               "RelationTimeTravel")]
)


def parse_plan(spark: SparkSession, statement: str):
    """The unresolved logical plan of one statement (a Java object); a syntax error is one line."""
    try:
        return spark._jsparkSession.sessionState().sqlParser().parsePlan(statement)
    except PySparkException as exc:  # PySpark turns the JVM's ParseException into its own class
        first = str(exc).strip().splitlines()[0]
        raise ClickevalError(f"query failed: {first}") from None


def _nodes(plan):
    """The plan's nodes depth-first: children, and inner children (CTE definitions, subquery plans)."""
    yield plan
    for seq in (plan.children(), plan.innerChildren()):
        for i in range(seq.size()):
            yield from _nodes(seq.apply(i))


def not_read_only(spark: SparkSession, statement: str) -> str | None:
    """None for a query or a read-only command; else the plan node that makes it something else."""
    plan = parse_plan(spark, statement)
    if plan.getClass().getName() in READ_ONLY_COMMANDS:
        return None
    for node in _nodes(plan):
        if node.getClass().getName() not in QUERY_NODES:
            return node.getClass().getSimpleName()
    return None
