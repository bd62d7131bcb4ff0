"""An "external" click model, fitted outside the pipeline, written in the click_predictions /
relevance_scores contract so `clickeval evaluate` scores it like a built-in model.

It stands in for a neural model trained elsewhere (NCM, CACM, AICM on a GPU): a
scikit-learn logistic regression on per-position features — rank, clicks above,
whether the previous result was clicked, and the (query, doc) click-through rate of
the train split (Beta(1, 1)-smoothed; leave-one-out on the training rows, so the
model does not learn to trust a CTR computed from the very click it predicts). p_click_cond uses the click history;
p_click uses rank and CTR only. The relevance score of a (query, doc) is its
smoothed train CTR.

Like any external trainer it brings its data to one process (`toPandas`): fine for
a sample such as TREC Session 2014, not for a production log.

    .venv/bin/python -m examples.external_model --warehouse /tmp/wh --dataset trec2014 --out /tmp/ext
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from sklearn.linear_model import LogisticRegression

from clickeval_spark.tables import read_table

MAX_RANK = 10


def positions(serps: DataFrame) -> DataFrame:
    """Per position: ids, click, rank, clicks above, previous click."""
    rows = serps.select("split", "serp_id", "query_id",
                        F.posexplode(F.arrays_zip("doc_ids", "clicks")).alias("pos", "dc"))
    above = Window.partitionBy("serp_id").orderBy("rank").rowsBetween(Window.unboundedPreceding, -1)
    prev = Window.partitionBy("serp_id").orderBy("rank")
    return (rows.where(F.col("pos") < MAX_RANK)
            .select("split", "serp_id", "query_id", F.col("dc.doc_ids").alias("doc_id"),
                    (F.col("pos") + 1).cast("int").alias("rank"), F.col("dc.clicks").alias("click"))
            .withColumn("clicks_above", F.coalesce(F.sum("click").over(above), F.lit(0)))
            .withColumn("prev_click", F.coalesce(F.lag("click").over(prev), F.lit(0))))


def _features(df: pd.DataFrame, history: bool) -> np.ndarray:
    ranks = np.eye(MAX_RANK)[df["rank"].to_numpy() - 1]
    cols = [ranks, np.log(df[["ctr"]].to_numpy())]
    if history:
        cols += [np.minimum(df[["clicks_above"]].to_numpy(), 3), df[["prev_click"]].to_numpy()]
    return np.hstack(cols)


def fit_and_write(spark: SparkSession, warehouse: str, dataset: str, out: str, split: str = "test") -> None:
    serps = read_table(spark, warehouse, "serps").where(F.col("dataset") == dataset)
    pos = positions(serps)
    counts = (pos.where("split = 'train'").groupBy("query_id", "doc_id")
              .agg(F.sum("click").alias("clicks"), F.count("*").alias("shown")))
    ctr = counts.select("query_id", "doc_id", ((F.col("clicks") + 1) / (F.col("shown") + 2)).alias("ctr"))
    prior = pos.where("split = 'train'").agg(F.avg("click")).first()[0]
    train = (pos.where("split = 'train'").join(counts, ["query_id", "doc_id"], "inner")
             .withColumn("ctr", (F.col("clicks") - F.col("click") + 1) / (F.col("shown") - 1 + 2)).toPandas())
    target = pos.where(F.col("split") == split).join(ctr, ["query_id", "doc_id"], "left").fillna({"ctr": prior}).toPandas()
    y = train["click"].to_numpy()
    cond = LogisticRegression(max_iter=1000).fit(_features(train, True), y)
    marginal = LogisticRegression(max_iter=1000).fit(_features(train, False), y)
    target["p_click_cond"] = cond.predict_proba(_features(target, True))[:, 1]
    target["p_click"] = marginal.predict_proba(_features(target, False))[:, 1]
    preds = target[["serp_id", "rank", "click", "p_click_cond", "p_click"]]
    spark.createDataFrame(preds).write.mode("overwrite").parquet(f"{out}/predictions")
    labels = read_table(spark, warehouse, "relevance_labels").where(F.col("dataset") == dataset)
    pairs = (pos.select("query_id", "doc_id").unionByName(labels.select("query_id", "doc_id")).distinct()
             .join(ctr, ["query_id", "doc_id"], "left").select("query_id", "doc_id",
                                                                F.coalesce("ctr", F.lit(prior)).alias("score")))
    pairs.write.mode("overwrite").parquet(f"{out}/relevance_scores")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warehouse", required=True)
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--split", default="test")
    args = parser.parse_args(argv)
    from clickeval_spark.session import build_session
    spark = build_session("external-model", master="local[*]", warehouse=args.warehouse, embedded=True,
                          conf={"spark.sql.shuffle.partitions": "8", "spark.ui.enabled": "false",
                                "spark.databricks.delta.snapshotPartitions": "2"})
    fit_and_write(spark, args.warehouse, args.dataset, args.out, args.split)
    print(f"wrote {args.out}/predictions and {args.out}/relevance_scores")
    return 0


if __name__ == "__main__":
    sys.exit(main())
