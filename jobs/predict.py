"""Predict: click_predictions (p_click_cond, p_click per rank) and relevance_scores for fitted models."""

import sys

from clickeval_spark.runtime import run_job
from clickeval_spark.stages import predict_stage


def main(argv=None) -> int:
    return run_job("predict", argv, predict_stage)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
