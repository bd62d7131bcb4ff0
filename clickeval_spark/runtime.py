"""What every job entry point shares: argument parsing, config, session, run id, error reporting.

Jobs stay thin: `main(argv) -> int` parses args here, builds the session here,
and hands the session and the frozen config to library code.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from datetime import datetime, timezone
from typing import Callable, Sequence

import yaml
from pyspark.logger import PySparkLogger
from pyspark.sql import SparkSession

from clickeval_spark.config import PROJECT_ROOT, AppConfig, load_config, resolve_location, validate_run_id
from clickeval_spark.errors import ClickevalError, ConfigError
from clickeval_spark.session import build_session

DEFAULT_CONF = PROJECT_ROOT / "conf" / "local.yaml"


def parse_args(job: str, argv: Sequence[str] | None,
               add_arguments: Callable[[argparse.ArgumentParser], None] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=f"clickeval {job}", description=f"clickeval-spark {job} job")
    if add_arguments:
        add_arguments(parser)
    parser.add_argument("--conf", default=str(DEFAULT_CONF), help="conf/<env>.yaml (default: conf/local.yaml)")
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
    cfg = load_config(args.conf, overrides)
    run_id = args.run_id or cfg.run_id or f"{cfg.env}-{datetime.now(timezone.utc):%Y%m%dT%H%M%S}"
    return cfg, validate_run_id(run_id)


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
        spark = session_for(cfg, job)
        extra = (args,) if add_arguments else ()
        body(spark, cfg, warehouse_root(cfg), run_id, *extra)
        return 0
    except ClickevalError as exc:
        print(f"clickeval {job}: error: {exc}", file=sys.stderr)
        return 2
