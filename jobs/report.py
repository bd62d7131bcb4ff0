"""Report: a self-contained HTML page (metrics table, PPL@rank, NDCG@k, Reverse-vs-Forward PPL) from the tables."""

import sys

from clickeval_spark.runtime import run_job
from clickeval_spark.stages import report_stage


def main(argv=None) -> int:
    return run_job("report", argv, report_stage)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
