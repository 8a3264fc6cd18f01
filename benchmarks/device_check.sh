#!/usr/bin/env bash
# The device check, by the path that sessions with a GPU run ("bash benchmarks/device_check.sh"):
# benchmarks/device_check/run.sh, with the same options and environment (README.rst).
exec bash "$(dirname "$0")/device_check/run.sh" "$@"
