"""A Spark standalone cluster on loopback, from pyspark's own launcher: one master, N workers.

Each daemon is a `spark-class` subprocess in its own session, so stopping the cluster
can signal every process it ever started (worker JVMs start the executor JVMs, and
those start the Python workers, all in the same session) and then check that none
is left.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import pyspark

from tests.spark_settings import INTERPRETED, SHORT_LIVED_JVM

REPO = Path(__file__).resolve().parents[2]
SPARK_HOME = Path(pyspark.__file__).resolve().parent
SUBMIT_SH = REPO / "deploy" / "cluster" / "submit.sh"

# Spark's jars, put first on a driver's and its executors' class path when they map a class-data archive
# of them (tests/cluster/class_data.py): ahead of SPARK_CONF_DIR, which the archive cannot span
JARS = f"{SPARK_HOME / 'jars'}/*"


def jvm_settings(archive: Path | None) -> dict[str, str]:
    """The Spark settings that start a driver and its executors as `SHORT_LIVED_JVM`s, mapping the class-data
    ``archive`` when there is one."""
    java = SHORT_LIVED_JVM + (f" -XX:SharedArchiveFile={archive}" if archive else "")
    return {"spark.driver.extraJavaOptions": java, "spark.executor.extraJavaOptions": java,
            **({"spark.driver.extraClassPath": JARS, "spark.executor.extraClassPath": JARS} if archive else {})}


def spark_env(**extra: str) -> dict[str, str]:
    """This process's environment without Python or Spark settings (a test session may have set
    PYSPARK_PYTHON to its own venv), pinned to pyspark's Spark and to loopback."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYSPARK_", "SPARK_")) and k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(SPARK_HOME=str(SPARK_HOME), SPARK_LOCAL_IP="127.0.0.1", SPARK_LOCAL_HOSTNAME="127.0.0.1",
               SPARK_DAEMON_MEMORY="256m", SPARK_DAEMON_JAVA_OPTS=SHORT_LIVED_JVM, **extra)
    return env


@dataclass(frozen=True)
class Process:
    pid: int
    state: str
    ppid: int
    session: int
    rss_bytes: int
    cmdline: str


def processes() -> list[Process]:
    """Every process /proc lists now (one that exits while we look is left out)."""
    page, found = os.sysconf("SC_PAGE_SIZE"), []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
            cmdline = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # exited while we looked
            continue
        f = text[text.rindex(")") + 2:].split()  # after "pid (comm) ": state ppid pgrp session ...; rss 22nd
        found.append(Process(int(stat.parent.name), f[0], int(f[1]), int(f[3]), int(f[21]) * page, cmdline))
    return found


def _session_processes(sids: set[int]) -> list[str]:
    """Live (non-zombie) processes in any of the sessions `sids`, as 'pid cmdline' lines."""
    return [f"{p.pid} {p.cmdline[:160]}" for p in processes() if p.state != "Z" and p.session in sids]


def signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:  # the whole group is gone already
        pass


def _wait_for_line(proc: subprocess.Popen, log: Path, pattern: str, timeout: float) -> re.Match:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        match = re.search(pattern, log.read_text(errors="replace"))
        if match:
            return match
        if proc.poll() is not None:
            raise RuntimeError(f"{log.name}: exited with {proc.returncode} before {pattern!r}:\n{tail(log)}")
        time.sleep(0.5)
    raise TimeoutError(f"{log.name}: no {pattern!r} within {timeout:.0f}s:\n{tail(log)}")


def tail(path: Path, lines: int = 60) -> str:
    """The last lines of a Spark log that are not INFO chatter."""
    text = path.read_text(errors="replace").splitlines() if path.exists() else []
    return "\n".join([line for line in text if " INFO " not in line][-lines:])


@dataclass
class Submission:
    job: str
    returncode: int
    seconds: float
    log: Path


