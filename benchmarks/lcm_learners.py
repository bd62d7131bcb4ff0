"""The learned model's learner, chosen by held-out LL and fit time: Spark MLlib LogisticRegression (the shipped
one, at a few settings), GBTClassifier and MultilayerPerceptronClassifier on the same out-of-fold feature rows.

    .venv/bin/python -m benchmarks.lcm_learners --warehouse warehouse --dataset synthetic-pbm

Reads the train and valid splits of a run's serps table (e.g. the one `make run` leaves), builds the training
rows as the fit stage does (learned/features.py, out of fold) and the valid rows with the whole training split's
statistics (what predict attaches; unseen pairs 0), fits each learner on the executors and prints, per learner,
the valid LL per position (DESIGN §5, clipped at 1e-6) and the fit's wall seconds.
"""

from __future__ import annotations

import argparse
import time

from pyspark.ml.classification import GBTClassifier, LogisticRegression, MultilayerPerceptronClassifier
from pyspark.ml.functions import vector_to_array
from pyspark.sql import functions as F

from clickeval_spark.learned.features import out_of_fold, pair_stats, positions, rank_rates, with_expected
from clickeval_spark.learned.train import LearnerOptions, design_frame, design_width
from clickeval_spark.models.lcm import QD_STATS
from clickeval_spark.session import build_session


def valid_rows(valid, stats, M, opts, ctr, ctr0):
    """The valid positions with the training split's statistics (0 for an unseen pair), as predict sees them."""
    pos = with_expected(positions(valid, M, opts.seed, opts.folds), ctr, ctr0)
    return (pos.select("query_id", "doc_id", "rank", "click", "n_above", "last_click")
            .join(stats.drop("n_obs"), on=["query_id", "doc_id"], how="left")
            .fillna(0.0, subset=list(QD_STATS))
            .select("rank", "click", "n_above", "last_click", *QD_STATS))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--warehouse", default="warehouse")
    ap.add_argument("--dataset", default="synthetic-pbm")
    ap.add_argument("--max-rank", type=int, default=10)
    ap.add_argument("--learners", default="lr,lr_reg,lr_short,gbt,mlp")
    args = ap.parse_args(argv)
    spark = build_session("lcm-learners", master="local[2]", warehouse=args.warehouse, embedded=True,
                          conf={"spark.sql.shuffle.partitions": "8", "spark.ui.enabled": "false",
                                "spark.driver.memory": "4g"})
    M, opts = args.max_rank, LearnerOptions()
    serps = spark.read.format("delta").load(f"{args.warehouse}/serps").where(F.col("dataset") == args.dataset)
    train, valid = serps.where(F.col("split") == "train"), serps.where(F.col("split") == "valid")
    pos = positions(train, M, opts.seed, opts.folds).persist()
    ctr, ctr0, n = rank_rates(pos, M)
    expected = with_expected(pos, ctr, ctr0)
    design = design_frame(out_of_fold(expected), M).persist()
    stats = pair_stats(expected)
    held = design_frame(valid_rows(valid, stats, M, opts, ctr, ctr0), M).persist()
    print(f"{args.dataset}: {design.count()} training positions, {held.count()} valid positions, "
          f"{design_width(M)} features")
    learners = {
        "lr": LogisticRegression(fitIntercept=False, regParam=opts.reg_param, maxIter=100, tol=1e-7),
        "lr_reg": LogisticRegression(fitIntercept=False, regParam=1e-3, maxIter=100, tol=1e-7),
        "lr_short": LogisticRegression(fitIntercept=False, regParam=opts.reg_param, maxIter=30, tol=1e-6),
        "gbt": GBTClassifier(maxIter=30, maxDepth=5, stepSize=0.1, seed=1),
        "mlp": MultilayerPerceptronClassifier(layers=[design_width(M), 16, 2], maxIter=100, seed=1, blockSize=1024),
    }
    eps = 1e-6
    for name in args.learners.split(","):
        t0 = time.perf_counter()
        model = learners[name].fit(design)
        seconds = time.perf_counter() - t0
        p = F.least(F.greatest(vector_to_array("probability")[1], F.lit(eps)), F.lit(1 - eps))
        ll = (model.transform(held).select(F.when(F.col("label") == 1, F.log(p)).otherwise(F.log(1 - p)).alias("t"))
              .agg(F.avg("t")).first()[0])
        print(f"{name:9s} valid LL per position {ll:.5f}  fit {seconds:.1f} s")
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
