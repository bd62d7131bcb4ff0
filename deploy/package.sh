#!/usr/bin/env bash
# Build what a cluster needs for spark-submit, into DIST (first argument, default dist/):
#   clickeval_spark-*.whl      the package
#   clickeval_spark.zip        the same code for --py-files (clickeval_spark/ and jobs/)
#   clickeval_venv.tar.gz      a packed venv for --archives: the wheel + its runtime dependencies
#                              (no dev tools), packed by venv-pack
#   jobs/*.py                  the entry points to submit
#   conf/                      one YAML per environment
#
# One stage in client deploy mode (what tests/cluster/ runs against a standalone cluster):
#   spark-submit --master spark://HOST:7077 --deploy-mode client \
#     --packages io.delta:delta-spark_2.13:4.0.1 \
#     --conf spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension \
#     --conf spark.sql.catalog.spark_catalog=org.apache.spark.sql.delta.catalog.DeltaCatalog \
#     --archives dist/clickeval_venv.tar.gz#environment --py-files dist/clickeval_spark.zip \
#     --conf spark.pyspark.python=./environment/bin/python \
#     --conf spark.pyspark.driver.python=ENV/bin/python \
#     dist/jobs/ingest.py --conf dist/conf/cluster.yaml --run-id RUN_ID
# ./environment exists only in the executors' working directories. In client mode the driver's
# Python starts on the submitting host before any archive is unpacked, so ENV is the same
# archive unpacked there once (mkdir ENV && tar -xzf dist/clickeval_venv.tar.gz -C ENV).
# The packed venv links to the Python it was made from (PYTHON's base interpreter, 3.11):
# every host needs that interpreter at the same path.
# Delta's jars come from --packages. deploy/airflow/clickeval_dag.py submits the same artefacts in
# cluster deploy mode (YARN, Kubernetes), where the driver's container unpacks ./environment too.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
DIST=${1:-dist}

if [ -n "$(ls -A "$DIST" 2>/dev/null)" ] && [ ! -e "$DIST/clickeval_spark.zip" ]; then
  echo "package.sh: $DIST is not empty and holds no earlier build: not clearing it" >&2
  exit 2
fi
rm -rf "$DIST" && mkdir -p "$DIST/jobs"
DIST=$(cd "$DIST" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# the wheel is built from a copy: setuptools writes build/ and *.egg-info beside the sources and
# never deletes from build/, so a module removed from the checkout could still ship
mkdir "$work/src"
cp -r pyproject.toml README.md clickeval_spark jobs "$work/src/"
"$PY" -m pip wheel --quiet --disable-pip-version-check --no-deps --wheel-dir "$DIST" "$work/src"
zip -q -r "$DIST/clickeval_spark.zip" clickeval_spark jobs -x '*/__pycache__/*' '*.pyc'
cp jobs/*.py "$DIST/jobs/"
cp -r conf "$DIST/conf"

# a fresh venv from the same base interpreter, with the wheel and its pinned runtime dependencies
"$PY" -m venv "$work/venv"
"$work/venv/bin/python" -m pip install --quiet --disable-pip-version-check "$DIST"/clickeval_spark-*.whl
# left out: pyspark's jars (the cluster's Spark brings its own JVM side) and the packages' test
# suites (a third of the files; nothing imports them at run time): every executor unpacks the
# archive again for every application
"$PY" -m venv_pack --quiet --prefix "$work/venv" --output "$DIST/clickeval_venv.tar.gz" \
  --exclude 'lib/python*/site-packages/pyspark/jars/*' --exclude 'lib/python*/site-packages/*/tests/*'

echo "built in $DIST: $(cd "$DIST" && ls | tr '\n' ' ')"
