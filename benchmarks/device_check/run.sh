#!/usr/bin/env bash
# The one-command check of mtt on a GPU machine: installs the wheels carried in .whl/
# (benchmarks/device_check/wheels.sh) without a registry, puts this checkout's src/ on
# PYTHONPATH and runs benchmarks/device_check/main.py, which writes device_check.md and
# device_check.json to $OUT (or --out DIR). benchmarks/device_check.sh runs this script.
#
#     bash benchmarks/device_check.sh                   # on the GPU machine, everything
#     bash benchmarks/device_check.sh --cpu-only ...    # a dry run: what a CPU can do
#
# Options are main.py's (--help). Environment: PYTHON (default python3), MTT_SITE
# (where the wheels go, default /tmp/mtt-site), MTT_NO_INSTALL=1 to use the packages that
# PYTHON already has.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PYTHON=${PYTHON:-python3}
SITE=${MTT_SITE:-/tmp/mtt-site}
started=$(date +%s)

if [ "${MTT_NO_INSTALL:-0}" != 1 ] && compgen -G "$ROOT/.whl/*.whl" >/dev/null; then
    echo "installing $(ls "$ROOT"/.whl/*.whl | wc -l) wheels from .whl/ into $SITE (no index)"
    "$PYTHON" -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --disable-pip-version-check --target "$SITE" "$ROOT"/.whl/*.whl || {
        echo "device_check: installing the wheels failed" >&2
        exit 1
    }
    export PYTHONPATH="$ROOT/src:$SITE${PYTHONPATH:+:$PYTHONPATH}"
    echo "installed in $(($(date +%s) - started)) s"
else
    echo "no wheels installed (no .whl/*.whl, or MTT_NO_INSTALL=1): using $PYTHON's own packages"
    export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1
exec "$PYTHON" "$ROOT/benchmarks/device_check/main.py" "$@"
