"""The pipeline's stages, in run order: the one list the CLI, the main job, jobs/, the DAG's test and
the tests use.

Each stage is a module with `run(ctx: StageContext)`: it reads Delta tables (ingest: the input log),
writes Delta tables, and records its run in `runs`. DESIGN.md §2 draws the same chain.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timezone
from types import ModuleType
from typing import Any

from clickeval_spark import progress
from clickeval_spark.context import StageContext
from clickeval_spark.metrics.summary import metrics_table
from clickeval_spark.stages import evaluate, fit, generate, ingest, predict, report, surrogate


@dataclass(frozen=True)
class Stage:
    module: ModuleType

    @property
    def name(self) -> str:
        return self.module.__name__.rsplit(".", 1)[-1]

    @property
    def summary(self) -> str:
        """The first line of the module's docstring: the CLI's help for the stage."""
        return (self.module.__doc__ or self.name).strip().splitlines()[0]

    def __call__(self, ctx: StageContext) -> Any:
        """Run the stage, with one progress line when it starts and one when it ends (or fails)."""
        print(f"[{_now()}] {self.name}: start (run_id={ctx.run_id}, dataset={ctx.dataset})", flush=True)
        t0 = time.perf_counter()
        try:
            with progress.current().stage(self.name):
                ctx.check_catalog()
                with ctx.batched_runs():
                    result = self.module.run(ctx)
                ctx.register_in_catalog()
        except Exception:
            print(f"[{_now()}] {self.name}: failed after {time.perf_counter() - t0:.1f} s", flush=True)
            raise
        print(f"[{_now()}] {self.name}: done in {time.perf_counter() - t0:.1f} s", flush=True)
        return result


def _now() -> str:
    return f"{datetime.now(timezone.utc):%H:%M:%S}"


STAGES: dict[str, Stage] = {stage.name: stage for stage in
                            map(Stage, (ingest, fit, predict, evaluate, generate, surrogate, report))}


def stages_from(start: str | None = None) -> list[str]:
    """The stage names in pipeline order, from ``start`` on (all of them without one)."""
    names = list(STAGES)
    return names[names.index(start) if start else 0:]


def run_pipeline(ctx: StageContext, start: str | None = None) -> dict[str, Any]:
    """The main job: every stage in order in one session (from `start` on, to resume a run whose earlier
    stages have written their tables); ends with the metrics table and the report's path."""
    names = stages_from(start)
    with progress.current().pipeline(names):
        results = {name: STAGES[name](ctx) for name in names}
    print(f"\npipeline done: run_id={ctx.run_id}, tables under {ctx.warehouse}")
    if "evaluate" in results:
        rows = ctx.this_run("metrics", dataset=ctx.dataset).collect()
        print(metrics_table([r.asDict() for r in rows], ctx.cfg.evaluated_models))
    if "report" in results:
        print(f"report: {results['report']}")
    return results
