"""Issue 15: relative locations resolve against the working directory (never the installed package), and a
missing local input file is reported in one line before the Spark session starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from delta.tables import DeltaTable

from clickeval_spark import tables
from clickeval_spark.config import (AppConfig, EvaluateConfig, ExternalModelConfig, ExternalSequencesConfig,
                                    GenerateConfig, IngestConfig, ReportConfig, SparkConfig, resolve_location,
                                    resolve_locations)
from clickeval_spark.errors import InputError
from clickeval_spark.runtime import check_local_inputs
from jobs import ingest as ingest_job
from jobs import report as report_job

ROOT = Path(__file__).resolve().parents[1]


def test_resolve_location_uses_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resolve_location("warehouse") == str(tmp_path / "warehouse")
    assert resolve_location("../data/x.txt") == str(tmp_path.parent / "data" / "x.txt")
    for kept in ("/abs/wh", "s3a://bucket/wh", "file:///tmp/wh", "file:/tmp/wh", "abfss://c@a.dfs.core.windows.net/x"):
        assert resolve_location(kept) == kept


def _every_location(value: str) -> AppConfig:
    return AppConfig(
        spark=SparkConfig(warehouse=value),
        ingest=IngestConfig(format="per_query_text", paths={"train": value, "test": value}, labels=value),
        evaluate=EvaluateConfig(external=(ExternalModelConfig(name="ncm", predictions=value, relevance_scores=value),)),
        generate=GenerateConfig(external=(ExternalSequencesConfig(name="ncm", path=value),)),
        report=ReportConfig(path=value),
    )


def _locations(cfg: AppConfig) -> list[str]:
    ext, seq = cfg.evaluate.external[0], cfg.generate.external[0]
    return [cfg.spark.warehouse, *cfg.ingest.paths.values(), cfg.ingest.labels, ext.predictions,
            ext.relevance_scores, seq.path, cfg.report.path]


def test_every_location_key_resolves_against_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    resolved = resolve_locations(_every_location("rel/x"))
    assert _locations(resolved) == [str(tmp_path / "rel" / "x")] * 8
    assert _locations(resolve_locations(_every_location("s3a://b/x"))) == ["s3a://b/x"] * 8


def test_missing_local_inputs_name_their_key(tmp_path):
    present = tmp_path / "there.txt"
    present.write_text("x")
    missing = str(tmp_path / "gone.txt")
    cfg = _every_location(str(present))
    check_local_inputs(cfg, "run")  # every input exists: nothing raised
    cases = [
        (IngestConfig(format="per_query_text", paths={"train": str(present), "test": missing}), "ingest",
         f"ingest.paths.test: {missing}: no such file or folder"),
        (IngestConfig(format="per_query_text", paths={"train": str(present)}, labels=missing), "ingest",
         f"ingest.labels: {missing}: no such file or folder"),
        (IngestConfig(format="per_query_text", paths={"all": str(tmp_path / "*.gz")}), "ingest",
         f"ingest.paths.all: {tmp_path / '*.gz'}: no such file or folder"),  # a glob that matches nothing
        (IngestConfig(format="parquet", paths={"all": "file://" + missing}), "run",
         f"ingest.paths.all: {missing}: no such file or folder"),
    ]
    for ingest, job, message in cases:
        with pytest.raises(InputError) as err:
            check_local_inputs(AppConfig(ingest=ingest), job)
        assert str(err.value) == message
    external = AppConfig(evaluate=EvaluateConfig(external=(ExternalModelConfig(
        name="ncm", predictions=str(present), relevance_scores=missing),)))
    with pytest.raises(InputError, match=r"^evaluate.external\[ncm\].relevance_scores: .*gone.txt: no such file"):
        check_local_inputs(external, "evaluate")
    check_local_inputs(external, "fit")  # fit reads no external file: not its business
    # `run --from STAGE` checks only the stages that will run: a resumed run does not ingest again
    no_input = AppConfig(ingest=IngestConfig(format="per_query_text", paths={"all": missing}))
    with pytest.raises(InputError, match=r"^ingest.paths.all: "):
        check_local_inputs(no_input, "run", ("ingest", "fit"))
    check_local_inputs(no_input, "run", ("fit", "predict"))
    sequences = AppConfig(generate=GenerateConfig(external=(ExternalSequencesConfig(name="ncm", path=missing),)))
    with pytest.raises(InputError, match=r"^generate.external\[ncm\].path: .*gone.txt: no such file"):
        check_local_inputs(sequences, "generate")
    # left to Spark: object stores, Hadoop brace globs, and plain paths on a cluster (its default file system)
    check_local_inputs(AppConfig(ingest=IngestConfig(format="parquet", paths={"all": "s3a://b/none"})), "ingest")
    check_local_inputs(AppConfig(ingest=IngestConfig(format="parquet", paths={"all": missing + "{a,b}"})), "ingest")
    check_local_inputs(AppConfig(spark=SparkConfig(mode="cluster", master=None),
                                 ingest=IngestConfig(format="parquet", paths={"all": missing})), "ingest")


def test_missing_input_fails_before_the_spark_session(tmp_path):
    """A separate process: the error comes without Spark's start-up (no JVM, no Ivy lines), in one line,
    with the relative path resolved against the directory the job was started in."""
    (tmp_path / "c.yaml").write_text(json.dumps({"spark": {"warehouse": "wh"}}))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "clickeval_spark.cli", "ingest", "--conf", "c.yaml", "--set", "ingest.format=yandex",
         "--set", "ingest.paths={all: logs/day1.txt}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    seconds = time.monotonic() - t0
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        f"clickeval ingest: error: ingest.paths.all: {tmp_path / 'logs' / 'day1.txt'}: no such file or folder"]
    assert not (tmp_path / "wh").exists()
    print(f"missing input reported after {seconds:.1f} s")


@pytest.mark.slow
def test_jobs_read_and_write_relative_to_the_working_directory(spark, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "day1.txt").write_text("s1\tq1\t[1, 2]\t[0, 0]\t[0, 1]\n")
    (tmp_path / "c.yaml").write_text(json.dumps({"spark": {"warehouse": "wh", "conf": {}}, "report": {"path": "out"},
                                                 "ingest": {"dataset": "rel", "format": "per_query_text",
                                                            "paths": {"test": "logs/day1.txt"}}}))
    assert ingest_job.main(["--conf", "c.yaml", "--run-id", "rel-1"]) == 0
    assert DeltaTable.isDeltaTable(spark, str(tmp_path / "wh" / "serps"))
    assert [r["serp_id"] for r in tables.read_table(spark, str(tmp_path / "wh"), "serps").collect()] == ["s1-1"]
    assert report_job.main(["--conf", "c.yaml", "--run-id", "rel-1"]) == 0
    assert (tmp_path / "out" / "rel-1.html").stat().st_size > 0
    assert f"report: {tmp_path / 'out' / 'rel-1.html'}" in capsys.readouterr().out
