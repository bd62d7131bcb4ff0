"""Fit: every configured click model on the train split (by EM; the learned one by Spark MLlib) → model_params."""

from __future__ import annotations

import json
import logging
from datetime import datetime, timedelta, timezone
from contextlib import ExitStack
from functools import reduce

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from clickeval_spark import progress
from clickeval_spark.config import WindowConfig
from clickeval_spark.context import StageContext
from clickeval_spark.em import EMOptions, fit, pack_serps
from clickeval_spark.em.options import RecentChoice
from clickeval_spark.learned import train_lcm
from clickeval_spark.models import LEARNED, get_model

log = logging.getLogger("clickeval")


def run(ctx: StageContext) -> dict[str, list]:
    """Fit every configured model on the train split; write model_params in one commit.

    The valid split is packed beside the training SERPs: every fit scores it in the
    same passes, which is what `fit.prior.k: auto` chooses the prior strength by.
    Every model's params go into one Delta commit (one slice per model, replaced together).
    Each model's `fit:<model>` runs row stays open until that commit lands, so a failed write
    marks them all failed.
    """
    fcfg = ctx.cfg.fit
    histories, rows = {}, []
    # packed once: every model's EM runs on the same query blocks
    packed = (pack_serps(ctx.serps(("train",)), max_rank=fcfg.max_rank, held_out=ctx.serps(("valid",)))
              if any(name not in LEARNED for name in fcfg.models) else None)
    recent = _recent_choices(ctx) if fcfg.prior.reuse.days is not None else {}
    try:
        with ExitStack() as open_runs:
            for name in fcfg.models:
                run = open_runs.enter_context(ctx.record(f"fit:{name}"))
                if name in LEARNED:
                    fitted = _fit_learned(ctx, run)
                    rows.append(fitted.to_rows(ctx.run_id))
                    histories[name] = fitted.history
                    continue
                model = get_model(name)
                with progress.current().em(name) as on_pass:
                    fitted = fit(packed, model, EMOptions.from_config(fcfg, model, packed.max_rank, recent.get(name)),
                                 logger=log, on_pass=on_pass)
                rows.append(fitted.to_rows(ctx.run_id))
                run.counts["iterations"] = max(0, len(fitted.history) - 1)
                run.details["history"] = [{"iteration": i, "train_ll": ll, "log_posterior": lp, "seconds": s}
                                          for (i, ll, s), lp in zip(fitted.history, fitted.log_posterior)]
                run.details["prior"] = fitted.prior_spec
                run.details["valid_ll"] = fitted.valid_ll
                if fitted.selection is not None:
                    run.details["prior_selection"] = fitted.selection
                histories[name] = fitted.history
                chosen = (f", prior {fitted.prior_spec['kind']}" if not fitted.selection
                          else f", prior {_chosen(fitted)} reused from run {fitted.selection['reused']['run_id']}"
                          if "reused" in fitted.selection else f", prior {_chosen(fitted)} by valid LL")
                if "estimator_valid_ll" in fitted.prior_spec:   # a model with two estimators (SDBN): valid chose
                    chosen += f", estimator {fitted.prior_spec['estimator']} by valid LL"
                valid_ll = "" if fitted.valid_ll is None else f", valid LL per position {fitted.valid_ll:.4f}"
                stop = fitted.prior_spec.get("stop", {})
                if stop.get("seen_share") is not None:   # why it went on to convergence, or did not
                    chosen += f", stop {stop['rule']} ({stop['seen_share']:.1%} of valid positions seen in training)"
                print(f"fit {name}: {run.counts['iterations']} iteration(s), "
                      f"train LL per SERP {fitted.history[-1][1]:.4f}{valid_ll}{chosen}")
            ctx.write(reduce(DataFrame.unionByName, rows), "model_params",
                      {"run_id": ctx.run_id, "model": tuple(fcfg.models)})
    finally:
        if packed is not None:
            packed.unpersist()
    return histories


