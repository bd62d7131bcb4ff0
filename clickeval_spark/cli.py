"""`clickeval <verb> [--conf conf/<env>.yaml] [--run-id ID] [--set key=value ...]`.

Verbs: every stage of clickeval_spark.stages.STAGES, `run` (alias `pipeline`: every stage in one
session), `tables` (row counts and Delta versions) and `sql "<query>"` (read-only by default).
jobs/<verb>.py is the same command for spark-submit: each file is `job_source(verb)`, and a test
keeps them so (`python -m clickeval_spark.cli --write-jobs jobs` rewrites them).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Sequence

from pyspark.errors import PySparkException
from pyspark.logger import PySparkLogger

from clickeval_spark import progress, tables
from clickeval_spark.catalog import BY_RANK_VIEW, namespace, with_time_travel
from clickeval_spark.context import StageContext
from clickeval_spark.errors import ClickevalError
from clickeval_spark.readonly import PATH_READ, not_read_only
from clickeval_spark.runtime import (DEFAULT_CONF, check_local_inputs, load, log_file_for, session_for,
                                    warehouse_root)
from clickeval_spark.stages import STAGES, run_pipeline, stages_from


def list_tables(ctx: StageContext, args: argparse.Namespace) -> None:
    """`clickeval tables`: every result table with its row count, latest Delta version and last write."""
    print(f"warehouse: {ctx.warehouse}")
    print(f"{'table':<24}{'rows':>12}{'version':>9}  last write")
    for name in tables.SCHEMAS:
        if not ctx.exists(name):
            print(f"{name:<24}{'-':>12}{'-':>9}  (not written yet)")
            continue
        last = ctx.last_commit(name)
        print(f"{name:<24}{ctx.read(name).count():>12}{last['version']:>9}  {last['timestamp']:%Y-%m-%d %H:%M:%S} "
              f"{last['userMetadata'] or ''}")


def run_sql(ctx: StageContext, args: argparse.Namespace) -> None:
    """`clickeval sql "<query>"`: Spark SQL with every result table available by its name, time travel included.
    Read-only unless --allow-writes: a query or a SHOW / DESCRIBE / EXPLAIN of tables by name, calling Spark's
    built-in functions only, without Java reflection (readonly.py)."""
    # the names first: the read-only check analyses the statement, which resolves them. With a catalog they
    # resolve through it (its database the current one; the stages registered them, and an analyst may hold
    # read grants only); without, as temp views of the warehouse's tables
    catalog = ctx.cfg.tables.catalog
    if catalog is None:
        registered = ctx.register_temp_views()
    else:
        database = namespace(ctx.spark, catalog.database)
        if not ctx.spark.catalog.databaseExists(database):
            raise ClickevalError(f"tables.catalog.database: {database} does not exist in the session's catalog; run "
                                 "a stage with tables.catalog set (e.g. `clickeval report`) to register the tables")
        registered = [*tables.SCHEMAS, BY_RANK_VIEW]
        for name in registered:   # a temp view of the same name (an earlier call in this session) would shadow it
            ctx.spark.catalog.dropTempView(name)
        ctx.spark.sql("USE IDENTIFIER(:database)", args={"database": database})
    check = None if args.allow_writes else (lambda statement: _check_read_only(ctx, statement))
    # Spark's own switch: no `<format>.`<path>`` read as files, whatever the check sees (a view's definition);
    # put back after, for a session that goes on (a notebook, the tests)
    files_conf = "spark.sql.runSQLOnFiles"
    files_before = ctx.spark.conf.get(files_conf)
    if check:
        ctx.spark.conf.set(files_conf, "false")
    try:
        statement = args.query
        if check:
            check(statement)
        # time travel on the temp views: a temp view of that version in the relation's place, checked again
        travelled = with_time_travel(ctx.spark, ctx.warehouse, statement, check)
        if check and travelled != statement:
            check(travelled)
        ctx.spark.sql(travelled).show(n=args.limit, truncate=False)
    except PySparkException as exc:
        first = str(exc).strip().splitlines()[0]
        raise ClickevalError(f"query failed: {first} (tables: {', '.join(registered) or 'none yet'})") from None
    finally:
        ctx.spark.conf.set(files_conf, files_before)


def _check_read_only(ctx: StageContext, statement: str) -> None:
    kind = not_read_only(ctx.spark, statement)
    if kind and kind.startswith("call to"):
        raise ClickevalError(f"refused: the query makes a {kind}; clickeval sql runs only Spark's built-in "
                             "functions, without Java reflection, unless --allow-writes is given")
    if kind and kind.startswith(PATH_READ):
        raise ClickevalError(f"refused: the statement makes a {kind}; clickeval sql reads only the warehouse's "
                             "tables, by their names, unless --allow-writes is given")
    if kind:
        raise ClickevalError(f"refused: the statement is a {kind}, not a query; clickeval sql runs only "
                             "SELECT, WITH, VALUES, SHOW, DESCRIBE and EXPLAIN unless --allow-writes is given")


# verb -> what it runs; the stages come from the registry
COMMANDS: dict[str, Callable[[StageContext, argparse.Namespace], object]] = {
    **{name: (lambda ctx, args, stage=stage: stage(ctx)) for name, stage in STAGES.items()},
    "run": lambda ctx, args: run_pipeline(ctx, args.start),
    "tables": list_tables,
    "sql": run_sql,
}
ALIASES = {"pipeline": "run"}


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--conf", default=DEFAULT_CONF,
                        help="conf/<env>.yaml (default: conf/local.yaml in the working directory)")
    common.add_argument("--run-id", help="run id (default: from config, else '<env>-<UTC timestamp>')")
    common.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key, e.g. --set ingest.dataset=trec (value parsed as YAML)")
    common.add_argument("-v", "--verbose", action="store_true",
                        help="the run's DEBUG lines (every EM pass of every candidate) and Spark's, Ivy's and the "
                             "JVM's output (Spark at WARN) on stderr, instead of the run's log file "
                             "<warehouse>/_logs/<run_id>.log; no progress bars")
    parser = argparse.ArgumentParser(prog="clickeval", description="clickeval-spark: click-model evaluation on "
                                     "search logs (DESIGN.md §2: ingest → fit → predict → evaluate → generate → "
                                     "surrogate → report)")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    for name, stage in STAGES.items():
        verb = verbs.add_parser(name, parents=[common], help=stage.summary, description=stage.summary)
        if name == "report":
            verb.add_argument("--trend", action="store_true",
                              help="also write the dataset's trend page: every model's LL, PPL and NDCG@10 "
                                   "across its runs, by window end (same as --set report.trend=true)")
    run = verbs.add_parser("run", aliases=list(ALIASES), parents=[common],
                           help="every stage in order in one session (the main job)")
    run.add_argument("--from", dest="start", choices=list(STAGES), metavar="STAGE",
                     help="start at this stage, reading what the earlier stages wrote for the same "
                          f"--run-id (one of {', '.join(STAGES)})")
    verbs.add_parser("tables", parents=[common], help="row count, Delta version and last write of every table")
    sql = verbs.add_parser("sql", parents=[common], help="a read-only Spark SQL query over the tables")
    sql.add_argument("query", help="a Spark SQL query, e.g. \"SELECT model, value FROM metrics WHERE metric = 'LL'\"")
    sql.add_argument("--limit", type=int, default=200, help="rows to print (default 200)")
    sql.add_argument("--allow-writes", action="store_true",
                     help="also run statements that are not queries (DELETE, INSERT, VACUUM, SET, ...)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse, configure, build the session, run the verb; a known error becomes one line and exit 2."""
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    verb = ALIASES.get(args.verb, args.verb)
    # the handler writes to sys.stderr as it is when a line comes: under progress bars, their proxy
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT, handlers=[progress.StderrHandler()])
    logging.getLogger("py4j").setLevel(logging.WARNING)
    for name in ("SQLQueryContextLogger", "DataFrameQueryContextLogger"):
        # PySpark logs every analysis error as a JSON record; jobs report errors themselves, in one line
        PySparkLogger.getLogger(name).disabled = True
    log_file = None
    try:
        sets = [*args.set, *(["report.trend=true"] if getattr(args, "trend", False) else [])]
        cfg, run_id = load(args.conf, sets, args.run_id)
        start = getattr(args, "start", None)
        if start and start != next(iter(STAGES)) and not (args.run_id or cfg.run_id):
            raise ClickevalError(f"--from {start} resumes a run: give its --run-id (or run_id in the config)")
        # `run --from fit` reads no ingest input: only the stages that will run are checked
        check_local_inputs(cfg, verb, stages_from(start) if start else None)
        log_file = log_file_for(cfg, run_id, args.verbose)
        ctx = StageContext(session_for(cfg, verb, log_file), cfg, warehouse_root(cfg), run_id)
        if log_file and os.path.exists(log_file):
            _library_logs_to(log_file)
        with project_logs_at(logging.DEBUG if args.verbose else None):
            if verb in STAGES or verb == "run":   # bars at a terminal; `sql` and `tables` print tables
                with progress.session(verbose=args.verbose):
                    COMMANDS[verb](ctx, args)
            else:
                COMMANDS[verb](ctx, args)
        return 0
    except ClickevalError as exc:
        print(f"clickeval {verb}: error: {exc}{_log_hint(log_file)}", file=sys.stderr)
        return 2
    except Exception as exc:
        if log_file and os.path.exists(log_file):
            exc.add_note(f"Spark's log: {log_file}")
        raise


