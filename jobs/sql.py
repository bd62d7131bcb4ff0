"""`clickeval sql "<query>"`: Spark SQL with every result table available by its name.

Read-only unless --allow-writes: the statement must be a query or a SHOW / DESCRIBE / EXPLAIN
(clickeval_spark/readonly.py), so a stray DELETE or VACUUM cannot touch the tables.
"""

import sys

from pyspark.errors import PySparkException

from clickeval_spark.errors import ClickevalError
from clickeval_spark.readonly import not_read_only
from clickeval_spark.runtime import run_job
from clickeval_spark.tables import register_tables


def add_arguments(parser) -> None:
    parser.add_argument("query", help="a Spark SQL query, e.g. \"SELECT model, value FROM metrics WHERE metric = 'LL'\"")
    parser.add_argument("--limit", type=int, default=200, help="rows to print (default 200)")
    parser.add_argument("--allow-writes", action="store_true",
                        help="also run statements that are not queries (DELETE, INSERT, VACUUM, SET, ...)")


def run_sql(spark, cfg, warehouse, run_id, args) -> None:
    if not args.allow_writes:
        kind = not_read_only(spark, args.query)
        if kind:
            raise ClickevalError(f"refused: the statement is a {kind}, not a query; clickeval sql runs only "
                                 "SELECT, WITH, VALUES, SHOW, DESCRIBE and EXPLAIN unless --allow-writes is given")
    registered = register_tables(spark, warehouse)
    try:
        result = spark.sql(args.query)
        result.show(n=args.limit, truncate=False)
    except PySparkException as exc:
        first = str(exc).strip().splitlines()[0]
        raise ClickevalError(f"query failed: {first} (tables: {', '.join(registered) or 'none yet'})") from None


def main(argv=None) -> int:
    return run_job("sql", argv, run_sql, add_arguments)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
