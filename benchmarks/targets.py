"""Issue 57's four targets from one command: the 1M and 10M fit stages, EM per pass against the numpy reference,
and `make run` warm.

    .venv/bin/python -m benchmarks.targets                      # about 40 min on 2 cores
    .venv/bin/python -m benchmarks.targets --parts make-run --rounds 5

Each part runs in processes of its own, as a user runs it (a fresh session and JVM each), one after the other:

- scale: `benchmarks.run --sizes 1000000,10000000 --references-max 0 --lcm-max 0 --last-stage fit` (ingest,
  then the fit stage of PBM, UBM and DBN with the package defaults);
- em: `benchmarks.run --sizes 1000000 --em-reference --references-max 0 --lcm-max 0 --last-stage fit` (the plain
  MLE for 5 passes beside the numpy EM reference on the same SERPs);
- make-run: `clickeval run --conf conf/local.yaml` (what `make run` runs once set up) on a fresh warehouse: once
  untimed (a fresh clone's first run compiles numba's kernels and Python's bytecode: warm means after it), then
  ``--rounds`` times each with the ten classic models (`fit.models` without the learned ones) and with the
  config's own models, alternately; the median of each, and the learned model's own seconds as the median of
  the rounds' differences (a round's two runs are minutes apart, so the machine's drift mostly cancels).

Before each part a fixed numpy computation is timed (`cpu_reference`, best of 3), a rough gauge of the machine's
speed at that moment (on this VM the JVM's work has drifted more than numpy's, so it is no calibration).
Everything goes under a fresh <workdir>/<start time>/; prints one table, target by target, and writes
targets.json there.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from clickeval_spark.config import PROJECT_ROOT, load_config
from clickeval_spark.models import LEARNED

#: CLAX's fit of one model on 10M Yandex sessions on one GPU (issue 57): the 10M fit's per-model bound
CLAX_GPU_S = {"pbm": 136.0, "ubm": 147.0, "dbn": 270.0}
#: issue 57's targets: fit stages (s), EM per pass (numpy reference / Spark), make run (s), a learned model's own s
LIMITS = {"fit_1m_s": 90.0, "fit_10m_s": 300.0, "em_ratio": 1.0, "make_run_s": 90.0, "learned_s": 15.0}
PARTS = ("scale", "em", "make-run")
MAKE_RUN_CONF = "conf/local.yaml"


def cpu_reference() -> float:
    """Seconds (best of 3) of a fixed numpy computation: a sort of 8M floats and four 1500² matrix products."""
    rng = np.random.default_rng(57)
    x, a = rng.random(8_000_000), rng.random((1500, 1500))
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        np.sort(x)
        for _ in range(4):
            a @ a
        best = min(best, time.perf_counter() - t)
    return best


def _run(cmd: list[str]) -> float:
    """Run ``cmd`` from the project root (output passed through), failing loudly; its wall seconds."""
    print("$ " + " ".join(cmd), flush=True)
    t = time.perf_counter()
    subprocess.run(cmd, cwd=PROJECT_ROOT, check=True)
    return time.perf_counter() - t


def _bench_run(workdir: Path, *args: str) -> list[dict]:
    """`benchmarks.run` up to the fit stage, without references or the learned model: its results.json."""
    _run([sys.executable, "-m", "benchmarks.run", "--references-max", "0", "--lcm-max", "0", "--last-stage", "fit",
          "--workdir", str(workdir), *args])
    return json.loads((workdir / "results.json").read_text())


def scale_part(workdir: Path) -> dict:
    results = _bench_run(workdir / "scale", "--sizes", "1000000,10000000")
    return {str(r["n_serps"]): {"fit_s": r["stages"]["fit"], "fit_model_s": r["fit_model_s"],
                                "pack_s": r["fit_pack_s"], "passes": {m: f["passes"] for m, f in r["fit"].items()}}
            for r in results}


def em_part(workdir: Path) -> dict:
    (r,) = _bench_run(workdir / "em", "--sizes", "1000000", "--em-reference")
    return {m: {k: f[k] for k in ("spark_s_per_iter", "numpy_s_per_iter", "ratio", "max_global_diff")}
            for m, f in r["fit"].items()}


def _make_run(out: Path, models: list[str]) -> float:
    """`make run`'s job with ``fit.models`` on a fresh warehouse under ``out``: its wall seconds."""
    shutil.rmtree(out, ignore_errors=True)
    return _run([str(Path(sys.executable).parent / "clickeval"), "run", "--conf", MAKE_RUN_CONF,
                 "--set", f"spark.warehouse={out / 'warehouse'}", "--set", f"report.path={out / 'reports'}",
                 "--set", f"fit.models=[{','.join(models)}]"])


