"""Ingest: read the configured source, validate, split; write serps, relevance_labels, quarantine."""

import sys

from clickeval_spark.runtime import run_job
from clickeval_spark.stages import ingest_stage


def main(argv=None) -> int:
    return run_job("ingest", argv, ingest_stage)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
