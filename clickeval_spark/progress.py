"""Progress a person can follow: one line when a stage starts and one when it ends, with seconds."""

from __future__ import annotations

import functools
import time
from datetime import datetime, timezone
from typing import Callable, TypeVar

F = TypeVar("F", bound=Callable)


def _now() -> str:
    return f"{datetime.now(timezone.utc):%H:%M:%S}"


def stage(name: str) -> Callable[[F], F]:
    """Decorate a stage function (spark, cfg, warehouse, run_id): print its start and end (or failure)."""
    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def run(spark, cfg, warehouse, run_id, *args, **kwargs):
            print(f"[{_now()}] {name}: start (run_id={run_id}, dataset={cfg.ingest.dataset})", flush=True)
            t0 = time.perf_counter()
            try:
                result = fn(spark, cfg, warehouse, run_id, *args, **kwargs)
            except Exception:
                print(f"[{_now()}] {name}: failed after {time.perf_counter() - t0:.1f} s", flush=True)
                raise
            print(f"[{_now()}] {name}: done in {time.perf_counter() - t0:.1f} s", flush=True)
            return result
        return run  # type: ignore[return-value]
    return wrap
