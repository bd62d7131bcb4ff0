"""Quiet by default: a command prints the project's own lines; the JVM's output (Spark's log4j, Ivy, the JVM's
warnings) goes to <warehouse>/_logs/<run_id>.log, which an error line names; --verbose puts it back on stderr,
with the EM loop's DEBUG lines (every pass). A fit logs one INFO line per model; at a terminal the stages and
the passes show as progress bars, elsewhere (a pipe, CI) as plain lines. Separate processes: the JVM is started
by the command itself, as on a user's terminal."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from jobs import ingest as ingest_job
from tests.spark_settings import PROCESS_CONF

ROOT = Path(__file__).resolve().parent.parent
# what Spark, Ivy and the JVM print when they start (Ivy resolves Delta's jars in every embedded session)
JVM_MARKERS = ("log4j", ":: loading settings", "Ivy Default Cache", "WARN", "WARNING:")


ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
#: a pipeline small enough for a test: two fitted models, one generator, the dcm surrogate
TINY = {"spark": {"warehouse": "wh", "master": "local[2]", "conf": {"spark.ui.enabled": "false",
                                                                    "spark.sql.shuffle.partitions": "2",
                                                                    **PROCESS_CONF}},
        "ingest": {"dataset": "tiny", "format": "synthetic", "split": {"seed": 11, "ratios": {"train": 2, "valid": 1,
                                                                                              "test": 1}},
                   "synthetic": {"model": "pbm", "n_serps": 400, "n_queries": 20, "docs_per_query": 12,
                                 "labels": "serp", "label_fraction": 0.5, "seed": 5}},
        "fit": {"models": ["rctr", "pbm"], "iterations": 4, "tol": None},
        "predict": {"splits": ["test"]},
        "evaluate": {"replicates": 5, "reference_model": "rctr"},
        "generate": {"generators": ["pbm"], "samples": 2, "list_orders": ["original"]},
        "surrogate": {"model": "dcm", "iterations": 2},
        "report": {"path": "reports"}}


def _env() -> dict[str, str]:
    """The environment of a user's shell: none of the variables a scheduler or CI sets (progress.UNATTENDED)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTEST_CURRENT_TEST", "CI", "AIRFLOW_CTX_DAG_ID", "PYSPARK_GATEWAY_PORT")}
    env["PYTHONPATH"] = str(ROOT)
    return env


def _clickeval(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "clickeval_spark.cli", *args], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=600)


def _clickeval_at_a_terminal(tmp_path: Path, *args: str) -> tuple[int, str, str]:
    """The command with its stderr on a pseudo-terminal (stdout a pipe): (exit code, stdout, what the terminal
    got)."""
    master, slave = pty.openpty()
    env = {**_env(), "TERM": "xterm-256color", "COLUMNS": "100"}
    proc = subprocess.Popen([sys.executable, "-m", "clickeval_spark.cli", *args], cwd=tmp_path, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    screen = bytearray()

    def read() -> None:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:   # EIO: the last writer closed the terminal
                return
            if not chunk:
                return
            screen.extend(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    out = proc.stdout.read().decode()
    code = proc.wait(timeout=600)
    reader.join(timeout=30)
    os.close(master)
    return code, out, screen.decode(errors="replace")


@pytest.mark.slow
def test_an_error_is_one_line_naming_the_log_that_holds_the_jvm_output(tmp_path):
    (tmp_path / "c.yaml").write_text(json.dumps({"spark": {"warehouse": "wh", "master": "local[1]",
                                                           "conf": {"spark.ui.enabled": "false", **PROCESS_CONF}}}))
    proc = _clickeval(tmp_path, "predict", "--conf", "c.yaml", "--run-id", "quiet-1")
    log = tmp_path / "wh" / "_logs" / "quiet-1.log"
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        f"clickeval predict: error: table serps does not exist yet under {tmp_path / 'wh'}: run `clickeval ingest` "
        f"first (Spark's log: {log})"]
    assert [line.split("] ", 1)[1] for line in proc.stdout.splitlines()] == [
        "predict: start (run_id=quiet-1, dataset=synthetic)", "predict: failed after " +
        proc.stdout.splitlines()[1].split("failed after ", 1)[1]]
    text = log.read_text()
    assert all(marker in text for marker in JVM_MARKERS), text[:2000]

    # --verbose: the same output on stderr, no log file
    verbose = _clickeval(tmp_path, "predict", "--conf", "c.yaml", "--run-id", "quiet-2", "--verbose")
    assert verbose.returncode == 2
    assert all(marker in verbose.stderr for marker in JVM_MARKERS[:3]), verbose.stderr[:2000]
    assert verbose.stderr.splitlines()[-1].startswith("clickeval predict: error: table serps does not exist yet")
    assert "Spark's log" not in verbose.stderr
    assert not (tmp_path / "wh" / "_logs" / "quiet-2.log").exists()


@pytest.mark.slow
def test_a_pipe_gets_one_info_line_per_fit_verbose_every_pass_and_a_terminal_bars(spark, tmp_path):
    (tmp_path / "c.yaml").write_text(json.dumps(TINY))
    # the log, ingested by this test's session (what is checked is the fits' output, each its own process)
    (tmp_path / "ingest.yaml").write_text(json.dumps({**TINY, "spark": {"warehouse": str(tmp_path / "wh"), "conf": {}}}))
    assert ingest_job.main(["--conf", str(tmp_path / "ingest.yaml"), "--run-id", "tiny-1"]) == 0
    proc = _clickeval(tmp_path, "fit", "--conf", "c.yaml", "--run-id", "tiny-1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    err = proc.stderr.splitlines()
    # one INFO line per model, nothing per pass
    infos = [line.split(" clickeval INFO ", 1)[1] for line in err if " clickeval INFO " in line]
    assert [line.split(":", 1)[0] for line in infos] == ["rctr", "pbm"], err
    assert re.match(r"pbm: 4 passes, prior \S+( seen->rank)? chosen by valid LL, ", infos[1]), infos
    assert not [line for line in err if " DEBUG " in line or " iteration " in line], err
    assert not ANSI.search(proc.stdout + proc.stderr)                 # plain lines: no bars in a pipe
    assert len(proc.stdout.splitlines()) + len(err) == 2 + 2 + 2      # the stage's start and end, a line per model

    # --verbose (-v): every candidate's every pass at DEBUG, still no bars
    verbose = _clickeval(tmp_path, "fit", "--conf", "c.yaml", "--run-id", "tiny-1", "-v")
    assert verbose.returncode == 0, verbose.stderr[-3000:]
    debug = [line for line in verbose.stderr.splitlines() if " clickeval DEBUG " in line]
    assert sum(" pbm k=" in line and " iteration 3: train LL " in line for line in debug) >= 2, debug
    assert any(" pbm final pass: " in line for line in debug), debug
    assert not ANSI.search(verbose.stderr)

    # at a terminal: bars for the stage and each model's passes, gone at the end; the plain lines stay
    code, out, screen = _clickeval_at_a_terminal(tmp_path, "fit", "--conf", "c.yaml", "--run-id", "tiny-1")
    assert code == 0, screen[-3000:]
    shown = ANSI.sub("", screen).replace("\r", "\n")
    assert re.search(r"pbm +━+ +4/4 passes", shown), screen[-3000:]
    assert re.search(r"fit +[━╺╸ ]+ +\d:\d\d:\d\d", shown), screen[-3000:]
    assert "clickeval INFO pbm: 4 passes" in shown                     # the log line, above the bars
    assert [line for line in out.splitlines() if line.startswith("fit ")] == [
        line for line in proc.stdout.splitlines() if line.startswith("fit ")]
