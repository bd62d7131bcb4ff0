"""Local runs retry a failed task (issue 36.3): a Python worker that dies costs one retried task, not the job,
and the resident EM engine's barrier stage survives a restart with the same fit."""

from __future__ import annotations

import os

import pytest
from pyspark import BarrierTaskContext, TaskContext
from pyspark.sql import functions as F

from clickeval_spark.em import blocks, driver, resident
from clickeval_spark.models import get_model
from clickeval_spark.session import with_task_retries
from tests.em.logs import Log, fit_values


@pytest.mark.parametrize("master, conf, expected", [
    ("local[2]", {}, "local[2,4]"),
    ("local[*]", {}, "local[*,4]"),
    ("local", {}, "local[1,4]"),
    ("local[*]", {"spark.task.maxFailures": "2"}, "local[*,2]"),
    ("local[2,3]", {}, "local[2,3]"),            # the user's own count stays
    ("spark://host:7077", {}, "spark://host:7077"),
    ("local-cluster[2,1,1024]", {}, "local-cluster[2,1,1024]"),
    (None, {}, None),
])
def test_local_masters_get_task_retries(master, conf, expected):
    assert with_task_retries(master, conf) == expected


def test_a_refused_failure_count_is_an_error():
    with pytest.raises(ValueError, match="spark.task.maxFailures must be >= 1, got 0"):
        with_task_retries("local[2]", {"spark.task.maxFailures": "0"})


def test_the_test_session_retries_tasks(spark):
    """The fixture's local[2] runs as local[2,4]; a task whose Python worker exits on the first attempt
    is run again and the job gives every row."""
    assert spark.sparkContext.master == "local[2,4]"

    def die_on_first_attempt(batches):
        ctx = TaskContext.get()
        if ctx.partitionId() == 1 and ctx.attemptNumber() == 0:
            os._exit(3)   # as a worker killed by the OS: no exception, the process is gone
        for batch in batches:
            yield batch.assign(attempt=ctx.attemptNumber())

    out = (spark.range(0, 1000, numPartitions=2)
           .mapInPandas(die_on_first_attempt, "id long, attempt int")
           .agg(F.count("*").alias("n"), F.sum("id").alias("s"), F.max("attempt").alias("retried")).first())
    assert (out["n"], out["s"], out["retried"]) == (1000, 499500, 1)


@pytest.mark.slow
def test_a_resident_stage_whose_task_dies_still_gives_the_stage_engines_fit(spark, monkeypatch):
    """Under retries a barrier stage restarts whole. A resident task whose worker exits before it joins makes
    the driver either take the restarted stage's tasks or fall back to the stage engine: the fit is the
    stage engine's either way, and nothing hangs."""
    model, M = get_model("pbm"), 5
    log = Log(model, n_serps=300, M=M, seed=62)
    packed = blocks.pack_serps(log.df(spark), max_rank=M)
    real_task_fn = resident._task_fn

    def dying_task_fn(*args):
        run = real_task_fn(*args)

        def first_attempt_dies(batches):
            ctx = BarrierTaskContext.get()
            if ctx.partitionId() == 0 and ctx.stageAttemptNumber() == 0:
                os._exit(3)
            yield from run(batches)
        return first_attempt_dies

    options = dict(iterations=6, tol=None, max_rank=M)
    try:
        expected = driver.fit(packed, model, engine="stages", **options)
        monkeypatch.setattr(resident, "_task_fn", dying_task_fn)
        got = driver.fit(packed, model, engine="resident", **options)
    finally:
        packed.unpersist()
    assert fit_values(got) == fit_values(expected)
