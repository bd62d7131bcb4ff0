"""Fixtures for the cluster test: deploy/package.sh's artefacts and a Spark standalone cluster on loopback."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cluster.class_data import shared_archive
from tests.cluster.standalone import REPO, StandaloneCluster, running


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "cluster: starts a multi-process Spark cluster on loopback (standalone: spark-submits the packaged "
        "stages; local-cluster: kills executors mid-fit) (minutes; runs by default, deselect with -m 'not cluster')",
    )


@pytest.fixture(scope="session")
def artefacts(tmp_path_factory) -> Path:
    """deploy/package.sh into a fresh folder, once per test session (the PEX takes a minute): clickeval.pex,
    clickeval_spark.zip, the wheel, jobs/<stage>.py, conf/, BUILD_INFO.json."""
    dist = tmp_path_factory.mktemp("dist")
    t0 = time.monotonic()
    # PYTHON: the interpreter running the tests, whose venv has the dev tools (pex)
    proc = subprocess.run(["bash", str(REPO / "deploy" / "package.sh"), str(dist)], cwd=REPO,
                          env={**os.environ, "PYTHON": sys.executable},
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"deploy/package.sh failed:\n{proc.stdout}\n{proc.stderr}"
    print(f"\n[cluster] deploy/package.sh: {time.monotonic() - t0:.0f}s, "
          f"PEX {(dist / 'clickeval.pex').stat().st_size / 2**20:.0f} MiB")
    return dist


@pytest.fixture(scope="session")
def standalone_cluster(tmp_path_factory, class_data_archive):
    """One master and two one-core workers, each with its own work dir; stopped (and checked gone) at the end."""
    cluster = StandaloneCluster(tmp_path_factory.mktemp("standalone"), workers=2, class_data=class_data_archive)
    t0 = time.monotonic()
    with running(cluster):
        print(f"\n[cluster] master {cluster.master_url} and {len(cluster.worker_dirs)} workers up "
              f"in {time.monotonic() - t0:.0f}s")
        yield cluster


@pytest.fixture(scope="session")
def class_data_archive(tmp_path_factory, spark) -> Path | None:
    """The class-data archive of Spark's jars the cluster tests' JVMs map (tests/cluster/class_data.py), one
    for both test workers: it sits in the run's shared temp root (the workers' basetemps' parent). Written
    after this worker's test session started: that session has Delta's jars in Ivy's cache, where the job
    that writes the archive finds them (two resolutions at once on a cold cache collide, tests/conftest.py)."""
    return shared_archive(tmp_path_factory.getbasetemp().parent)
