from __future__ import annotations

from pathlib import Path

from pyspark.sql import functions as F

from clickeval_spark import ingestion
from clickeval_spark.config import IngestConfig


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def run(spark, cfg: IngestConfig, run_id: str = "t1"):
    """Parse + validate (no Delta write): the IngestOutput of a config."""
    return ingestion.run_ingest(spark, cfg, ingestion.parse_serps(spark, cfg), ingestion.parse_labels(spark, cfg), run_id)


def rules(out) -> list[tuple]:
    """(line or record, rule) of every quarantined record, sorted."""
    rows = out.quarantine.select(F.coalesce(F.col("line").cast("string"), "record").alias("at"), "rule").collect()
    return sorted((r["at"], r["rule"]) for r in rows)


def tiangong_result(rank, doc, vtype="1"):
    """One TianGong-ST <result> element."""
    return (f'<result rank="{rank}"><docid>{doc}</docid><url>http://x/{doc}</url>'
            f"<title>t {doc}</title><vtype>{vtype}</vtype></result>")


def interaction(num, query, docs, click_ranks, ranks=None):
    """One TianGong-ST <interaction>: ``docs`` shown at ``ranks`` (1..n by default), clicks at ``click_ranks``."""
    ranks = ranks or list(range(1, len(docs) + 1))
    results = "".join(tiangong_result(r, d) for r, d in zip(ranks, docs))
    clicks = "".join(f'<click num="{i + 1}"><rank>{r}</rank></click>' for i, r in enumerate(click_ranks))
    return (f'<interaction num="{num}"><query_id>{query}</query_id><query>text of {query}</query>'
            f"<results>{results}</results><clicked>{clicks}</clicked></interaction>")