class StandaloneCluster:
    """``worker_hides``: folders each worker (and so its executors and their Python workers) sees as
    empty: it runs in a mount namespace of its own (`unshare --mount`, as root) with an empty tmpfs over
    each, e.g. the build host's Python installation. ``worker_env``: more environment for the workers
    (PATH, PEX_ROOT). ``class_data``: the class-data archive `submit`'s drivers and executors map
    (`jvm_settings`); the daemons' own class path does not fit it (their JVMs warned and ran without)."""

    def __init__(self, root: Path, workers: int = 2, worker_memory: str = "1g",
                 worker_hides: Sequence[Path] = (), worker_env: dict[str, str] | None = None,
                 class_data: Path | None = None):
        self.root = root
        self.class_data = class_data
        self.worker_dirs = [root / f"worker-{i}" for i in range(1, workers + 1)]
        self.worker_memory = worker_memory
        self.worker_hides = [str(p) for p in worker_hides]
        self.worker_env = dict(worker_env or {})
        self.master_url = ""
        self._procs: list[tuple[str, subprocess.Popen]] = []

    def _spawn(self, name: str, *args: str, hides: Sequence[str] = (),
               env: dict[str, str] | None = None) -> tuple[subprocess.Popen, Path]:
        log = self.root / f"{name}.log"
        cmd = [str(SPARK_HOME / "bin" / "spark-class"), *args]
        if hides:
            mounts = " && ".join(f"mount -t tmpfs -o size=1m,mode=755 none {shlex.quote(h)}" for h in hides)
            cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c", f'{mounts} && exec "$@"', "sh", *cmd]
        with log.open("wb") as out:
            proc = subprocess.Popen(
                cmd, env={**spark_env(), **(env or {})}, cwd=self.root,
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )
        self._procs.append((name, proc))
        return proc, log

    @property
    def workers(self) -> list[subprocess.Popen]:
        """The worker daemons' processes, in start order."""
        return [proc for name, proc in self._procs if name.startswith("worker")]

    @property
    def sessions(self) -> set[int]:
        """The session ids of the daemons started so far: every process the cluster started is in one."""
        return {proc.pid for _, proc in self._procs}

    def start(self, timeout: float = 120) -> None:
        """Master and workers on ports the OS picks (port 0): read back from their logs."""
        master, log = self._spawn("master", "org.apache.spark.deploy.master.Master",
                                  "--host", "127.0.0.1", "--port", "0", "--webui-port", "0")
        self.master_url = _wait_for_line(master, log, r"Starting Spark master at (spark://\S+)", timeout)[1]
        started = []
        for i, work_dir in enumerate(self.worker_dirs, 1):
            work_dir.mkdir(parents=True)
            started.append(self._spawn(
                f"worker-{i}", "org.apache.spark.deploy.worker.Worker", self.master_url,
                "--host", "127.0.0.1", "--port", "0", "--webui-port", "0", "--work-dir", str(work_dir),
                "--cores", "1", "--memory", self.worker_memory, hides=self.worker_hides, env=self.worker_env,
            ))
        for proc, log in started:
            _wait_for_line(proc, log, r"Successfully registered with master", timeout)

    def submit(self, dist: Path, job: str, job_args: list[str], *, cwd: Path, timeout: float = 900,
               driver_memory: str = "1g", executor_memory: str = "768m", conf: dict[str, str] | None = None,
               ci_speed: bool = True) -> Submission:
        """deploy/cluster/submit.sh for one job (a stage, or `pipeline`), plus what this cluster's shape
        needs: the driver on loopback, executors within the workers' memory, no UI ports, and no 3 s wait
        per task for a "better" executor when every executor is on the same host. ``ci_speed``: JVMs that
        live a minute (C1 only, serial GC) and expressions run interpreted (tests/spark_settings.py): CI is
        CPU-bound, and these submits were its longest item; a benchmark (benchmarks/cluster_memory.py) runs
        Spark's defaults. ``conf``: more Spark settings."""
        log = self.root / f"submit-{job}.log"
        speed = {**jvm_settings(self.class_data), **INTERPRETED} if ci_speed else {}
        settings = {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
                    "spark.executor.memory": executor_memory, "spark.ui.enabled": "false",
                    "spark.locality.wait": "0s", **speed, **(conf or {})}
        cmd = ["bash", str(SUBMIT_SH), job, "--master", self.master_url, "--driver-memory", driver_memory,
               *(arg for key, value in settings.items() for arg in ("--conf", f"{key}={value}")),
               "--", *job_args]
        env = spark_env(DIST=str(dist), SPARK_SUBMIT=str(SPARK_HOME / "bin" / "spark-submit"))
        t0 = time.monotonic()
        with log.open("wb") as out:
            proc = subprocess.run(cmd, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out,
                                  stderr=subprocess.STDOUT, timeout=timeout, start_new_session=True)
        return Submission(job, proc.returncode, time.monotonic() - t0, log)

    def stop(self, grace: float = 30) -> None:
        """Workers first (each stops its executors), then the master; SIGKILL what is left after
        `grace` seconds. Raises if any process of the cluster's sessions outlives that."""
        sids = self.sessions
        for _, proc in reversed(self._procs):
            signal_group(proc.pid, signal.SIGTERM)
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                signal_group(proc.pid, signal.SIGKILL)
                proc.wait(10)
        deadline = time.monotonic() + grace
        while (left := _session_processes(sids)) and time.monotonic() < deadline:
            time.sleep(0.5)
        for line in left:  # orphans of a killed daemon: never leave a JVM behind
            try:
                os.kill(int(line.split()[0]), signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._procs.clear()
        if left:
            raise RuntimeError("cluster processes outlived the stop (killed now):\n" + "\n".join(left))

    def drop_unpacked_archives(self) -> None:
        """The executors' copies of the PEX (--files, 160 MB each) or of an --archives venv; logs stay."""
        for copy in self.root.glob("worker-*/app-*/*/*.pex"):
            copy.unlink(missing_ok=True)
        for env_dir in self.root.glob("worker-*/app-*/*/environment"):
            shutil.rmtree(env_dir, ignore_errors=True)


@contextlib.contextmanager
def running(cluster: StandaloneCluster):
    """The cluster started, then stopped (and checked gone) with its executors' unpacked copies dropped."""
    try:
        cluster.start()
        yield cluster
    finally:
        try:
            cluster.stop()
        finally:
            cluster.drop_unpacked_archives()
