"""deploy/package.sh's artefacts hold the checkout and nothing a cluster brings itself.

What the artefacts do on a cluster is tests/cluster/test_airflow_daily.py's (every stage spark-submitted by
the DAG to the standalone cluster, executors on both workers) and test_other_python_path.py's (a worker
whose Python is elsewhere; the config's relative warehouse resolved against the driver's working directory).
"""

from __future__ import annotations

import json
import sys
import zipfile

import pytest

from clickeval_spark.stages import STAGES
from tests.cluster.standalone import REPO

pytestmark = pytest.mark.cluster


def _python_files(names) -> set[str]:
    return {n for n in names if n.endswith(".py") and n.startswith(("clickeval_spark/", "jobs/"))}


def test_artefacts_hold_the_checkout(artefacts):
    """The wheel (inside the PEX too) and the --py-files zip carry every module of the checkout, and the
    build's record (clickeval_spark/_build.py, as BUILD_INFO.json); the PEX holds no pyspark or py4j."""
    checkout = _python_files(str(p.relative_to(REPO)) for d in ("clickeval_spark", "jobs")
                             for p in (REPO / d).rglob("*.py")) - {"clickeval_spark/_build.py"}
    built = checkout | {"clickeval_spark/_build.py"}
    [wheel] = artefacts.glob("clickeval_spark-*.whl")
    with zipfile.ZipFile(wheel) as whl, zipfile.ZipFile(artefacts / "clickeval_spark.zip") as pyfiles:
        assert _python_files(whl.namelist()) == built
        assert _python_files(pyfiles.namelist()) == built
        record = pyfiles.read("clickeval_spark/_build.py").decode()
    info = json.loads((artefacts / "BUILD_INFO.json").read_text())
    assert info["python"] == "%d.%d" % sys.version_info[:2] and f"BUILD = {info!r}" in record
    with zipfile.ZipFile(artefacts / "clickeval.pex") as pex:
        pex_info = json.loads(pex.read("PEX-INFO"))
        deps = {name.split("/")[1].split("-")[0] for name in pex.namelist() if name.startswith(".deps/")}
    assert {"clickeval_spark", "delta_spark", "numpy", "pyarrow"} <= deps and not deps & {"pyspark", "py4j"}, deps
    assert pex_info["interpreter_constraints"] == [f"CPython=={info['python']}.*"]
    assert pex_info["inherit_path"] == "fallback"
    assert {f"{stage}.py" for stage in STAGES} <= {p.name for p in (artefacts / "jobs").iterdir()}