LOG_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"
#: the project's loggers: the stages' ("clickeval", also handed to the EM loop) and the modules'
PROJECT_LOGGERS = ("clickeval", "clickeval_spark")


@contextmanager
def project_logs_at(level: int | None) -> Iterator[None]:
    """The project's loggers at ``level`` while the command runs (None: as they are, INFO from the root);
    not the root's, whose DEBUG would bring every library's (numba's, matplotlib's)."""
    loggers = [logging.getLogger(name) for name in PROJECT_LOGGERS]
    before = [logger.level for logger in loggers]
    try:
        if level is not None:
            for logger in loggers:
                logger.setLevel(level)
        yield
    finally:
        for logger, old in zip(loggers, before):
            logger.setLevel(old)


def _library_logs_to(log_file: str) -> None:
    """py4j's and pyspark's Python log records go where the JVM's output went, not to the terminal."""
    handler = logging.FileHandler(log_file)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    for name in ("py4j", "pyspark"):
        logger = logging.getLogger(name)
        logger.addHandler(handler)
        logger.propagate = False


def _log_hint(log_file: str | None) -> str:
    return f" (Spark's log: {log_file})" if log_file and os.path.exists(log_file) else ""


JOB_VERBS = (*STAGES, "pipeline", "tables", "sql")


