"""Evaluate: metrics (LL, PPL@t, NDCG@k with session-bootstrap intervals) for built-in and external models."""

import sys

from clickeval_spark.runtime import run_job
from clickeval_spark.stages import evaluate_stage


def main(argv=None) -> int:
    return run_job("evaluate", argv, evaluate_stage)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
