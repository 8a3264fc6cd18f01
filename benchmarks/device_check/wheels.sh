#!/usr/bin/env bash
# Fill .whl/ at the repository's root with what benchmarks/device_check.sh installs on the
# GPU machine, which has Python 3.12 and torch 2.11 but no package registry.
#
#     bash benchmarks/device_check/wheels.sh  # here, once, before the device tool's `run`
#
# Then pass carry: [".whl"] to `run` (docs/src/performance.rst, "On a GPU machine").
# .whl/ is ignored through .git/info/exclude and never committed; about 24 MiB.
#
# The versions are the newest inside mtt's ranges (pyproject.toml) on 2026-12-01. Each of
# metatensor-torch 0.10.8, metatomic-torch 0.1.19 and featomic-torch 0.7.6 holds builds for
# torch 2.3 to 2.14, torch-2.11 among them: this script checks that it still does. The
# machine already has numpy, scipy, matplotlib, pyyaml, tqdm, packaging and
# typing-extensions (the device README's KINDS.md), so they are not downloaded.
set -euo pipefail
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
TORCH_ON_DEVICE=${TORCH_ON_DEVICE:-2.11}

exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qxF '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >>"$exclude"

rm -rf .whl
mkdir -p .whl/data
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
    manylinux2014_x86_64 manylinux1_x86_64; do
    platforms+=(--platform "$p")
done
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${platforms[@]}" -d .whl \
    metatensor-core==0.2.6 \
    metatensor-operations==0.5.0 \
    metatensor-torch==0.10.8 \
    metatomic-torch==0.1.19 \
    metatomic-ase==0.1.4 \
    featomic==0.6.7 \
    featomic-torch==0.7.6 \
    vesin==0.6.2 \
    wigners==0.4.1 \
    ctypes-dlpack==0.1.1 \
    hydra-core==1.3.8 \
    omegaconf==2.3.1 \
    ase==3.29.0
# hydra-core 1.3 and omegaconf 2.3 need antlr4-python3-runtime 4.9.*, published as a source
# archive only: build its (pure Python) wheel here
python3 -m pip wheel --quiet --no-deps -w .whl antlr4-python3-runtime==4.9.3

# the compiled extensions must hold a build for the machine's torch
for wheel in .whl/metatensor_torch-*.whl .whl/metatomic_torch-*.whl .whl/featomic_torch-*.whl; do
    listing=$(unzip -Z1 "$wheel")
    if ! grep -q "/torch-${TORCH_ON_DEVICE}/lib/" <<<"$listing"; then
        echo "$wheel holds no build for torch ${TORCH_ON_DEVICE}" >&2
        exit 1
    fi
    echo "$(basename "$wheel"): $(grep -c "/torch-${TORCH_ON_DEVICE}/lib/.*\.so" <<<"$listing") library for torch ${TORCH_ON_DEVICE}"
done

# the ethanol data the check trains on (the ../shared beside a checkout does not travel)
for candidate in ../shared/data/ethanol_reduced_100.xyz ../../shared/data/ethanol_reduced_100.xyz; do
    if [ -f "$candidate" ]; then
        cp "$candidate" .whl/data/
        break
    fi
done
[ -f .whl/data/ethanol_reduced_100.xyz ] || echo "no ethanol_reduced_100.xyz found: the check will train on EMT metals only" >&2

ls -l .whl .whl/data
du -sh .whl
