"""Fit: every configured click model on the train split (by EM; the learned one by Spark MLlib) → model_params."""

from __future__ import annotations

import logging
from contextlib import ExitStack
from functools import reduce

from pyspark.sql import DataFrame

from clickeval_spark import progress
from clickeval_spark.context import StageContext
from clickeval_spark.em import EMOptions, fit, pack_serps
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
                    fitted = fit(packed, model, EMOptions.from_config(fcfg, model, packed.max_rank), logger=log,
                                 on_pass=on_pass)
                rows.append(fitted.to_rows(ctx.run_id))
                run.counts["iterations"] = max(0, len(fitted.history) - 1)
                run.details["history"] = [{"iteration": i, "train_ll": ll, "log_posterior": lp, "seconds": s}
                                          for (i, ll, s), lp in zip(fitted.history, fitted.log_posterior)]
                run.details["prior"] = fitted.prior_spec
                run.details["valid_ll"] = fitted.valid_ll
                if fitted.selection is not None:
                    run.details["prior_selection"] = fitted.selection
                histories[name] = fitted.history
                chosen = (f", prior {_chosen(fitted)} by valid LL" if fitted.selection
                          else f", prior {fitted.prior_spec['kind']}")
                if "estimator_valid_ll" in fitted.prior_spec:   # a model with two estimators (SDBN): valid chose
                    chosen += f", estimator {fitted.prior_spec['estimator']} by valid LL"
                valid_ll = "" if fitted.valid_ll is None else f", valid LL per position {fitted.valid_ll:.4f}"
                print(f"fit {name}: {run.counts['iterations']} iteration(s), "
                      f"train LL per SERP {fitted.history[-1][1]:.4f}{valid_ll}{chosen}")
            ctx.write(reduce(DataFrame.unionByName, rows), "model_params",
                      {"run_id": ctx.run_id, "model": tuple(fcfg.models)})
    finally:
        if packed is not None:
            packed.unpersist()
    return histories


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
