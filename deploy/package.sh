#!/usr/bin/env bash
# Build what a cluster needs for spark-submit, into DIST (first argument, default dist/):
#   clickeval.pex              the runtime: the clickeval_spark wheel and its pinned runtime dependencies
#                              (no dev tools, no pyspark), a PEX that runs as a Python interpreter
#                              (clickeval.pex -m MODULE, clickeval.pex SCRIPT) on any CPython 3.11 it
#                              finds on PATH (or PEX_PYTHON_PATH): never the build host's path
#   clickeval_spark-*.whl      the package
#   clickeval_spark.zip        the same code for --py-files (clickeval_spark/ and jobs/)
#   jobs/*.py                  the entry points to submit
#   conf/                      one YAML per environment
#   BUILD_INFO.json            what the build needs and was made of: python (the minor version every
#                              host must run), built_with, the git commit, the pex and wheel versions;
#                              the code carries the same record (clickeval_spark/_build.py), and a job
#                              under another minor version stops with one line (clickeval_spark/build_info.py)
#
# One stage in client deploy mode (deploy/cluster/submit.sh; what tests/cluster/ runs):
#   spark-submit --master spark://HOST:7077 --deploy-mode client \
#     --packages io.delta:delta-spark_2.13:4.0.1 \
#     --conf spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension \
#     --conf spark.sql.catalog.spark_catalog=org.apache.spark.sql.delta.catalog.DeltaCatalog \
#     --files dist/clickeval.pex --conf spark.pyspark.python=./clickeval.pex \
#     --conf spark.pyspark.driver.python=$PWD/dist/clickeval.pex \
#     dist/jobs/ingest.py --conf dist/conf/cluster.yaml --run-id RUN_ID
# --files puts the PEX in every executor's working directory; in client mode the driver runs the
# same file from this host (an absolute path). Cluster deploy mode (YARN, Kubernetes) sets both to
# ./clickeval.pex. pyspark and py4j are not in the PEX: the cluster's Spark puts its own pyspark.zip
# and py4j zip on the Python workers' PYTHONPATH (and the driver's), and the PEX inherits PYTHONPATH
# after its own packages (--inherit-path=fallback): the PEX's clickeval_spark and numpy win over
# any copy elsewhere, Spark's pyspark is the only one. The interpreter's own site-packages are
# inherited too, before PYTHONPATH: a pyspark installed there would shadow Spark's.
# Delta's jars come from --packages.
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

# the wheel and the zip are built from a copy: setuptools writes build/ and *.egg-info beside the
# sources and never deletes from build/, so a module removed from the checkout could still ship;
# and the copy gets the build's record, clickeval_spark/_build.py
mkdir "$work/src"
cp -r pyproject.toml README.md clickeval_spark jobs "$work/src/"
find "$work/src" -name __pycache__ -prune -exec rm -rf {} +
commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
dirty=$([ -n "$(git status --porcelain -- clickeval_spark jobs pyproject.toml 2>/dev/null)" ] && echo true || echo false)
"$PY" - "$work/src/clickeval_spark/_build.py" "$DIST/BUILD_INFO.json" "$commit" "$dirty" <<'EOF'
import importlib.metadata, json, platform, sys, tomllib
module, info, commit, dirty = sys.argv[1:]
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
build = {"python": "%d.%d" % sys.version_info[:2], "built_with": platform.python_version(),
         "implementation": platform.python_implementation(), "version": project["version"],
         "git_commit": commit, "git_dirty": dirty == "true", "pex": importlib.metadata.version("pex")}
open(module, "w").write(f'"""Written by deploy/package.sh: what this build needs (clickeval_spark.build_info)."""\n\n'
                        f"BUILD = {build!r}\n")
json.dump(build, open(info, "w"), indent=2)
EOF
minor=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
"$PY" -m pip wheel --quiet --disable-pip-version-check --no-deps --wheel-dir "$DIST" "$work/src"
(cd "$work/src" && zip -q -r "$DIST/clickeval_spark.zip" clickeval_spark jobs -x '*/__pycache__/*' '*.pyc')
cp jobs/*.py "$DIST/jobs/"
cp -r conf "$DIST/conf"

# the PEX: the wheel and its runtime dependencies, at the versions this venv runs (its pip freeze as
# constraints: the transitive ones are not pinned in pyproject). pyspark and py4j are left out
# (--exclude: the cluster's Spark brings its own, and pyspark's wheel is ~400 MB of jars). The
# shebang is any python3: the PEX then picks a CPython 3.11 from PATH (PEX_PYTHON_PATH) and
# re-executes itself under it, or stops naming what it found.
"$PY" -m pip freeze --disable-pip-version-check --exclude-editable > "$work/constraints.txt"
"$PY" -m pex "$DIST"/clickeval_spark-*.whl --exclude pyspark --constraints "$work/constraints.txt" \
  --python "$PY" --interpreter-constraint "CPython==$minor.*" --python-shebang '/usr/bin/env python3' \
  --inherit-path=fallback --output-file "$DIST/clickeval.pex"

echo "built in $DIST: $(cd "$DIST" && ls | tr '\n' ' ')(clickeval.pex $(du -m "$DIST/clickeval.pex" | cut -f1) MB, Python $minor)"
