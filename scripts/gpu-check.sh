#!/usr/bin/env bash
# One call on the GPU machine (no Rust there): the whole suite with
# CUDA_REQUIRED=1, the loader probe on the system runtime and on the PyPI wheel
# runtimes carried in .gpu/libs, the benchmark (default run, then --seed with
# the PyTorch comparison). Logs go to $OUT (or ./gpu-out).
#
#   ../shared/gpu/bundle.sh && scripts/gpu-pack-libs.sh   # here
#   scripts/gpu-check.sh                                   # there, from the repository root
set -u
out=${OUT:-gpu-out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 CUDA_WHEEL_LIBS="$PWD/.gpu/libs"
nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv,noheader
echo "== suite"
timeout 150 .gpu/run.sh >"$out/suite.log" 2>&1
echo "suite rc=$?"
grep -E "^=== |^test result|FAILED|^failures:" "$out/suite.log"
echo "== probe"
{ .gpu/run.sh probe; .gpu/run.sh probe .gpu/libs/libcudart.so.13 .gpu/libs/libcudart.so.12; } >"$out/probe.log" 2>&1
cut -c1-160 "$out/probe.log"
echo "== bench --seed"
timeout 90 .gpu/run.sh bench --seed >"$out/seed.log" 2>&1
echo "seed rc=$?"
tail -32 "$out/seed.log"
echo "== bench"
timeout 170 .gpu/run.sh bench --out "$out" >"$out/bench.log" 2>&1
echo "bench rc=$?"
sed -n '/^strategy/,$p' "$out/bench.log" | head -70
