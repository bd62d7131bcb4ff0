"""Which SQL statements `clickeval sql` runs without `--allow-writes`: queries of Spark's own functions.

The statement is parsed by the session's own parser (Spark's, extended by Delta's), and the
logical plan it gives is checked against a list of what is allowed, never the other way round:
a statement kind not named here (DELETE, INSERT, MERGE, VACUUM, RESTORE, CALL, EXECUTE
IMMEDIATE, SET, CACHE, a SELECT TRANSFORM that runs a script, ...) is refused. Parsing runs
nothing; the refused statement never reaches `spark.sql`.

A query can still run code of its own through a function: `reflect`/`java_method`/`try_reflect`
call any static Java method, and a UDF (Python, Scala/Java, Hive, SQL) runs whatever it was
given. So a query must call only Spark's built-in functions, and no Java reflection: checked by
name on the parsed plan, then by expression class on the analyzed plan (which also holds views'
definitions and names given by IDENTIFIER). Analysis resolves names, types and views; of built-in
functions it runs nothing.

A statement reads tables by name only. Spark reads a data source's name before a path (text.`/etc/passwd`,
delta.`/any/table`) as the files at that path: `clickeval sql` turns that off with Spark's own switch
(spark.sql.runSQLOnFiles false), and refuses such a relation, and Delta's DESCRIBE HISTORY | DETAIL
'<path>', by its name on the parsed plan, before anything looks at the path: the refusal is the same
whether the path exists or not. `IDENTIFIER('<name>')` is checked as the plan it builds, the way
Spark's analysis builds it.
"""

from __future__ import annotations

from pyspark.errors import PySparkException
from pyspark.sql import SparkSession

from clickeval_spark.errors import ClickevalError
from clickeval_spark.spark_internals import JavaObject, Py4JJavaError, jvm, session_state

_LOGICAL = "org.apache.spark.sql.catalyst.plans.logical."
_ANALYSIS = "org.apache.spark.sql.catalyst.analysis."
_COMMAND = "org.apache.spark.sql.execution.command."
_EXPRESSIONS = "org.apache.spark.sql.catalyst.expressions."

# read-only statements that are commands: SHOW, DESCRIBE (incl. Delta's HISTORY and DETAIL), EXPLAIN
# (which plans its statement without running it). What they name is checked for paths only.
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

# Spark's Java reflection functions (built-ins, but they call any static Java method)
REFLECTION_FUNCTIONS = frozenset(["reflect", "java_method", "try_reflect"])
REFLECTION_CLASSES = frozenset([_EXPRESSIONS + "CallMethodViaReflection", _EXPRESSIONS + "TryReflect"])
# What a function that is not a built-in becomes in an analyzed plan. Every Python, Scala/Java and Hive UDF,
# UDAF and UDTF expression implements UserDefinedExpression; SQL functions (CREATE FUNCTION ... RETURN) do
# not, nor does the generator of a Scala function (Dataset.explode, in a view made from a DataFrame).
USER_DEFINED = _EXPRESSIONS + "UserDefinedExpression"
SQL_FUNCTIONS = frozenset(
    [_ANALYSIS + n for n in ("SQLScalarFunction", "SQLFunctionExpression", "SQLTableFunction", "SQLFunctionNode")]
    + [_LOGICAL + "SQLFunctionNode"]
)
SCALA_GENERATOR = _EXPRESSIONS + "UserDefinedGenerator"
# IDENTIFIER('<name>') in place of a name: a node that builds its plan (a relation, or a whole statement) from the name
PLAN_WITH_IDENTIFIER = _ANALYSIS + "PlanWithUnresolvedIdentifier"
# relations named by parts: `<data source>.`<path>`` (and `spark_catalog.delta.`<path>``) is a read of files by path
NAMED_RELATIONS = frozenset(_ANALYSIS + n for n in ("UnresolvedRelation", "UnresolvedTable", "UnresolvedView",
                                                   "UnresolvedTableOrView"))
# Delta's commands on a path given as a string: DESCRIBE HISTORY '<path>', DESCRIBE DETAIL '<path>'
DELTA_PATH_RELATIONS = frozenset("org.apache.spark.sql.delta." + n for n in (
    "UnresolvedPathBasedDeltaTable", "UnresolvedPathBasedTable", "UnresolvedPathBasedDeltaTableRelation"))
PATH_READ = "read of files by path"
SCRIPT = _LOGICAL + "ScriptTransformation"
_BUILTIN_QUALIFIERS = ((), ("builtin",), ("system", "builtin"))


def parse_plan(spark: SparkSession, statement: str):
    """The unresolved logical plan of one statement (a Java object); a syntax error is one line."""
    try:
        return session_state(spark).sqlParser().parsePlan(statement)
    except PySparkException as exc:  # PySpark turns the JVM's ParseException into its own class
        first = str(exc).strip().splitlines()[0]
        raise ClickevalError(f"query failed: {first}") from None


