#!/usr/bin/env bash
# Adds the CUDA 12.9 and 13.0 runtimes from the PyPI wheels (downloaded by
# .ci/run into .cuda/) to .gpu/libs, for scripts/gpu-check.sh.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
mkdir -p .gpu/libs
cp -f .cuda/site/nvidia/cu13/lib/libcudart.so.13 .cuda/site/nvidia/cuda_runtime/lib/libcudart.so.12 .gpu/libs/
cp -f scripts/gpu-check.sh .gpu/check.sh
du -sh .gpu
