"""benchmarks/cluster_memory.py's process roles: what each peak RSS row stands for."""

from __future__ import annotations

import os

from benchmarks import cluster_memory
from tests.cluster.standalone import Process

EXECUTOR = "java -cp x org.apache.spark.executor.CoarseGrainedExecutorBackend --app-id a"


def test_a_jvm_fork_before_exec_is_not_a_process_of_its_own(monkeypatch):
    """An executor JVM launching a Python daemon forks a child with its own command line for an instant; its RSS
    counts the parent's pages (the fifteenth session's table listed two such "executor JVMs" of 1.2 and 0.2 GiB)."""
    procs = [Process(10, "S", 1, 7, 2 << 30, EXECUTOR),
             Process(11, "R", 10, 7, 1 << 30, EXECUTOR),   # the fork, before its exec
             Process(12, "S", 10, 7, 100 << 20, "python -m clickeval_spark.python_daemon"),
             Process(13, "S", 1, 99, 5 << 30, EXECUTOR)]   # another session's executor: not ours
    monkeypatch.setattr(cluster_memory, "processes", lambda: procs)
    peaks = cluster_memory.ProcessPeaks({7})
    peaks.sample()
    assert peaks.peaks == {10: ["executor JVM", 2 << 30, 1], 12: ["executor Python", 100 << 20, 10]}


def test_only_this_process_s_submit_is_followed(monkeypatch):
    """A submit.sh session joins the sampled ones when this process started it: a test suite's cluster
    submits beside a run (the ninth pass's table listed a driver JVM of theirs) are left out."""
    submit = "bash /repo/deploy/cluster/submit.sh pipeline --master spark://x"
    procs = [Process(20, "S", os.getpid(), 20, 1 << 20, submit),
             Process(21, "S", 20, 20, 1 << 30, "java org.apache.spark.deploy.SparkSubmit jobs/pipeline.py"),
             Process(30, "S", 4321, 30, 1 << 20, submit),
             Process(31, "S", 30, 30, 2 << 30, "java org.apache.spark.deploy.SparkSubmit jobs/ingest.py")]
    monkeypatch.setattr(cluster_memory, "processes", lambda: procs)
    peaks = cluster_memory.ProcessPeaks(set())
    peaks.sample()
    assert peaks.peaks == {21: ["driver JVM", 1 << 30, 20]}
