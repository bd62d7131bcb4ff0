"""What every job entry point shares: argument parsing, config, session, run id, error reporting.

Jobs stay thin: `main(argv) -> int` parses args here, builds the session here,
and hands the session and the frozen config to library code.
"""

from __future__ import annotations

import argparse
import glob
import logging
import os
import sys
from datetime import datetime, timezone
from typing import Callable, Sequence
from urllib.parse import unquote, urlsplit

import yaml
from pyspark.logger import PySparkLogger
from pyspark.sql import SparkSession

from clickeval_spark.config import (AppConfig, input_locations, is_uri, load_config, resolve_location,
                                    resolve_locations, validate_run_id)
from clickeval_spark.errors import ClickevalError, ConfigError, InputError
from clickeval_spark.session import build_session

# relative to the working directory, like every location in the config
DEFAULT_CONF = os.path.join("conf", "local.yaml")
# the pipeline stages each job runs, for the input files to check before the session starts
JOB_STAGES = {"pipeline": ("ingest", "evaluate", "generate")}


def parse_args(job: str, argv: Sequence[str] | None,
               add_arguments: Callable[[argparse.ArgumentParser], None] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=f"clickeval {job}", description=f"clickeval-spark {job} job")
    if add_arguments:
        add_arguments(parser)
    parser.add_argument("--conf", default=DEFAULT_CONF,
                        help="conf/<env>.yaml (default: conf/local.yaml in the working directory)")
    parser.add_argument("--run-id", help="run id (default: from config, else '<env>-<UTC timestamp>')")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE",
        help="override a config key, e.g. --set ingest.dataset=trec (value parsed as YAML)",
    )
    return parser.parse_args(list(argv) if argv is not None else None)


def load(args: argparse.Namespace) -> tuple[AppConfig, str]:
    overrides = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise ClickevalError(f"--set {item!r}: expected KEY=VALUE")
        try:  # safe_load: a value is data (no !!python tags), never code
            overrides[key] = yaml.safe_load(value)
        except yaml.YAMLError as exc:
            raise ConfigError(f"--set {key}: not a YAML value ({str(exc).splitlines()[0]})") from None
    cfg = resolve_locations(load_config(args.conf, overrides))
    run_id = args.run_id or cfg.run_id or f"{cfg.env}-{datetime.now(timezone.utc):%Y%m%dT%H%M%S}"
    return cfg, validate_run_id(run_id)


def check_local_inputs(cfg: AppConfig, job: str) -> None:
    """Every local input file the job reads exists: checked before the Spark session starts (which takes
    half a minute and prints Ivy's chatter). Local means a file: URI, or a plain path in embedded mode
    (on a cluster a plain path belongs to the cluster's default file system). Other URIs (s3a://,
    hdfs://) are left to Spark; so are Hadoop brace globs ({a,b}), which Python's glob does not know."""
    plain_is_local = cfg.spark.mode == "embedded" and "spark.hadoop.fs.defaultFS" not in cfg.spark.conf
    for key, location in input_locations(cfg, JOB_STAGES.get(job, (job,))):
        if not location.startswith("file:") and (is_uri(location) or not plain_is_local):
            continue
        path = _local_path(location)
        if "{" in path:
            continue
        found = glob.glob(path) if glob.has_magic(path) else os.path.exists(path)
        if not found:
            raise InputError(f"{key}: {path}: no such file or folder")


def _local_path(location: str) -> str:
    """file:/x, file:///x and plain paths as a local path."""
    if not location.startswith("file:"):
        return location
    return unquote(urlsplit(location).path)


def warehouse_root(cfg: AppConfig) -> str:
    return resolve_location(cfg.spark.warehouse)


def session_for(cfg: AppConfig, job: str) -> SparkSession:
    embedded = cfg.spark.mode == "embedded"
    conf = dict(cfg.spark.conf)
    # Spark's progress bar for a person at a terminal; never in CI, tests or scheduler logs
    conf.setdefault("spark.ui.showConsoleProgress", str(interactive()).lower())
    return build_session(
        f"clickeval-{job}",
        master=cfg.spark.master if embedded else None,
        warehouse=warehouse_root(cfg),
        embedded=embedded,
        conf=conf,
        checkpoint_dir=resolve_location(cfg.spark.checkpoint_dir) if cfg.spark.checkpoint_dir else None,
    )


def interactive() -> bool:
    return sys.stderr.isatty() and not os.environ.get("CI") and "PYTEST_CURRENT_TEST" not in os.environ


def run_job(job: str, argv: Sequence[str] | None, body: Callable[..., object],
            add_arguments: Callable[[argparse.ArgumentParser], None] | None = None) -> int:
    """Parse, configure, run `body(spark, cfg, warehouse, run_id)` (plus the parsed args when the job adds
    arguments of its own); known errors become one line and exit 2."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    for name in ("SQLQueryContextLogger", "DataFrameQueryContextLogger"):
        # PySpark logs every analysis error as a JSON record; jobs report errors themselves, in one line
        PySparkLogger.getLogger(name).disabled = True
    try:
        args = parse_args(job, argv, add_arguments)
        cfg, run_id = load(args)
        check_local_inputs(cfg, job)
        spark = session_for(cfg, job)
        extra = (args,) if add_arguments else ()
        body(spark, cfg, warehouse_root(cfg), run_id, *extra)
        return 0
    except ClickevalError as exc:
        print(f"clickeval {job}: error: {exc}", file=sys.stderr)
        return 2
