"""What the command line needs before a stage runs: the config with its --set overrides, the run id,
a check that local input files exist, and the session. clickeval_spark.cli puts them together."""

from __future__ import annotations

import glob
import os
import sys
import tempfile
from datetime import datetime, timezone
from typing import Sequence
from urllib.parse import unquote, urlsplit

import yaml
from pyspark.sql import SparkSession

from clickeval_spark.config import (AppConfig, input_locations, is_uri, load_config, resolve_location,
                                    resolve_locations, validate_run_id)
from clickeval_spark.errors import ClickevalError, ConfigError, InputError
from clickeval_spark.session import build_session

# relative to the working directory, like every location in the config
DEFAULT_CONF = os.path.join("conf", "local.yaml")
# the stages whose input files a verb reads, checked before the session starts (default: the verb itself)
JOB_STAGES = {"run": ("ingest", "evaluate", "generate")}


def load(conf: str, sets: Sequence[str] = (), run_id: str | None = None) -> tuple[AppConfig, str]:
    """The config file `conf` with `--set KEY=VALUE` overrides `sets`, and the run id (given, from the
    config, else '<env>-<UTC timestamp>')."""
    overrides = {}
    for item in sets:
        key, sep, value = item.partition("=")
        if not sep:
            raise ClickevalError(f"--set {item!r}: expected KEY=VALUE")
        try:  # safe_load: a value is data (no !!python tags), never code
            overrides[key] = yaml.safe_load(value)
        except (yaml.YAMLError, ValueError) as exc:   # ValueError: a date that does not exist (2026-02-30)
            raise ConfigError(f"--set {key}: not a YAML value ({str(exc).splitlines()[0]})") from None
    cfg = resolve_locations(load_config(conf, overrides))
    run_id = run_id or cfg.run_id or f"{cfg.env}-{datetime.now(timezone.utc):%Y%m%dT%H%M%S}"
    return cfg, validate_run_id(run_id)


def check_local_inputs(cfg: AppConfig, job: str, running: Sequence[str] | None = None) -> None:
    """Every local input file the job reads exists: checked before the Spark session starts (which takes
    half a minute and prints Ivy's chatter). Local means a file: URI, or a plain path in embedded mode
    (on a cluster a plain path belongs to the cluster's default file system). Other URIs (s3a://,
    hdfs://) are left to Spark; so are Hadoop brace globs ({a,b}), which Python's glob does not know.
    ``running``: the stages that will run (`run --from`), when not all of the job's."""
    stages = tuple(s for s in JOB_STAGES.get(job, (job,)) if running is None or s in running)
    for key, location in input_locations(cfg, stages):
        if not _is_local(cfg, location):
            continue
        path = _local_path(location)
        if "{" in path:
            continue
        found = glob.glob(path) if glob.has_magic(path) else os.path.exists(path)
        if not found:
            raise InputError(f"{key}: {path}: no such file or folder")


def _is_local(cfg: AppConfig, location: str) -> bool:
    """A file: URI, or a plain path in embedded mode without another default file system (on a cluster, or
    with spark.hadoop.fs.defaultFS, a plain path belongs to that file system)."""
    plain_is_local = cfg.spark.mode == "embedded" and "spark.hadoop.fs.defaultFS" not in cfg.spark.conf
    return location.startswith("file:") or (plain_is_local and not is_uri(location))


def _local_path(location: str) -> str:
    """file:/x, file:///x and plain paths as a local path."""
    if not location.startswith("file:"):
        return location
    return unquote(urlsplit(location).path)


def warehouse_root(cfg: AppConfig) -> str:
    return resolve_location(cfg.spark.warehouse)


def log_file_for(cfg: AppConfig, run_id: str, verbose: bool = False) -> str | None:
    """Where an embedded run's JVM writes Spark's, Ivy's and the JVM's own output: <warehouse>/_logs/<run_id>.log
    (a warehouse in object storage: the temp folder). None, and they go to stderr, with --verbose or under
    spark-submit, whose driver log is where a cluster's operators look."""
    if verbose or cfg.spark.mode != "embedded":
        return None
    root = warehouse_root(cfg)
    folder = os.path.join(tempfile.gettempdir(), "clickeval-logs")
    if _is_local(cfg, root):
        local = os.path.join(_local_path(root), "_logs")
        try:   # a warehouse the user may read but not write (an analyst's `clickeval sql`): the temp folder
            os.makedirs(local, exist_ok=True)
            if os.access(local, os.W_OK):
                folder = local
        except OSError:
            pass
    return os.path.join(folder, f"{validate_run_id(run_id)}.log")


def session_for(cfg: AppConfig, job: str, log_file: str | None = None) -> SparkSession:
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
        checkpoint_dir=cfg.spark.checkpoint_dir,   # absolute: resolve_locations
        log_file=log_file,
    )


def interactive() -> bool:
    return sys.stderr.isatty() and not os.environ.get("CI") and "PYTEST_CURRENT_TEST" not in os.environ
