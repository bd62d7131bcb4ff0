#!/usr/bin/env bash
# Build what a cluster needs for spark-submit:
#   dist/clickeval_spark-*.whl      the package (for a packed venv or pip install on the image)
#   dist/clickeval_spark.zip        the same code for --py-files (clickeval_spark/ and jobs/)
#   dist/jobs/*.py                  the entry points to submit
# Delta comes from --packages io.delta:delta-spark_2.13:4.0.1 (see deploy/airflow_dag.py).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
rm -rf dist && mkdir -p dist/jobs
"$PY" -m pip wheel --quiet --no-deps --wheel-dir dist .
zip -q -r dist/clickeval_spark.zip clickeval_spark jobs -x '*/__pycache__/*'
cp jobs/*.py dist/jobs/
cp -r conf dist/conf
echo "built: $(ls dist)"
