"""The scale benchmark: every stage at 1M and 10M SERPs, linear in the log, in a 6g driver (issue 36).

    .venv/bin/python -m benchmarks.run                                  # 1M and 10M, package defaults (about 75 min)
    .venv/bin/python -m benchmarks.run --sizes 100000,1000000 --em-reference --iterations 5
    .venv/bin/python -m benchmarks.run --sizes 1000000 --shuffle-width 0   # fixed lists per query: many repeats
    .venv/bin/python -m benchmarks.run --fit-scale 10000000             # then the 10M UBM fit, both shapes

Per size, in one Spark session (conf/bench.yaml: local[*], spark.driver.memory --driver-memory (6g),
synthetic TianGong-ST-shaped log of 10 results per SERP, Zipf-like query frequencies with n_queries =
SERPs / 25, simulated from a DBN; shuffle_width 6: almost every SERP distinct, as in real logs), a fresh
warehouse under --workdir:

- every stage timed, with the peak RSS of this process tree (driver, JVM, Python workers, sampled every
  0.2 s) while it ran: ingest (generate + validate + write serps and labels), fit (PBM, UBM and DBN with the
  package defaults: beta prior, `k: auto`, tol 1e-4, at most 50 passes; the train split packed into query
  blocks once, identical SERPs folded: "packed rows / train SERPs" is what the fold left; at sizes up to
  --lcm-max (1M) the learned model lcm after them, trained by Spark MLlib on the same train split, and each
  model's share of the fit stage from its `runs` row), predict (valid,
  test), evaluate (every split: all N SERPs, 200 bootstrap replicates), generate (DBN, 7 samples, original +
  shuffled lists, test split) + surrogate (DCM, 5 passes);
- at sizes up to --references-max (1M), ingest, predict and evaluate against a single-process reference of
  the same work (benchmarks/stage_reference.py: pyarrow + numpy, Parquet in and out, inputs exported from
  the tables untimed): ingest parses and checks the log written out as a per-query text file (the stage
  ingests that file too, as a dataset of its own: generating the synthetic log is not what a user's ingest
  does), predict gives every model's probabilities and scores for all N SERPs, evaluate LL, PPL@t, NDCG@k
  and 200 bootstrap replicates of every split. A "same work" column checks each reference's result against
  the stage's;
- with --em-reference, the fit is the plain MLE for --iterations passes and the numpy EM reference
  (benchmarks/numpy_reference.py) runs on the same train SERPs: seconds per pass, ratio, and the largest
  difference between the two fits' global parameters (same estimator, so ~1e-12).

After the last size: log-log slopes of stage time against size between consecutive sizes (1 = linear) and
the time ratios; with --fit-scale, benchmarks/fit_scale.py's UBM fit to convergence (conf/cluster.yaml's
engine) at this run's shape and at the folded one (--shuffle-width 0), each in a process of its own.
Results are printed as a markdown table and written to <workdir>/results.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
from pyspark.sql import functions as F

from benchmarks import stage_reference as SR
from benchmarks.numpy_reference import REFERENCES
from clickeval_spark import tables
from clickeval_spark.context import StageContext
from clickeval_spark.metrics.evaluate import MetricOptions
from clickeval_spark.stages import STAGES
from clickeval_spark.config import PROJECT_ROOT, load_config
from clickeval_spark.models import LEARNED, get_model
from clickeval_spark.fitted import FittedModel
from clickeval_spark.runtime import session_for


class Sampler:
    """Calls ``sample()`` every ``every`` seconds in a thread while the ``with`` block runs."""

    def __init__(self, every: float):
        self.every, self._stop = every, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _run(self):
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.every)

    def sample(self) -> None:
        raise NotImplementedError


class PeakRss(Sampler):
    """Largest summed RSS of this process and all its descendants, sampled in a thread."""

    def __init__(self, every: float = 0.2):
        super().__init__(every)
        self.peak, self.peak_at = 0, ""   # peak_at: UTC time of the peak, to find the stage in the log
        self._me = os.getpid()

    def sample(self) -> None:
        rss = _tree_rss(self._me)
        if rss > self.peak:
            self.peak, self.peak_at = rss, datetime.now(timezone.utc).strftime("%H:%M:%S")


def _tree_rss(root: int) -> int:
    parent, rss = {}, {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            parent[int(d)] = int(fields[1])
            rss[int(d)] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):
            continue
    total, todo = 0, [root]
    children: dict[int, list[int]] = {}
    for pid, pp in parent.items():
        children.setdefault(pp, []).append(pid)
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo += children.get(pid, [])
    return total


def timed(fn, *args):
    t = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t


def reference_arrays(spark, warehouse: str, cfg, M: int):
    """The train split as padded numpy arrays (pair index, clicks), in this process.

    Pairs are numbered by a 64-bit hash of (query_id, doc_id) collected from Spark and
    np.unique'd here; this is the benchmark's setup, not part of any timing.
    """
    return reference_arrays_of(StageContext(spark, cfg, warehouse, "-").serps(("train",)), M)


def reference_arrays_of(serps, M: int):
    """`reference_arrays` of any SERP rows (query_id, doc_ids, clicks)."""
    pair_hash = F.transform(F.slice("doc_ids", 1, M), lambda d: F.xxhash64(F.col("query_id"), d))
    tbl = serps.select(pair_hash.alias("h"), F.slice("clicks", 1, M).cast("array<tinyint>").alias("c")).toArrow()
    h_list, c_list = tbl.column("h").combine_chunks(), tbl.column("c").combine_chunks()
    lens = np.diff(h_list.offsets.to_numpy())
    B = len(lens)
    mask = np.arange(M)[None, :] < lens[:, None]
    uniq, inverse = np.unique(h_list.flatten().to_numpy(), return_inverse=True)
    pair = np.full((B, M), -1, dtype=np.int64)
    pair[mask] = inverse
    clicks = np.zeros((B, M), dtype=np.int8)
    clicks[mask] = c_list.flatten().to_numpy()
    return pair, clicks, len(uniq)


def distinct_rows(serps, M: int) -> int:
    """The rows the packed blocks hold: distinct (query, first M docs, first M clicks); a query's SERPs
    share a block, so distinct over the log is the sum over the blocks."""
    return serps.select("query_id", F.slice("doc_ids", 1, M), F.slice("clicks", 1, M)).distinct().count()


#: the fit with the package's own defaults (beta prior, `k: auto`, tol 1e-4, at most 50 passes): what users run
PACKAGE_FIT = {"fit.prior": {"kind": "beta", "k": "auto"}, "fit.tol": 1e-4, "fit.iterations": 50}


def fit_seconds(ctx: StageContext, fit_start: datetime, fit_s: float) -> tuple[dict[str, float], float]:
    """Each model's seconds in the fit stage, from its `fit:<model>` runs row's start (a model's row opens as
    its fit begins, so the next row's start ends it): EM models include their valid scoring, the learned model
    its own timer (features, out-of-fold rows, L-BFGS, per-pair table, valid LL); the last model's time runs to
    the stage's end (the model_params write) unless it is the learned one. And the seconds before the first
    model (the EM models' shared pack of the train and valid SERPs)."""
    rows = (ctx.this_run("runs").where(F.col("job").startswith("fit:"))
            .select("job", "started_at", "details").orderBy("started_at").collect())
    starts = [r["started_at"].replace(tzinfo=timezone.utc).timestamp() for r in rows]
    end = fit_start.timestamp() + fit_s
    out = {}
    for i, r in enumerate(rows):
        name = r["job"].split(":", 1)[1]
        if name in LEARNED:
            out[name] = float(json.loads(r["details"])["seconds"])
        else:
            out[name] = (starts[i + 1] if i + 1 < len(rows) else end) - starts[i]
    return out, (starts[0] - fit_start.timestamp()) if starts else 0.0


def run_size(spark, conf: str, n: int, workdir: Path, iterations: int, shuffle_width: float | None = None,
             references: bool = True, em_reference: bool = False, lcm: bool = False,
             last_stage: str = "surrogate") -> dict:
    """Every stage on an n-SERP log, each timed with the peak RSS of this process tree while it ran.

    references: the ingest, predict and evaluate stages against their single-process references.
    em_reference: fit the plain MLE for ``iterations`` passes (conf/bench.yaml's fit) and time the numpy EM
    reference on the same SERPs; else the fit runs the package defaults (`PACKAGE_FIT`).
    lcm: the learned model fitted too, after the EM models (its learner's defaults either way).
    last_stage: the stages after it are not run (their columns print "-").
    """
    wh = str(workdir / (f"warehouse-{n}" if shuffle_width is None else f"warehouse-{n}-w{shuffle_width:g}"))
    overrides = {
        "ingest.dataset": f"bench-{n}", "ingest.synthetic.n_serps": n,
        "ingest.synthetic.n_queries": max(100, n // 25),
        "spark.warehouse": wh, "report.path": str(workdir / "reports"),
        **({"fit.iterations": iterations} if em_reference else PACKAGE_FIT),
    }
    if shuffle_width is not None:
        overrides["ingest.synthetic.shuffle_width"] = shuffle_width
    if lcm:
        overrides["fit.models"] = [*[m for m in load_config(conf).fit.models if m != "lcm"], "lcm"]
    cfg = load_config(conf, overrides)
    run_id = f"bench-{n}"
    out: dict = {"n_serps": n, "stages": {}, "peak_rss_gb": {}, "fit": {}, "reference": {},
                 "package_fit": not em_reference}
    ctx = StageContext(spark, cfg, wh, run_id)
    ref_dir = workdir / f"reference-{n}"

    def stage(name: str):
        with PeakRss() as rss:
            result, out["stages"][name] = timed(STAGES[name], ctx)
        out["peak_rss_gb"][name] = rss.peak / 2**30
        print(f"size {n:,}: {name} {out['stages'][name]:.1f} s, peak RSS {rss.peak / 2**30:.1f} GiB "
              f"at {rss.peak_at} UTC", flush=True)
        return result

    counts = stage("ingest")
    out["n_train"] = int(counts["serps_train"])
    if references:
        out["reference"]["ingest"] = ingest_against_reference(spark, conf, overrides, ctx, ref_dir)
    fit_start = datetime.now(timezone.utc)
    histories = stage("fit")
    out["fit_model_s"], out["fit_pack_s"] = fit_seconds(ctx, fit_start, out["stages"]["fit"])
    print(f"size {n:,}: fit seconds per model " + ", ".join(f"{k} {v:.1f}" for k, v in out["fit_model_s"].items())
          + f" (pack {out['fit_pack_s']:.1f})", flush=True)
    if "lcm" in histories:
        d = json.loads(ctx.this_run("runs").where(F.col("job") == "fit:lcm").first()["details"])
        out["lcm"] = {k: d[k] for k in ("rows", "iterations", "train_objective", "valid_ll", "seconds")}
    out["n_rows"] = distinct_rows(ctx.serps(("train",)), cfg.fit.max_rank)
    params = tables.read_table(spark, wh, "model_params")
    if em_reference:
        pair, clicks, n_pairs = reference_arrays(spark, wh, cfg, cfg.fit.max_rank)
        out["n_pairs"] = n_pairs
    for name, hist in histories.items():
        if name in LEARNED:   # not EM: no passes (its own row in `markdown`)
            continue
        per_iter = [s for _, _, s in hist[1:]]
        spark_s = float(np.median(per_iter))
        row = {"spark_s_per_iter": spark_s, "spark_iter_s": per_iter, "passes": len(per_iter),
               "serp_iter_per_s": out["n_train"] / spark_s}
        if em_reference and name in REFERENCES:
            glob, ref_times = REFERENCES[name](pair, clicks, n_pairs, iterations)
            fitted = FittedModel.from_rows(params, get_model(name), run_id, cfg.fit.max_rank)
            ref_s = float(np.median(ref_times))
            row.update(numpy_s_per_iter=ref_s, numpy_iter_s=list(ref_times), ratio=ref_s / spark_s,
                       max_global_diff=max(float(np.max(np.abs(fitted.glob[k] - glob[k]))) for k in glob))
        out["fit"][name] = row
    if em_reference:
        del pair, clicks
    if last_stage == "fit":
        return out
    stage("predict")
    if references:
        inputs = reference_inputs(ctx, params, ref_dir)
        out["reference"]["predict"] = predict_reference(ctx, inputs, ref_dir)
    stage("evaluate")
    if references:
        out["reference"]["evaluate"] = evaluate_reference(ctx, inputs, ref_dir)
    out["n_evaluated"] = n
    stage("generate")
    stage("surrogate")
    return out


# ----------------------------------------------------------- the stages against single-process references

def ingest_against_reference(spark, conf: str, overrides: dict, ctx: StageContext, ref_dir: Path) -> dict:
    """The benchmark log as a per-query text file (untimed), ingested by the stage (format per_query_text,
    a dataset of its own) and by the reference: both parse, check and split the same lines."""
    text = SR.export_text(ctx.serps(), ref_dir / "text")
    text_cfg = load_config(conf, {**overrides, "ingest.dataset": f"{ctx.dataset}-text", "ingest.format": "per_query_text",
                                  "ingest.paths": {"all": text}, "ingest.text_variant": "graphcm"})
    counts, stage_s = timed(STAGES["ingest"], StageContext(spark, text_cfg, ctx.warehouse, f"{ctx.run_id}-text"))
    split = text_cfg.ingest.split
    ref_counts, ref_s = timed(lambda: SR.ingest(text, ref_dir / "serps-from-text.parquet",
                                                dataset=text_cfg.ingest.dataset, max_rank=text_cfg.ingest.max_rank,
                                                split_seed=split.seed, ratios=split.ratios))
    return {"stage_s": stage_s, "reference_s": ref_s, "bytes": Path(text).stat().st_size,
            "check": f"accepted {counts['serps_accepted']:,} / {ref_counts['serps_accepted']:,}"}


def reference_inputs(ctx: StageContext, params, ref_dir: Path) -> dict:
    """What the predict and evaluate references read, exported from the tables (untimed)."""
    cols = ("dataset", "split", "session_id", "serp_id", "query_id", "doc_ids", "clicks")
    return {
        "serps": SR.export_parquet(ctx.serps().select(*cols), ref_dir / "serps"),
        "labels": SR.export_parquet(ctx.labels(), ref_dir / "labels"),
        # the fitted models and, on a simulated log, the true one (`truth`), as the predict stage scores them
        "params": SR.run_params(params, ctx.cfg, ctx.run_id, ref_dir),
    }


def predict_reference(ctx: StageContext, inputs: dict, ref_dir: Path) -> dict:
    """Every fitted model's predictions and scores of every SERP; checked against the stage's LL per split."""
    t = time.perf_counter()
    lls = {name: SR.predict(inputs["serps"], p, ref_dir / name, ctx.cfg.fit.max_rank, ctx.cfg.evaluate.eps)
           for name, p in inputs["params"].items()}
    ref_s = time.perf_counter() - t
    stage = json.loads(ctx.this_run("runs").where(F.col("job") == "predict").first()["details"])["log_likelihood"]
    diff = max(abs(lls[m][s] - v) for m, by_split in stage.items() for s, v in by_split.items())
    return {"reference_s": ref_s, "check": f"LL per split: max abs diff {diff:.1e}"}


def evaluate_reference(ctx: StageContext, inputs: dict, ref_dir: Path) -> dict:
    """The metrics of every model's reference predictions; checked against the stage's metric values."""
    # every model the predict stage predicted: the fitted ones and, on a simulated log, `truth`
    ecfg, params = ctx.cfg.evaluate, inputs["params"]
    opts = MetricOptions.from_config(ecfg, ctx.cfg.fit.max_rank)
    rows, ref_s = timed(lambda: SR.evaluate(
        {m: ref_dir / m / "predictions.parquet" for m in params}, inputs["serps"], inputs["labels"],
        {m: ref_dir / m / "scores.parquet" for m, p in params.items() if p.model.qd_params}, opts, ecfg.splits,
        ecfg.reference_model))
    mine = {(r["model"], r["split"], r["metric"], r["cutoff"]): r["value"] for r in rows}
    stage = {(r["model"], r["split"], r["metric"], r["cutoff"]): r["value"]
             for r in ctx.this_run("metrics").where(F.col("ci_low").isNotNull()).collect()}
    diff = max(abs(mine.get(k, math.nan) - v) / max(1.0, abs(v)) for k, v in stage.items())
    return {"reference_s": ref_s, "check": f"{len(stage)} metric values (same keys: {set(mine) == set(stage)}): "
                                           f"max rel diff {diff:.1e}"}


def slope(results: list[dict], get) -> list[float]:
    return [math.log(get(b) / get(a)) / math.log(b["n_serps"] / a["n_serps"])
            for a, b in zip(results, results[1:])]


STAGE_NAMES = ("ingest", "fit", "predict", "evaluate", "generate", "surrogate")


def markdown(results: list[dict], args, started: str, scale: list[dict] | None = None) -> str:
    width = "" if args.shuffle_width is None else f" --shuffle-width {args.shuffle_width:g}"
    extra = ((" --em-reference" if args.em_reference else "") + f" --lcm-max {args.lcm_max}"
             + ("" if args.last_stage == "surrogate" else f" --last-stage {args.last_stage}")
             + (f" --fit-scale {args.fit_scale}" if args.fit_scale else ""))
    lines = [f"Command: `.venv/bin/python -m benchmarks.run --sizes {args.sizes} --iterations {args.iterations}"
             f"{width} --references-max {args.references_max}{extra}`",
             f"Date: {started}; machine: {os.cpu_count()} cores, "
             f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB, "
             f"{platform.platform()}; Spark local[*]; spark.driver.memory {args.driver_memory}; synthetic "
             f"shuffle_width {'conf/bench.yaml' if args.shuffle_width is None else args.shuffle_width}; fit: "
             f"{'plain MLE, --iterations passes' if args.em_reference else 'package defaults (beta, k auto, tol 1e-4)'}",
             "", "Seconds per stage (peak RSS of the process tree while it ran, GiB):", "",
             "| SERPs | train SERPs | packed rows / train SERPs | " + " | ".join(STAGE_NAMES) + " | all stages |",
             "|---|---|---|" + "---|" * (len(STAGE_NAMES) + 1)]
    for r in results:
        s, rss = r["stages"], r["peak_rss_gb"]
        lines.append(f"| {r['n_serps']:,} | {r['n_train']:,} | {r['n_rows'] / r['n_train']:.3f} | "
                     + " | ".join(f"{s[k]:.1f} ({rss[k]:.1f})" if k in s else "-" for k in STAGE_NAMES)
                     + f" | {sum(s.values()):.1f} |")
    if len(results) > 1:
        lines += ["", "Log-log slope of stage time against SERPs between consecutive sizes (1.0 = linear), and "
                  "the time ratio:", "",
                  "| quantity | " + " | ".join(f"{a['n_serps']:,} → {b['n_serps']:,}"
                                              for a, b in zip(results, results[1:])) + " |",
                  "|---|" + "---|" * (len(results) - 1)]
        quantities = [(k, lambda r, k=k: r["stages"][k]) for k in STAGE_NAMES if k in results[0]["stages"]]
        quantities.append(("all stages", lambda r: sum(r["stages"].values())))
        for label, get in quantities:
            cells = [f"{x:.2f} ({get(b) / get(a):.1f}x)" for x, a, b in
                     zip(slope(results, get), results, results[1:])]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    refs = [(r, stage, ref) for r in results for stage, ref in r["reference"].items()]
    if refs:
        lines += ["", "Stages against their single-process reference (benchmarks/stage_reference.py: pyarrow + numpy, "
                  "Parquet in and out; ingest on the log written as per-query text):", "",
                  "| SERPs | stage | Spark s | reference s | ratio reference/Spark | same work |", "|---|---|---|---|---|---|"]
        for r, stage, ref in refs:
            spark_s = ref.get("stage_s", r["stages"][stage])
            lines.append(f"| {r['n_serps']:,} | {stage} | {spark_s:.1f} | {ref['reference_s']:.1f} "
                         f"| {ref['reference_s'] / spark_s:.3f} | {ref['check']} |")
    lines += ["", "EM passes of the fit stage (train split; median wall time of a pass, every candidate of the pass):",
              "", "| SERPs | model | passes | Spark s/pass | numpy s/iter | ratio numpy/Spark "
              "| max abs diff of global params |", "|---|---|---|---|---|---|---|"]
    for r in results:
        for name, f in r["fit"].items():
            lines.append(f"| {r['n_serps']:,} | {name} | {f['passes']} | {f['spark_s_per_iter']:.2f} "
                         f"| {f.get('numpy_s_per_iter', float('nan')):.2f} | {f.get('ratio', float('nan')):.2f} "
                         f"| {f.get('max_global_diff', float('nan')):.1e} |")
    lcm_rows = [r for r in results if "lcm" in r]
    if lcm_rows:
        lines += ["", "The fit stage per model (each model's `fit:<model>` runs row: from its start to the next "
                  "model's; lcm: its own timer, features to valid LL; pack: the EM models' shared pack before the "
                  "first), and lcm against the EM models of the same run:", "",
                  "| SERPs | pack s | " + " | ".join(f"{m} s" for m in lcm_rows[0]["fit_model_s"])
                  + " | lcm / EM models together | lcm positions | lcm valid LL per position |",
                  "|---|---|" + "---|" * len(lcm_rows[0]["fit_model_s"]) + "---|---|---|"]
        for r in lcm_rows:
            fm = r["fit_model_s"]
            em = r["fit_pack_s"] + sum(v for k, v in fm.items() if k != "lcm")
            lines.append(f"| {r['n_serps']:,} | {r['fit_pack_s']:.1f} | " + " | ".join(f"{v:.1f}" for v in fm.values())
                         + f" | {fm['lcm'] / em:.2f} (EM with pack {em:.1f} s) | {r['lcm']['rows']:,} "
                         f"| {r['lcm']['valid_ll']:.4f} |")
    for sc in scale or []:
        passes = sc["em_pass_s"]
        lines += ["", f"UBM fit to convergence (benchmarks.fit_scale, {sc['engine']} engine, shuffle_width "
                  f"{sc['shuffle_width']:g}; target: under CLAX's 148 s on one GPU):", "",
                  "| train SERPs | packed rows | valid SERPs | fit stage s | passes | EM passes s | peak RSS GiB |",
                  "|---|---|---|---|---|---|---|",
                  f"| {sc['train_serps']:,} | {sc['packed_rows']:,} | {sc['valid_serps']:,} "
                  f"| {sc['fit_stage_s']:.1f} | {sc['passes']} | {sum(passes):.1f} | {sc['peak_rss_gb']:.1f} |"]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000000,10000000")
    ap.add_argument("--iterations", type=int, default=5, help="with --em-reference: the fixed EM passes")
    ap.add_argument("--conf", default=str(PROJECT_ROOT / "conf" / "bench.yaml"))
    ap.add_argument("--workdir", default="/tmp/clickeval-bench")
    ap.add_argument("--shuffle-width", type=float, default=None,
                    help="override ingest.synthetic.shuffle_width (0: one fixed doc list per query)")
    ap.add_argument("--driver-memory", default="6g", help="spark.driver.memory of the benchmark's session")
    ap.add_argument("--references-max", type=int, default=1_000_000,
                    help="the single-process references run at sizes up to this many SERPs")
    ap.add_argument("--lcm-max", type=int, default=1_000_000,
                    help="the learned model lcm is fitted beside the EM models at sizes up to this many SERPs "
                         "(0: never)")
    ap.add_argument("--last-stage", choices=("fit", "surrogate"), default="surrogate",
                    help="fit: stop each size after the fit stage (ingest and fit only)")
    ap.add_argument("--em-reference", action="store_true",
                    help="fit the plain MLE for --iterations passes and time the numpy EM reference beside it")
    ap.add_argument("--fit-scale", type=int, default=0, metavar="TRAIN_SERPS",
                    help="then benchmarks.fit_scale's UBM fit to convergence on this many train SERPs, at this "
                         "run's shuffle width and at 0 (folded), each in its own process")
    args = ap.parse_args(argv)
    started = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    workdir = Path(args.workdir)
    cfg = load_config(args.conf)
    spark = session_for(load_config(args.conf, {"spark.conf": {**cfg.spark.conf,
                                                               "spark.driver.memory": args.driver_memory}}),
                        "benchmark")
    results = []
    try:
        for n in (int(x) for x in args.sizes.split(",")):
            t = time.perf_counter()
            results.append(run_size(spark, args.conf, n, workdir, args.iterations, args.shuffle_width,
                                    references=n <= args.references_max, em_reference=args.em_reference,
                                    lcm=n <= args.lcm_max, last_stage=args.last_stage))
            print(f"size {n:,} done in {time.perf_counter() - t:.0f} s", flush=True)
            (workdir / "results.json").write_text(json.dumps(results, indent=1))
    finally:
        spark.stop()
    scale = []
    for width in ([args.shuffle_width if args.shuffle_width is not None else cfg.ingest.synthetic.shuffle_width, 0.0]
                  if args.fit_scale else []):   # each in a process of its own: session, warehouse, peak memory
        scale_dir = workdir / f"fit-scale-w{width:g}"
        subprocess.run([sys.executable, "-m", "benchmarks.fit_scale", "--train-serps", str(args.fit_scale),
                        "--shuffle-width", str(width), "--iterations", "400", "--workdir", str(scale_dir)], check=True)
        scale.append(json.loads((scale_dir / "fit_scale.json").read_text()))
    print(markdown(results, args, started, scale))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