def _identified(spark: SparkSession, plan):
    """The plan an IDENTIFIER clause builds from a literal name, as Spark's analysis builds it (the name parsed
    into parts, given to the parser's builder); the plan itself for any other node, or another expression."""
    if plan.getClass().getName() != PLAN_WITH_IDENTIFIER:
        return plan
    expr = plan.identifierExpr()
    if expr.getClass().getName() != _EXPRESSIONS + "Literal" or expr.dataType().typeName() != "string" \
            or expr.value() is None:
        return plan
    try:
        parts = session_state(spark).sqlParser().parseMultipartIdentifier(expr.value().toString())
    except PySparkException:
        return plan
    return plan.planBuilder().apply(parts, plan.children())


def _nodes(spark: SparkSession, plan):
    """The plan's nodes depth-first: children, and inner children (CTE definitions, subquery plans)."""
    plan = _identified(spark, plan)
    yield plan
    for seq in (plan.children(), plan.innerChildren()):
        for i in range(seq.size()):
            yield from _nodes(spark, seq.apply(i))


class _Trees:
    """Every plan node and expression reachable from a plan, through every field of every node (Scala's
    productIterator), not only children and `expressions`: those leave out, e.g., named windows
    (`WINDOW w AS (...)`, a Map), subquery plans and the replacement of a RuntimeReplaceable."""

    def __init__(self, spark: SparkSession):
        self._spark = spark
        j = jvm(spark)
        self._bases = [(kind, j.java.lang.Class.forName(name)) for kind, name in (
            ("node", "org.apache.spark.sql.catalyst.trees.TreeNode"), ("seq", "scala.collection.Iterable"),
            ("option", "scala.Option"))]
        self._user_defined = j.java.lang.Class.forName(USER_DEFINED)
        self._kinds: dict[str, tuple[str, bool]] = {}

    def kind(self, obj) -> tuple[str, str, bool]:
        """(class name, node | seq | option | tuple | other, whether it is a UserDefinedExpression)"""
        cls = obj.getClass()
        name = cls.getName()
        if name not in self._kinds:
            kind = next((k for k, base in self._bases if base.isAssignableFrom(cls)), None)
            if kind is None:
                kind = "tuple" if name.startswith("scala.Tuple") else "other"
            self._kinds[name] = (kind, kind == "node" and self._user_defined.isAssignableFrom(cls))
        return (name, *self._kinds[name])

    def walk(self, root):
        """(class name, node, is a UserDefinedExpression) of every tree node under root, root first."""
        stack = [root]
        while stack:
            obj = stack.pop()
            if not isinstance(obj, JavaObject):  # None, or a value py4j converted: str, int, bool
                continue
            name, kind, user_defined = self.kind(obj)
            if name == PLAN_WITH_IDENTIFIER:  # its fields hold a name and a builder: walk what it builds
                built = _identified(self._spark, obj)
                if built is not obj:
                    stack.append(built)
                    continue
            if kind == "node":
                yield name, obj, user_defined
            if kind in ("node", "tuple"):
                fields = [obj.productElement(i) for i in range(obj.productArity())]
            elif kind == "seq":
                it, fields = obj.iterator(), []
                while it.hasNext():
                    fields.append(it.next())
            elif kind == "option":
                fields = [obj.get()] if obj.isDefined() else []
            else:
                continue
            stack.extend(reversed(fields))


def _strings(seq) -> list[str]:
    it, out = seq.iterator(), []
    while it.hasNext():
        out.append(it.next())
    return out


def _called_functions(trees: _Trees, plan):
    """(name parts, is a table function) of every function the parsed plan calls by name."""
    for name, node, _ in trees.walk(plan):
        if name == _ANALYSIS + "UnresolvedFunction":
            yield _strings(node.nameParts()), False
        elif name == _ANALYSIS + "UnresolvedGenerator":  # LATERAL VIEW f(...)
            ident = node.name()
            db = ident.database()
            yield ([db.get()] if db.isDefined() else []) + [ident.funcName()], False
        elif name == _ANALYSIS + "UnresolvedTableValuedFunction":  # FROM f(...)
            yield _strings(node.name()), True


