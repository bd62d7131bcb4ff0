from pyspark.sql import types as T

from clickeval_spark.config import IngestConfig
from tests.sources.helpers import rules, run

SCHEMA = T.StructType([
    T.StructField("session_id", T.StringType()),
    T.StructField("serp_id", T.StringType()),
    T.StructField("query_id", T.StringType()),
    T.StructField("doc_ids", T.ArrayType(T.StringType())),
    T.StructField("clicks", T.ArrayType(T.IntegerType())),
    T.StructField("split", T.StringType()),
])


def test_canonical_delta_rows_are_validated(spark, tmp_path):
    rows = [("s1", "a", "q", ["d1", "d2"], [1, 0], "train"),
            ("s1", "b", "q", ["d1", "d2"], [1, 7], "train"),      # click_not_binary
            ("s2", "c", "q", ["d2", "d1"], [0, 0], None)]         # no split: hashed from the session
    path = str(tmp_path / "serps_delta")
    spark.createDataFrame(rows, SCHEMA).write.format("delta").save(path)
    out = run(spark, IngestConfig(dataset="t", format="delta", paths={"all": path}))
    got = sorted((r["serp_id"], r["clicks"], r["split"] is not None) for r in out.serps.collect())
    assert got == [("a", [1, 0], True), ("c", [0, 0], True)]
    assert rules(out) == [("serp_id=b", "click_not_binary")]