def _recent_choices(ctx: StageContext) -> dict[str, RecentChoice]:
    """fit.prior.reuse: per EM model, what `k: auto` chose in this dataset's latest succeeded fit of it that ran
    the whole selection (`recent_selections`: one `runs` row a model, never per-SERP data). A fit whose
    counting estimator won (SDBN's, valid's choice) or whose prior was not chosen has none."""
    reuse = ctx.cfg.fit.prior.reuse
    if not ctx.exists("runs"):
        return {}
    jobs = [f"fit:{name}" for name in ctx.cfg.fit.models if name not in LEARNED]
    rows = recent_selections(ctx.read("runs"), dataset=ctx.dataset, jobs=jobs, run_id=ctx.run_id, days=reuse.days,
                             window=ctx.cfg.window, now=datetime.now(timezone.utc).replace(tzinfo=None)).collect()
    recent = {}
    for row in rows:
        details = json.loads(row["details"] or "{}")
        sel, estimator = details.get("prior_selection"), details.get("prior", {}).get("estimator", "em")
        if sel and estimator == "em" and details.get("valid_ll") is not None:
            recent[row["job"].split(":", 1)[1]] = RecentChoice(
                run_id=row["run_id"], k=sel["chosen_k"], seen_means=sel["chosen_seen_means"],
                valid_ll=details["valid_ll"], margin=reuse.margin)
    return recent


def recent_selections(runs: DataFrame, *, dataset: str, jobs: list[str], run_id: str, days: int,
                      window: WindowConfig | None, now: datetime) -> DataFrame:
    """Per job of ``jobs``, the `runs` row (run_id, job, details) of this dataset's latest succeeded fit, in
    another run, that ran the whole selection: a fit that reused a choice is skipped, so each day's valid LL
    is held against the selection's, not against yesterday's (small moves cannot add up), and the choice is
    made again once the selection is ``days`` old.

    Old by what: with a log_date ``window`` (a daily run's), by the data: the fit's window ended at most
    ``days`` days before this one's, and not after it, so a backfill reuses only choices made on earlier days
    of data. Without one, by the clock: it finished at most ``days`` before ``now`` (naive UTC, as runs.py
    writes finished_at, so both convert to an instant alike)."""
    then = F.to_date(F.get_json_object("details", "$.window.end"))
    if window is not None:
        fresh, order = then.between(F.lit(window.end - timedelta(days=days)), F.lit(window.end)), [then.desc()]
    else:
        fresh, order = F.col("finished_at") >= F.lit(now - timedelta(days=days)), []
    latest = Window.partitionBy("job").orderBy(*order, F.col("finished_at").desc(), F.col("run_id").desc())
    return (runs
            .where((F.col("dataset") == dataset) & F.col("job").isin(*jobs) & (F.col("status") == "succeeded")
                   & (F.col("run_id") != run_id) & fresh
                   & F.get_json_object("details", "$.prior_selection.reused.run_id").isNull())
            .withColumn("latest", F.row_number().over(latest))
            .where(F.col("latest") == 1)
            .select("run_id", "job", "details"))


def _fit_learned(ctx: StageContext, run):
    """The learned model (models.lcm) trained on the train split by Spark MLlib, scored on valid; its learner,
    settings, weights' names and timings go into its `fit:lcm` runs row."""
    fitted, details = train_lcm(ctx.serps(("train",)), ctx.cfg.fit.max_rank, valid=ctx.serps(("valid",)))
    run.counts["iterations"] = details["iterations"]
    run.counts["training_positions"] = details["rows"]
    run.details.update(details)
    valid_ll = "" if fitted.valid_ll is None else f", valid LL per position {fitted.valid_ll:.4f}"
    print(f"fit lcm: LogisticRegression, {details['iterations']} iteration(s) on {details['rows']} positions, "
          f"train log loss per position {details['train_objective']:.4f} (out of fold){valid_ll}, "
          f"{details['seconds']:.1f} s")
    return fitted


def _chosen(fitted) -> str:
    """The strength the valid split chose: k=<value>, or each family's empirical Bayes strength."""
    sel = fitted.selection
    seen = ", seen pairs toward their ranks' means" if sel["chosen_seen_means"] == "rank" else ""
    if sel["chosen_k"] != "eb":
        return f"k={sel['chosen_k']:g}{seen}"
    ks = next(g["strengths"] for g in sel["grid"] if g["k"] == "eb" and g["seen_means"] == sel["chosen_seen_means"])
    return "eb (" + ", ".join(f"{p} k={k:g}" for p, k in sorted(ks.items())) + f"){seen}"
