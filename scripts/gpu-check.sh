#!/usr/bin/env bash
# On a GPU machine without Rust, after `scripts/gpu-bundle.sh` here and a copy
# of the repository there (with .gpu/): the whole suite with CUDA_REQUIRED=1,
# the loader probe on the system runtime and on the wheel runtimes packed in
# .gpu/libs, and the benchmark. Logs and results go to $OUT (default ./gpu-out).
#
#   scripts/gpu-check.sh                # suite, probe, full bench
#   BENCH_ARGS="--quick" scripts/gpu-check.sh
set -u
out=${OUT:-gpu-out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv,noheader
echo "== suite"
timeout 300 .gpu/run.sh >"$out/suite.log" 2>&1
echo "suite rc=$?"
grep -E "^=== every|^=== FAILED|FAILED|^failures:" "$out/suite.log"
grep -E "^test result" "$out/suite.log" | awk '{p+=$4; f+=$6; i+=$8} END {print "tests passed", p, "failed", f, "ignored", i}'
echo "== loader probe: the system runtime, then the wheel runtimes"
{ .gpu/run.sh probe; ls .gpu/libs/libcudart.so.* >/dev/null 2>&1 && .gpu/run.sh probe .gpu/libs/libcudart.so.*; } >"$out/probe.log" 2>&1
cut -c1-160 "$out/probe.log"
echo "== bench"
# shellcheck disable=SC2086
timeout 420 .gpu/run.sh bench ${BENCH_ARGS:-} --out "$out" >"$out/bench.log" 2>&1
echo "bench rc=$?"
sed -n '/^strategy\|^run /,$p' "$out/bench.log" | head -80