def make_run_part(workdir: Path, rounds: int) -> dict:
    configured = load_config(PROJECT_ROOT / MAKE_RUN_CONF).fit.models
    classic = [m for m in configured if m not in LEARNED]
    variants = {"classic": classic} | ({"configured": configured} if configured != classic else {})
    _make_run(workdir / "make-run" / "warm-up", configured)
    walls: dict[str, list[float]] = {name: [] for name in variants}
    for r in range(rounds):
        for name, models in variants.items():
            walls[name].append(_make_run(workdir / "make-run" / f"{name}-{r}", models))
            print(f"make-run {name} round {r}: {walls[name][-1]:.1f} s", flush=True)
    medians = {name: statistics.median(w) for name, w in walls.items()}
    learned = (statistics.median(c - k for c, k in zip(walls["configured"], walls["classic"]))
               if "configured" in walls else None)
    return {"models": variants, "walls": walls, "median_s": medians, "learned_s": learned}


def table(res: dict) -> str:
    rows = ["| target | limit | measured | met |", "|---|---|---|---|"]

    def row(what: str, limit: str, measured: str, met: bool) -> None:
        rows.append(f"| {what} | {limit} | {measured} | {'yes' if met else '**no**'} |")

    if "scale" in res:
        for n, key in (("1000000", "fit_1m_s"), ("10000000", "fit_10m_s")):
            s = res["scale"][n]
            per = ", ".join(f"{m} {v:.1f}" for m, v in s["fit_model_s"].items())
            row(f"{int(n):,} SERPs: fit stage (pbm, ubm, dbn, package defaults)", f"≤ {LIMITS[key]:.0f} s",
                f"{s['fit_s']:.1f} s ({per}; pack {s['pack_s']:.1f})", s["fit_s"] <= LIMITS[key])
        per = res["scale"]["10000000"]["fit_model_s"]
        row("10,000,000 SERPs: each model below CLAX's GPU time (the shared pack not counted)",
            ", ".join(f"{m} {v:.0f} s" for m, v in CLAX_GPU_S.items()),
            ", ".join(f"{m} {per[m]:.1f} s" for m in CLAX_GPU_S),
            all(per[m] < v for m, v in CLAX_GPU_S.items()))
    if "em" in res:
        ratios = {m: f["ratio"] for m, f in res["em"].items()}
        row("EM per pass against the numpy reference (1M, 5 passes)", f"≥ {LIMITS['em_ratio']:.1f}x",
            ", ".join(f"{m} {v:.2f}x" for m, v in ratios.items())
            + f" (global params within {max(f['max_global_diff'] for f in res['em'].values()):.1e})",
            min(ratios.values()) >= LIMITS["em_ratio"])
    if "make-run" in res:
        runs = res["make-run"]
        walls = ", ".join(f"{w:.1f}" for w in runs["walls"]["classic"])
        row("`make run` warm, the ten classic models", f"≤ {LIMITS['make_run_s']:.0f} s",
            f"median {runs['median_s']['classic']:.1f} s ({walls})",
            runs["median_s"]["classic"] <= LIMITS["make_run_s"])
        if runs["learned_s"] is not None:
            walls = ", ".join(f"{w:.1f}" for w in runs["walls"]["configured"])
            row("`make run` warm: the learned model's own seconds (median of the rounds' differences)",
                f"≤ {LIMITS['learned_s']:.0f} s",
                f"{runs['learned_s']:.1f} s (median {runs['median_s']['configured']:.1f} s with it: {walls})",
                runs["learned_s"] <= LIMITS["learned_s"])
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", default="/tmp/clickeval-targets")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"a comma-separated subset of {', '.join(PARTS)}")
    ap.add_argument("--rounds", type=int, default=3, help="make-run: timed runs of each variant")
    args = ap.parse_args(argv)
    parts = args.parts.split(",")
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        ap.error(f"--parts: unknown {', '.join(unknown)}; choose from {', '.join(PARTS)}")
    now = datetime.now(timezone.utc)
    started = now.strftime("%Y-%m-%d %H:%M UTC")
    workdir = Path(args.workdir) / now.strftime("%Y%m%dT%H%M%S")   # fresh warehouses every time
    workdir.mkdir(parents=True)
    res: dict = {"started": started, "cpu_reference_s": {}, "part_s": {}}
    for part in (p for p in PARTS if p in parts):
        res["cpu_reference_s"][part] = cpu_reference()
        t = time.perf_counter()
        if part == "scale":
            res[part] = scale_part(workdir)
        elif part == "em":
            res[part] = em_part(workdir)
        else:
            res[part] = make_run_part(workdir, args.rounds)
        res["part_s"][part] = time.perf_counter() - t
        (workdir / "targets.json").write_text(json.dumps(res, indent=1))
    res["cpu_reference_s"]["end"] = cpu_reference()
    (workdir / "targets.json").write_text(json.dumps(res, indent=1))
    print(f"\nCommand: `.venv/bin/python -m benchmarks.targets --parts {args.parts} --rounds {args.rounds}`; "
          f"started {started}; under {workdir}; parts " + ", ".join(f"{k} {v:.0f} s" for k, v in res["part_s"].items()))
    print("CPU reference (the same numpy work before each part and at the end, s): "
          + ", ".join(f"{k} {v:.3f}" for k, v in res["cpu_reference_s"].items()) + "\n")
    print(table(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
