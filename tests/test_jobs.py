"""Job entry points: one clear line for bad input, exit code 2, nothing half-written."""

import pytest

from jobs import ingest as ingest_job


@pytest.fixture
def conf(tmp_path):
    """A config without Spark settings, so main() leaves the shared test session as it is."""
    path = tmp_path / "test.yaml"
    path.write_text(f"spark: {{warehouse: {tmp_path / 'wh'}, conf: {{}}}}\n")
    return str(path)


def test_missing_input_file_fails_with_one_line(spark, tmp_path, capsys, conf):
    missing = tmp_path / "nope.txt"
    rc = ingest_job.main([
        "--conf", conf, "--run-id", "bad-1",
        "--set", "ingest.format=per_query_text",
        "--set", f"ingest.paths={{train: {missing}}}",
    ])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert err == [f"clickeval ingest: error: ingest.paths.train: {missing}: no such file or folder"]


def test_bad_config_fails_before_spark_work(tmp_path, capsys):
    rc = ingest_job.main(["--set", "ingest.format=csv"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "ingest.format: 'csv' is not allowed" in err


def test_not_canonical_parquet_names_the_file(spark, tmp_path, capsys, conf):
    path = tmp_path / "x.parquet"
    spark.createDataFrame([(1,)], "a int").write.parquet(str(path))
    rc = ingest_job.main([
        "--conf", conf, "--run-id", "bad-2",
        "--set", "ingest.format=parquet", "--set", f"ingest.paths={{all: {path}}}",
    ])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err[-1].startswith(f"clickeval ingest: error: {path}: not canonical serps rows, missing column(s)")


def test_job_files_are_the_registry_verbs_and_delegate_to_the_cli():
    """jobs/ is the spark-submit surface of the CLI: one file per registered stage plus pipeline,
    tables and sql, each exactly `cli.job_source(verb)` (regenerate: python -m clickeval_spark.cli
    --write-jobs jobs)."""
    from pathlib import Path

    from clickeval_spark import cli
    from clickeval_spark.stages import STAGES

    folder = Path(__file__).resolve().parents[1] / "jobs"
    assert {p.stem for p in folder.glob("*.py")} - {"__init__"} == set(cli.JOB_VERBS)
    assert set(STAGES) < set(cli.JOB_VERBS)
    for verb in cli.JOB_VERBS:
        assert (folder / f"{verb}.py").read_text() == cli.job_source(verb), verb


def test_the_cli_offers_every_registered_stage_and_refuses_an_unknown_verb(capsys):
    from clickeval_spark import cli
    from clickeval_spark.stages import STAGES

    with pytest.raises(SystemExit) as exc:
        cli.main(["--help"])
    assert exc.value.code == 0
    listed = capsys.readouterr().out
    assert all(f"    {name} " in listed for name in (*STAGES, "run", "tables", "sql")), listed
    with pytest.raises(SystemExit) as exc:
        cli.main(["fitt"])
    assert exc.value.code == 2 and "invalid choice: 'fitt'" in capsys.readouterr().err


def test_run_from_a_stage_runs_that_stage_and_the_ones_after_it_in_order(monkeypatch, tmp_path, capsys, conf):
    """`clickeval run --from fit` resumes a run: ingest is not run, every later stage is, in registry order;
    a name that is not a stage is refused by the parser."""
    from types import SimpleNamespace

    from clickeval_spark import stages

    ran = []
    fake = {name: (lambda ctx, name=name: ran.append(name)) for name in stages.STAGES if name != "evaluate"}
    monkeypatch.setattr(stages, "STAGES", fake)
    ctx = SimpleNamespace(run_id="r", warehouse="wh")
    stages.run_pipeline(ctx, "generate")
    assert ran == ["generate", "surrogate", "report"]
    ran.clear()
    stages.run_pipeline(ctx)
    assert ran == list(fake)

    from clickeval_spark import cli
    args = cli.build_parser().parse_args(["pipeline", "--from", "predict"])
    assert (args.verb, args.start) == ("pipeline", "predict")
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["run", "--from", "ingst"])
    assert "invalid choice: 'ingst'" in capsys.readouterr().err
    # resuming needs the run it resumes: without a run id it stops before any Spark work
    assert cli.main(["run", "--from", "fit", "--conf", conf]) == 2
    assert capsys.readouterr().err.strip() == ("clickeval run: error: --from fit resumes a run: give its --run-id "
                                               "(or run_id in the config)")


def test_a_job_under_another_python_minor_fails_with_one_line_before_any_spark(monkeypatch, capsys):
    """jobs/<verb>.py checks the Python before the CLI imports pyspark: another minor version than the
    build recorded (deploy/package.sh's clickeval_spark/_build.py) is one line on stderr and exit 2."""
    import sys

    from clickeval_spark import build_info

    monkeypatch.setattr(build_info, "recorded", lambda: {"python": "3.11", "built_with": "3.11.7"})
    monkeypatch.setattr(build_info, "found_python", lambda: ("3.12.1", "/usr/bin/python3.12"))
    monkeypatch.delitem(sys.modules, "clickeval_spark.cli", raising=False)  # the job must not import it
    assert ingest_job.main(["--conf", "nope.yaml"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "clickeval: this build needs Python 3.11 (built with 3.11.7), found 3.12.1 at /usr/bin/python3.12"]
    assert "clickeval_spark.cli" not in sys.modules
    # the same minor version at another path and patch level passes; a checkout records no build
    monkeypatch.setattr(build_info, "found_python", lambda: ("3.11.2", "/usr/bin/python3.11"))
    assert build_info.python_problem() is None
    monkeypatch.undo()
    assert build_info.recorded() == {"python": "3.11"} and build_info.python_problem() is None


@pytest.mark.parametrize("python, refused", [("/usr/bin/python3.11", False),
                                             ("/root/.pyenv/versions/3.12.1/bin/python3.12", True)])
def test_a_job_file_under_a_real_other_interpreter(python, refused, tmp_path):
    """The check with real interpreters: a 3.12 running jobs/ingest.py is refused in one line, before any
    import that needs packages (it has none of ours); Debian's 3.11.2, at another path and patch level than
    a build's 3.11.7, passes the check."""
    import os
    import subprocess
    from pathlib import Path

    if not os.access(python, os.X_OK):
        pytest.skip(f"no {python} here")
    repo = Path(__file__).resolve().parents[1]
    run = [python, str(repo / "jobs" / "ingest.py"), "--conf", "nope.yaml"] if refused else \
        [python, "-c", "from clickeval_spark import build_info; print(build_info.python_problem())"]
    proc = subprocess.run(run, cwd=tmp_path, env={"PYTHONPATH": str(repo), "PATH": "/usr/bin"},
                          capture_output=True, text=True, timeout=60)
    if refused:
        assert (proc.returncode, proc.stdout) == (2, ""), proc
        assert proc.stderr.splitlines() == [f"clickeval: this build needs Python 3.11, found 3.12.1 at {python}"]
    else:
        assert (proc.returncode, proc.stdout) == (0, "None\n"), proc
