#!/usr/bin/env bash
# A shorter GPU check after changes: the suite, the goals' runs and the
# safe-layer overhead (then three more overhead runs), and the soak
# (SOAK_GB per strategy, default 100). Logs to $OUT.
set -u
out=${OUT:-gpu-out}
mkdir -p "$out"
export CUDA_WHEEL_LIBS="$PWD/.gpu/libs"
echo "== suite"
timeout 120 .gpu/run.sh >"$out/suite.log" 2>&1
echo "suite rc=$?"
grep -E "^=== all|FAILED|^failures:" "$out/suite.log"
grep -E "^test result" "$out/suite.log" | awk '{p+=$4; f+=$6; i+=$8} END {print "tests passed", p, "failed", f, "ignored", i}'
echo "== bench (goal runs + overhead)"
timeout 120 .gpu/run.sh bench --overhead --only budget-reuse,auto,windows,hybrid --out "$out" >"$out/bench.log" 2>&1
echo "bench rc=$?"
sed -n '/^strategy/,/^(x line/p;/^Safe-layer/,$p' "$out/bench.log" | grep -v "^H200 anchors\|^(from shared"
echo "== overhead, three more runs"
for i in 1 2 3; do
    timeout 60 .gpu/run.sh bench --overhead >"$out/overhead-$i.log" 2>&1
    grep -E "^  (cuda-safe|raw|overhead)" "$out/overhead-$i.log"
done
echo "== soak"
timeout 180 .gpu/run.sh soak --gb "${SOAK_GB:-100}" >"$out/soak.log" 2>&1
echo "soak rc=$?"
cat "$out/soak.log"
