#!/usr/bin/env bash
# Creates the venv that tests/deploy loads the DAG in: Airflow + the Apache Spark provider, pinned
# by requirements-test.txt and constraints-py3.11.txt beside this script. Airflow's dependencies
# clash with the main .venv's pins, so they get their own venv (default <repo>/.venv-airflow).
#
#   deploy/airflow/setup_test_venv.sh            create or update it (no-op while it is current)
#   deploy/airflow/setup_test_venv.sh --lock     re-resolve requirements-test.txt and rewrite
#                                                constraints-py3.11.txt (needs only PyPI)
#
# The venv is current while its stamp holds the hash of both pin files; a change to either
# rebuilds it from scratch. Env: PYTHON (default python3.11), AIRFLOW_TEST_VENV (venv path).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
PYTHON=${PYTHON:-python3.11}
VENV=${AIRFLOW_TEST_VENV:-$ROOT/.venv-airflow}
REQS=$HERE/requirements-test.txt
CONSTRAINTS=$HERE/constraints-py3.11.txt
PIP_VERSION=26.3

if [[ ${1:-} == --lock ]]; then
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    "$PYTHON" -m venv "$tmp/venv"
    "$tmp/venv/bin/python" -m pip install --quiet "pip==$PIP_VERSION"
    "$tmp/venv/bin/python" -m pip install --quiet --dry-run --ignore-installed \
        --report "$tmp/report.json" -r "$REQS"
    "$tmp/venv/bin/python" - "$tmp/report.json" "$CONSTRAINTS" <<'EOF'
import json, re, sys
report, out = sys.argv[1:]
header = [line for line in open(out) if line.startswith("#")]
pins = sorted(
    (re.sub(r"[-_.]+", "-", item["metadata"]["name"]).lower(), item["metadata"]["version"])
    for item in json.load(open(report))["install"]
)
with open(out, "w") as fh:
    fh.writelines(header)
    fh.writelines(f"{name}=={version}\n" for name, version in pins)
print(f"{out}: {len(pins)} pins")
EOF
    exit 0
fi

# One set-up at a time (two pytest runs starting together): lock this script itself.
exec 9<"$0"
flock 9

STAMP=$VENV/.installed-stamp
want=$(cat "$REQS" "$CONSTRAINTS" | sha256sum | cut -d' ' -f1)
if [[ -f $STAMP && $(cat "$STAMP") == "$want" ]]; then
    exit 0
fi

echo "setting up $VENV (Airflow for tests/deploy) ..." >&2
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet "pip==$PIP_VERSION"
"$VENV/bin/python" -m pip install --quiet -r "$REQS" -c "$CONSTRAINTS"
"$VENV/bin/python" -c "import airflow, airflow.providers.apache.spark; print('airflow', airflow.__version__)" >&2
echo "$want" >"$STAMP"
