"""A stage on a worker whose Python 3.11 is not where the build host's is.

deploy/package.sh builds on this host's interpreter (sys.base_prefix: pyenv's 3.11.7 here). The
worker runs in a mount namespace of its own where that installation is an empty folder and PATH is
/usr/bin:/bin, so the only 3.11 it can start is Debian's /usr/bin/python3.11 (3.11.2): the PEX must
find it there. (The packed venv this replaced linked its bin/python to the build host's interpreter
path and could not start on such a worker.) The driver runs on this host, on the same PEX.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml
from pyspark.sql import functions as F

from clickeval_spark.tables import read_table
from tests.cluster.standalone import REPO, SPARK_HOME, StandaloneCluster, processes, running, tail

pytestmark = pytest.mark.cluster

BUILD_PYTHON = Path(sys.base_prefix)
OTHER_PYTHON = "/usr/bin/python3.11"
TREC = REPO / "data" / "trec-session-2014-demo"
RUN_ID = "other-python-1"


def _skip_unless_possible() -> None:
    if not os.access(OTHER_PYTHON, os.X_OK) or Path(os.path.realpath(OTHER_PYTHON)).is_relative_to(BUILD_PYTHON):
        pytest.skip(f"needs a Python 3.11 at {OTHER_PYTHON}, outside the build's {BUILD_PYTHON}")
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                            f"mount -t tmpfs none {BUILD_PYTHON} && [ ! -e {BUILD_PYTHON}/bin ]"],
                           capture_output=True, timeout=30)
    if probe.returncode:
        pytest.skip(f"cannot hide {BUILD_PYTHON} in a mount namespace (unshare needs root): {probe.stderr!r}")


def test_the_pex_runs_its_own_code_on_sparks_pyspark(artefacts, tmp_path):
    """The PEX on another 3.11 with the PYTHONPATH Spark gives a Python worker (its pyspark.zip and py4j zip,
    and the --py-files zip if a submit adds it): clickeval_spark and numpy from the PEX, which precede
    PYTHONPATH (--inherit-path=fallback), pyspark and py4j from Spark's zips."""
    if not os.access(OTHER_PYTHON, os.X_OK):
        pytest.skip(f"no {OTHER_PYTHON}")
    lib = SPARK_HOME / "python" / "lib"
    pythonpath = [*map(str, sorted(lib.glob("*.zip"))), str(artefacts / "clickeval_spark.zip")]
    code = ("import json, os, sys, clickeval_spark, numpy, pyspark, py4j; print(json.dumps({'python': "
            "os.path.realpath(sys.executable), **{m.__name__: m.__file__ for m in (clickeval_spark, numpy, pyspark, "
            "py4j)}}))")
    proc = subprocess.run([str(artefacts / "clickeval.pex"), "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
                                                       "PEX_ROOT": str(tmp_path / "pex-root"),
                                                       "PYTHONPATH": os.pathsep.join(pythonpath)})
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)
    assert found["python"] == OTHER_PYTHON
    pex_root = str(tmp_path / "pex-root")
    assert found["clickeval_spark"].startswith(pex_root) and found["numpy"].startswith(pex_root), found
    assert found["pyspark"].startswith(str(lib / "pyspark.zip")), found
    assert found["py4j"].startswith(str(lib)), found


@pytest.fixture
def other_path_cluster(tmp_path, class_data_archive):
    _skip_unless_possible()
    root = tmp_path / "cluster"
    root.mkdir()
    cluster = StandaloneCluster(root, workers=1, worker_hides=[BUILD_PYTHON],
                                worker_env={"PATH": "/usr/bin:/bin", "PEX_ROOT": str(root / "pex-root")},
                                class_data=class_data_archive)
    with running(cluster):
        yield cluster


def test_ingest_on_a_worker_whose_python_is_elsewhere(artefacts, other_path_cluster, tmp_path, request):
    cluster = other_path_cluster
    [worker] = cluster.workers
    # the worker cannot see the build's interpreter; this host can
    assert (BUILD_PYTHON / "bin").is_dir()
    assert not Path(f"/proc/{worker.pid}/root{BUILD_PYTHON}/bin").exists()

    base = yaml.safe_load((artefacts / "conf" / "standalone-test.yaml").read_text())
    # relative: the driver resolves it against its working directory, not the unpacked PEX its code runs from
    assert base["spark"]["warehouse"] == "warehouse"
    conf = tmp_path / "other-python.yaml"
    conf.write_text(yaml.safe_dump({
        "env": "other-python", "spark": base["spark"],
        "ingest": {"dataset": "trec2014", "format": "per_query_text", "text_variant": "graphcm",
                   "paths": {split: f"file://{TREC}/{split}_per_query_quid.txt" for split in ("train", "valid", "test")},
                   "labels": f"file://{TREC}/human_label_for_GraphCM_per_query_quid.txt"}}))
    driver_cwd = tmp_path / "driver-cwd"
    driver_cwd.mkdir()

    # the Python processes of the worker's session (its executor's Python workers), sampled while the stage runs
    seen: dict[int, tuple[str, str]] = {}
    done = threading.Event()

    def sample():
        while not done.wait(0.2):
            for p in processes():
                if p.session == worker.pid and p.state != "Z" and "clickeval.pex" in p.cmdline:
                    try:
                        seen.setdefault(p.pid, (os.readlink(f"/proc/{p.pid}/exe"), p.cmdline))
                    except OSError:
                        pass

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        submitted = cluster.submit(artefacts, "ingest", ["--conf", str(conf), "--run-id", RUN_ID], cwd=driver_cwd)
    finally:
        done.set()
        sampler.join()
    print(f"[cluster] ingest on the other-path worker: exit {submitted.returncode}, {submitted.seconds:.0f}s; "
          f"its Python processes: {sorted(set(seen.values()))}")
    assert submitted.returncode == 0, f"ingest failed (log {submitted.log}):\n{tail(submitted.log)}"

    # every Python process the worker's executor started ran Debian's 3.11 from the PEX (pyspark's
    # daemon through clickeval_spark.python_daemon), and tasks ran there
    assert seen and {exe for exe, _ in seen.values()} == {OTHER_PYTHON}, seen
    assert all("clickeval_spark.python_daemon" in cmd or "pyspark.daemon" in cmd for _, cmd in seen.values()), seen
    [executor] = [e for e in next(cluster.worker_dirs[0].glob("app-*")).iterdir() if e.is_dir()]
    assert "Running task" in (executor / "stderr").read_text(errors="replace")

    spark = request.getfixturevalue("spark")
    warehouse = str(driver_cwd / "warehouse")
    [run] = read_table(spark, warehouse, "runs").where((F.col("run_id") == RUN_ID) & (F.col("job") == "ingest")).collect()
    assert run["status"] == "succeeded" and run["counts"]["serps_accepted"] > 0, run
    assert read_table(spark, warehouse, "serps").where(F.col("dataset") == "trec2014").limit(1).count() == 1
