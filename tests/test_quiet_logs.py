"""Quiet by default (issue 39): a command prints the project's own lines; the JVM's output (Spark's log4j, Ivy,
the JVM's warnings) goes to <warehouse>/_logs/<run_id>.log, which an error line names; --verbose puts it back
on stderr. Separate processes: the JVM is started by the command itself, as on a user's terminal."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# what Spark, Ivy and the JVM print when they start (Ivy resolves Delta's jars in every embedded session)
JVM_MARKERS = ("log4j", ":: loading settings", "Ivy Default Cache", "WARN", "WARNING:")


def _clickeval(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-m", "clickeval_spark.cli", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_an_error_is_one_line_naming_the_log_that_holds_the_jvm_output(tmp_path):
    (tmp_path / "c.yaml").write_text(json.dumps({"spark": {"warehouse": "wh", "master": "local[1]",
                                                           "conf": {"spark.ui.enabled": "false"}}}))
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
