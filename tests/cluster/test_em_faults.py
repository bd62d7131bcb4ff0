"""EM on a multi-process Spark cluster survives lost executors when `spark.checkpoint_dir` is set.

The driver (tests/cluster/em_faults.py) runs in its own process on a `local-cluster` master:
this test session's local Spark cannot host a second SparkContext. Its three fits share one
log, one model, one kill schedule: the control without a checkpoint directory must fail (so
the kills do destroy state the fit needs), the disturbed fit with one must finish with every
number equal, bit for bit, to the undisturbed reference's.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.cluster import em_faults
from tests.cluster.standalone import REPO, signal_group, spark_env

pytestmark = pytest.mark.cluster


def test_fit_survives_killed_executors(tmp_path, class_data_archive):
    out = tmp_path / "result.json"
    t0 = time.monotonic()
    # its own session: whatever happens, the driver JVM and its executors go with the process group
    proc = subprocess.Popen([sys.executable, "-m", "tests.cluster.em_faults", str(out), str(tmp_path),
                             str(class_data_archive or "")], cwd=REPO,
                            env=spark_env(PYTHONPATH=str(REPO)), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=900)
    finally:
        signal_group(proc.pid, signal.SIGKILL)
        proc.wait()
    print(f"\n[cluster] em_faults: {time.monotonic() - t0:.0f}s\n{stdout}")
    errors = "\n".join(line for line in stderr.splitlines() if " INFO " not in line)
    assert proc.returncode == 0, f"{stdout}\n{errors[-6000:]}"
    r = json.loads(out.read_text())
    assert r["executor_package"] == str(REPO / "clickeval_spark" / "__init__.py")  # this checkout ran

    # control: local checkpoints only; the executor killed after pass 3 took packed blocks with it
    control = r["control"]
    assert r["checkpoint_dir_before"] is None
    assert [k["after_pass"] for k in control["kills"]] == [3]
    assert "CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND" in control.get("error", ""), control

    # spark.checkpoint_dir reached the SparkContext (Spark adds a per-application folder)
    assert re.fullmatch(rf"file:{re.escape(str(tmp_path / 'checkpoints'))}/[0-9a-f-]+", r["checkpoint_dir"])
    ref, dist = r["reference"], r["disturbed"]
    assert ref["kills"] == [] and "error" not in ref, ref
    assert "error" not in dist, dist
    assert [k["after_pass"] for k in dist["kills"]] == [3, 5]
    for kill in dist["kills"]:  # each kill was an executor the driver had and lost
        assert re.search(rf"Lost executor {kill['executor']} on \S+: Command exited with code 137", stderr)
        assert kill["executor"] not in dist["executors_after"]
    assert len(dist["executors_after"]) == em_faults.N_EXECUTORS  # the master replaced them

    # every fitted number of the disturbed fit equals the reference's, bit for bit
    assert dist["values"] == ref["values"]
    values = ref["values"]
    lls = [float.fromhex(ll) for _, ll in values["train_ll"]]
    assert len(lls) == em_faults.ITERATIONS + 1 and lls[-1] > lls[0]  # a real fit, not a no-op
    assert len(values["qd"]) == 60 * 15  # synthetic_serps: 60 queries, every doc of their 15-doc pools shown
    assert set(values["glob"]) == {"gamma"} and set(values["prior"]) == {"alpha", "sigma"}
    # per fit: the packed log, pass 3's blocks (interval 3 of 6 passes) and the qd table
    assert len(r["checkpoint_files"]) == 2 * 3, r["checkpoint_files"]
