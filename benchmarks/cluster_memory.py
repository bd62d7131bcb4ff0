"""Every stage on a Spark standalone cluster whose executors have 1g each, over a log they cannot hold (issue 36).

    .venv/bin/python -m benchmarks.cluster_memory                      # 5M SERPs, 2 workers, executors 1g, driver 1g
    .venv/bin/python -m benchmarks.cluster_memory --serps 200000       # a quick look

The log's doc ids are 64-character hex digests by default (`--doc-ids sha256`, the size of the URLs or URL
hashes a production log carries): with the generator's short ids (`d<q>_<j>`) 5M SERPs make a serps table of
0.24 GiB, and one larger than the executors' 2 GiB would take ~45M SERPs (~6 h here); with 64-character ids
5M SERPs make ~2.7 GiB.

deploy/package.sh's artefacts, a master and two one-core workers on loopback (tests/cluster/standalone.py),
and one spark-submit of the `pipeline` job with `spark.executor.memory` and `--driver-memory` as given
(Spark's defaults otherwise: codegen, C2): conf/bench.yaml's log (synthetic, TianGong-ST-shaped, shuffle
width 6: almost every SERP distinct) and stages (PBM, UBM, DBN with the package's fit defaults; predict,
evaluate every split with 200 replicates, generate, surrogate), with conf/cluster.yaml's fit.engine.

Prints, and writes to <workdir>/cluster_memory.json: each stage's seconds (the job's own start / done lines),
the serps table's size on disk and uncompressed (Parquet's own byte counts) against the executors' memory,
what Spark spilled (bytes from the event log, per stage), executors lost and tasks failed, and the peak RSS
of every process of the cluster and of the submit (driver JVM, driver Python, executor JVMs, their Python
workers: sampled every 0.5 s from /proc).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path

import pyarrow.parquet as pq
import yaml

from benchmarks.run import PACKAGE_FIT, Sampler
from clickeval_spark.config import PROJECT_ROOT
from tests.cluster.standalone import REPO, StandaloneCluster, processes, tail

STAGE_LINE = re.compile(r"^\[(\d\d:\d\d:\d\d)\] (\w+): (start|done in ([\d.]+) s|failed after ([\d.]+) s)", re.M)
ROLES = (("SparkSubmit", "driver JVM"), ("jobs/pipeline.py", "driver Python"),
         ("CoarseGrainedExecutorBackend", "executor JVM"), ("python_daemon", "executor Python"),
         ("pyspark.daemon", "executor Python"), ("deploy.worker.Worker", "worker daemon"),
         ("deploy.master.Master", "master daemon"))


def role_of(cmdline: str) -> str | None:
    return next((role for key, role in ROLES if key in cmdline), None)


class ProcessPeaks(Sampler):
    """Peak RSS of every process in the given sessions and in the session of the submit.sh this process
    runs, sampled in a thread: {pid: [role, peak bytes, parent pid]}."""

    def __init__(self, sids: set[int], every: float = 0.5):
        super().__init__(every)
        self.sids = set(sids)
        self.peaks: dict[int, list] = {}

    def sample(self) -> None:
        procs = processes()
        # this process's submit only: a test suite's submits beside a run are not the benchmark's
        self.sids |= {p.pid for p in procs if "deploy/cluster/submit.sh" in p.cmdline and p.ppid == os.getpid()}
        roles = {p.pid: role_of(p.cmdline) for p in procs}
        for p in procs:
            role = roles[p.pid]
            # a JVM's child with the JVM's own command line is its fork before the exec of a Python worker:
            # its RSS counts the parent's pages, it is no process of its own
            if role and role.endswith("JVM") and roles.get(p.ppid) == role:
                continue
            if p.session in self.sids and role:
                prev = self.peaks.setdefault(p.pid, [role, 0, p.ppid])
                prev[1] = max(prev[1], p.rss_bytes)


def bench_config(serps: int, engine: str, shuffle_partitions: int, checkpoints: Path, doc_ids: str) -> dict:
    """conf/bench.yaml's log and stages as a cluster job's config: relative warehouse and report, the
    package's fit defaults, the cluster's engine, EM checkpoints on storage every process reads (as
    conf/cluster.yaml's bucket: an executor lost mid-fit costs a recomputation, not the fit)."""
    cfg = yaml.safe_load((PROJECT_ROOT / "conf" / "bench.yaml").read_text())
    cfg["env"] = "cluster-memory"
    cfg["spark"] = {"mode": "cluster", "master": None, "warehouse": "warehouse",
                    "checkpoint_dir": checkpoints.as_uri(), "conf": {
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
        # what the stages keep between jobs stays on disk: with MEMORY_AND_DISK, 1g executors ran out of heap
        # reading such blocks back from disk (the first run, benchmarks/RESULTS.md)
        "spark.sql.defaultCacheStorageLevel": "DISK_ONLY",
        "spark.databricks.delta.snapshotPartitions": "2",
        "spark.python.daemon.module": "clickeval_spark.python_daemon"}}
    cfg["ingest"].update(dataset=f"cluster-{serps}")
    cfg["ingest"]["synthetic"].update(n_serps=serps, n_queries=max(100, serps // 25), doc_id_form=doc_ids)
    for key, value in PACKAGE_FIT.items():
        cfg["fit"][key.split(".", 1)[1]] = value
    cfg["fit"]["engine"] = engine
    cfg["report"] = {"path": "reports"}
    return cfg


def parquet_bytes(table: Path) -> tuple[int, int]:
    """(bytes on disk, uncompressed bytes of its column chunks) of a Delta table's Parquet files."""
    disk = raw = 0
    for f in table.rglob("*.parquet"):
        disk += f.stat().st_size
        md = pq.ParquetFile(f).metadata
        raw += sum(md.row_group(i).total_byte_size for i in range(md.num_row_groups))
    return disk, raw


def stage_times(log: str) -> dict[str, dict]:
    """The pipeline's stages from its progress lines: start time and seconds (or failed after)."""
    out: dict[str, dict] = {}
    for hhmmss, stage, what, done, failed in STAGE_LINE.findall(log):
        entry = out.setdefault(stage, {})
        if what == "start":
            entry["start"] = hhmmss
        else:
            entry["seconds"] = float(done or failed)
            entry["ok"] = bool(done)
    return out


def spills(event_dir: Path, stages: dict[str, dict], day: str) -> tuple[dict, int, int]:
    """Bytes spilled (memory, disk) per pipeline stage, assigned by the task's finish time; executors
    removed; tasks that did not succeed."""
    starts = sorted((datetime.fromisoformat(f"{day}T{s['start']}+00:00").timestamp() * 1000, name)
                    for name, s in stages.items() if "start" in s)
    per_stage: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    removed = failed = 0
    for path in sorted(event_dir.rglob("events_*")):   # rolled files: eventlog_v2_<app>/events_N_*
        for line in path.open():
            e = json.loads(line)
            kind = e["Event"]
            if kind == "SparkListenerExecutorRemoved":
                removed += 1
            elif kind == "SparkListenerTaskEnd":
                if e["Task End Reason"]["Reason"] != "Success":
                    failed += 1
                m = e.get("Task Metrics") or {}
                at = e["Task Info"]["Finish Time"]
                name = next((n for t, n in reversed(starts) if t <= at + 1000), "before")
                per_stage[name][0] += m.get("Memory Bytes Spilled", 0)
                per_stage[name][1] += m.get("Disk Bytes Spilled", 0)
    return dict(per_stage), removed, failed


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--serps", type=int, default=5_000_000)
    ap.add_argument("--executor-memory", default="1g")
    ap.add_argument("--driver-memory", default="1g")
    ap.add_argument("--shuffle-partitions", type=int, default=32,
                    help="spark.sql.shuffle.partitions: a shuffle task holds about 1/this of the log")
    ap.add_argument("--doc-ids", choices=("sha256", "short"), default="sha256",
                    help="the synthetic log's doc ids: 64-character digests, or d<query>_<j>")
    ap.add_argument("--workdir", default="/tmp/clickeval-cluster-memory")
    ap.add_argument("--timeout", type=float, default=4 * 3600)
    args = ap.parse_args(argv)
    engine = yaml.safe_load((PROJECT_ROOT / "conf" / "cluster.yaml").read_text())["fit"]["engine"]
    work = Path(args.workdir)
    shutil.rmtree(work, ignore_errors=True)
    (work / "driver").mkdir(parents=True)
    (work / "events").mkdir()
    t0 = time.monotonic()
    subprocess.run(["bash", str(REPO / "deploy" / "package.sh"), str(work / "dist")], cwd=REPO, check=True,
                   env={**os.environ, "PYTHON": sys.executable}, capture_output=True)
    print(f"deploy/package.sh: {time.monotonic() - t0:.0f} s", flush=True)
    conf = work / "driver" / "cluster-memory.yaml"
    conf.write_text(yaml.safe_dump(bench_config(args.serps, engine, args.shuffle_partitions, work / "checkpoints",
                                            args.doc_ids), sort_keys=False))
    cluster = StandaloneCluster(work / "cluster", workers=2, worker_memory=args.executor_memory)
    cluster.root.mkdir()
    day = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    try:
        cluster.start()
        print(f"cluster {cluster.master_url}: 2 workers, 1 core each; executors {args.executor_memory}, "
              f"driver {args.driver_memory}; {args.serps:,} SERPs ({args.doc_ids} doc ids), fit.engine {engine}",
              flush=True)
        with ProcessPeaks(cluster.sessions) as peaks:
            done = cluster.submit(work / "dist", "pipeline", ["--conf", str(conf), "--run-id", "cluster-memory"],
                                  cwd=work / "driver", timeout=args.timeout, driver_memory=args.driver_memory,
                                  executor_memory=args.executor_memory, ci_speed=False,
                                  conf={"spark.eventLog.enabled": "true",
                                        "spark.eventLog.dir": str(work / "events"),
                                        "spark.eventLog.compress": "false"})
    finally:
        cluster.stop()
        cluster.drop_unpacked_archives()
    log = done.log.read_text(errors="replace")
    stages = stage_times(log)
    spilled, removed, failed = spills(work / "events", stages, day)
    disk, raw = parquet_bytes(work / "driver" / "warehouse" / "serps")
    executors_bytes = 2 * _bytes(args.executor_memory)
    out = {"serps": args.serps, "doc_ids": args.doc_ids, "returncode": done.returncode, "seconds": done.seconds,
           "engine": engine, "executor_memory": args.executor_memory, "driver_memory": args.driver_memory,
           "serps_table_disk_bytes": disk, "serps_table_uncompressed_bytes": raw,
           "executors_memory_bytes": executors_bytes, "stages": stages, "spilled_bytes": spilled,
           "executors_removed": removed, "tasks_failed": failed,
           "peak_rss": [{"pid": pid, "role": role, "parent": ppid, "peak_bytes": peak}
                        for pid, (role, peak, ppid) in sorted(peaks.peaks.items())]}
    (work / "cluster_memory.json").write_text(json.dumps(out, indent=1))
    print(report(out, done.log))
    if done.returncode:
        print(tail(done.log))
    return done.returncode


def report(out: dict, log: Path) -> str:
    """cluster_memory.json as the markdown RESULTS.md quotes."""
    gib = 2**30
    lines = [f"pipeline: exit {out['returncode']} after {out['seconds']:.0f} s (log {log})",
             f"serps table ({out['serps']:,} SERPs, {out['doc_ids']} doc ids): "
             f"{out['serps_table_disk_bytes'] / gib:.2f} GiB on disk, "
             f"{out['serps_table_uncompressed_bytes'] / gib:.2f} GiB uncompressed; the executors' memory together "
             f"{out['executors_memory_bytes'] / gib:.2f} GiB",
             "", "| stage | seconds | memory spilled (GiB) | disk spilled (GiB) |", "|---|---|---|---|"]
    for name, s in out["stages"].items():
        mem, dsk = out["spilled_bytes"].get(name, (0, 0))
        seconds = f"{s.get('seconds', float('nan')):.1f}" + ("" if s.get("ok") else " (failed)")
        lines.append(f"| {name} | {seconds} | {mem / gib:.2f} | {dsk / gib:.2f} |")
    lines += ["", f"executors removed: {out['executors_removed']}; tasks failed: {out['tasks_failed']}",
              "", "| process | pid | peak RSS (GiB) |", "|---|---|---|"]
    small = [r for r in out["peak_rss"] if r["peak_bytes"] < 32 * 2**20 and "Python" in r["role"]]
    for row in sorted(out["peak_rss"], key=lambda r: (r["role"], -r["peak_bytes"])):
        if row not in small:
            lines.append(f"| {row['role']} | {row['pid']} | {row['peak_bytes'] / gib:.2f} |")
    lines.append(f"({len(small)} more Python processes, each under 32 MiB)")
    return "\n".join(lines)


def _bytes(size: str) -> int:
    units = {"k": 2**10, "m": 2**20, "g": 2**30}
    return int(float(size[:-1]) * units[size[-1].lower()]) if size[-1].lower() in units else int(size)


if __name__ == "__main__":
    sys.exit(main())