def _not_builtin(spark: SparkSession, parts: list[str], table: bool) -> str | None:
    """Why the function named by parts is not one of Spark's own built-ins, or None when it is."""
    j = jvm(spark)
    analysis = j.org.apache.spark.sql.catalyst.analysis
    state = session_state(spark)
    builtin, session = ((analysis.TableFunctionRegistry.builtin(), state.tableFunctionRegistry()) if table
                        else (analysis.FunctionRegistry.builtin(), state.functionRegistry()))
    *qualifier, name = [p.lower() for p in parts]
    ident = j.org.apache.spark.sql.catalyst.FunctionIdentifier.apply(name)
    if tuple(qualifier) not in _BUILTIN_QUALIFIERS or not builtin.functionExists(ident):
        return "not a Spark built-in function"
    # a session function can take a built-in's name (spark.udf.register("upper", ...) replaces it in the
    # session's registry): the name must still lead to the built-in's own builder
    if not session.lookupFunctionBuilder(ident).equals(builtin.lookupFunctionBuilder(ident)):
        return "a session function in place of the Spark built-in"
    if not table and name in REFLECTION_FUNCTIONS:
        return "Java reflection"
    return None


def _path_read(spark: SparkSession, trees: _Trees, plan) -> str | None:
    """What names files by a path anywhere in the parsed plan (queries, subqueries, CTEs, EXPLAIN's and
    DESCRIBE's relations), decided from the names alone: None when nothing does."""
    sources: dict[str, bool] = {}
    for name, node, _ in trees.walk(plan):
        if name in DELTA_PATH_RELATIONS:
            return f"{PATH_READ} ('<path>' given to Delta)"
        if name in NAMED_RELATIONS:
            parts = _strings(node.multipartIdentifier())
            if len(parts) >= 2 and _is_data_source(spark, parts[-2], sources):
                return f"{PATH_READ} ({parts[-2]}.`<path>`)"
    return None


def _is_data_source(spark: SparkSession, name: str, seen: dict[str, bool]) -> bool:
    """Whether Spark takes `name` for a data source, as it does before a path (text, binaryFile, delta, a class
    name), also one it knows but cannot load here (avro, kafka without their modules)."""
    if name not in seen:
        conf = session_state(spark).conf()
        try:
            jvm(spark).org.apache.spark.sql.execution.datasources.DataSource.lookupDataSource(name, conf)
            seen[name] = True
        except PySparkException as exc:  # AnalysisException: a known source whose module is missing
            seen[name] = exc.getCondition() != "DATA_SOURCE_NOT_FOUND"
        except Py4JJavaError as exc:  # SparkClassNotFoundException: no such source
            seen[name] = exc.java_exception.getCondition() != "DATA_SOURCE_NOT_FOUND"
    return seen[name]


def _analyzed(spark: SparkSession, plan):
    """The analyzed plan (names, types and views resolved; nothing run), or None when analysis fails."""
    state = session_state(spark)
    skip = jvm(spark).org.apache.spark.sql.execution.CommandExecutionMode.SKIP()
    try:
        # a QueryExecution runs its plan only when asked for more than `analyzed`; SKIP: never a command
        return state.executePlan(plan, skip).analyzed()
    except (PySparkException, Py4JJavaError):
        return None


def not_read_only(spark: SparkSession, statement: str) -> str | None:
    """None for a query of built-in functions over tables by name, or a read-only command; else what makes it
    something else: a read of files by path (PATH_READ ...), the plan node that is not part of a query, or
    the call that runs code of its own. Run it with spark.sql.runSQLOnFiles false, as the statement runs."""
    plan = _identified(spark, parse_plan(spark, statement))
    trees = _Trees(spark)
    path_read = _path_read(spark, trees, plan)
    if path_read:
        return path_read
    if plan.getClass().getName() in READ_ONLY_COMMANDS:
        return None
    for node in _nodes(spark, plan):
        if node.getClass().getName() not in QUERY_NODES:
            return node.getClass().getSimpleName()
    # Two checks. By name, on the parsed plan, before analysis (which runs a Python UDTF's `analyze`): every
    # function called by name must be a Spark built-in still bound to the built-in's own builder, and not
    # reflection. An allow-list, so a UDF of any kind, a SQL function or a persistent function is refused
    # without being listed here. By class, on the analyzed plan: what the parsed plan shows no name for (a
    # view's definition, IDENTIFIER('reflect')(...)) must resolve to no reflection and no user-defined function.
    for parts, table in _called_functions(trees, plan):
        why = _not_builtin(spark, parts, table)
        if why:
            return f"call to {'.'.join(parts)} ({why})"
    analyzed = _analyzed(spark, plan)
    if analyzed is None:  # spark.sql fails the same way, before running anything, and says why in one line
        return None
    for name, node, user_defined in trees.walk(analyzed):
        if name in REFLECTION_CLASSES:
            return f"call to {node.prettyName()} (Java reflection)"
        if user_defined:
            return f"call to {node.name()} (not a Spark built-in function)"
        if name in SQL_FUNCTIONS:
            return f"call to {node.function().name().unquotedString()} (not a Spark built-in function)"
        if name == SCALA_GENERATOR:
            return "call to a Scala function (not a Spark built-in function)"
        if name == SCRIPT:  # in a view's definition
            return node.nodeName()
    return None