def job_source(verb: str) -> str:
    """jobs/<verb>.py: the spark-submit entry point of `clickeval <verb>`. It checks the Python first
    (build_info.python_problem: one line and exit 2 under another minor version than the build's), before
    the CLI imports pyspark and numpy."""
    return (f'"""spark-submit entry point of `clickeval {verb}` (generated by clickeval_spark.cli.job_source)."""\n'
            "\n"
            "import sys\n"
            "\n"
            "from clickeval_spark.build_info import python_problem\n"
            "\n"
            "\n"
            "def main(argv=None) -> int:\n"
            "    if problem := python_problem():  # another Python than the build's: before pyspark or numpy\n"
            "        print(problem, file=sys.stderr)\n"
            "        return 2\n"
            "    from clickeval_spark import cli\n"
            "\n"
            f'    return cli.main(["{verb}", *(sys.argv[1:] if argv is None else argv)])\n'
            "\n"
            "\n"
            'if __name__ == "__main__":\n'
            "    sys.exit(main())\n")


def write_job_files(folder: str) -> None:
    for verb in JOB_VERBS:
        (Path(folder) / f"{verb}.py").write_text(job_source(verb))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--write-jobs"]:
        write_job_files(sys.argv[2])
        sys.exit(0)
    sys.exit(main())
