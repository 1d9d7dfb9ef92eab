#!/usr/bin/env bash
# Packs the workspace's test executables, binaries and examples (release build),
# and the binary of downstream/ (a crate outside the workspace that uses the
# library as a runtime would), into .gpu/ at the repository root, for a GPU
# machine without a Rust toolchain.
# Copy the repository (or just .gpu/ and scripts/) there and run from its root:
#
#   scripts/gpu-bundle.sh                 # here: every test, bin and example
#   scripts/gpu-bundle.sh -p wirespeed-bench   # extra arguments go to cargo
#   .gpu/run.sh                           # there: every test executable and downstream/, GPU required
#   .gpu/run.sh bench --quick             # there: one packed binary by name
#
# Tests run with CUDA_REQUIRED=1, so a test that would skip for want of a GPU
# fails instead. When .ci/run has downloaded the CUDA runtime wheels (.cuda/),
# their libcudart.so.12 and .so.13 are packed into .gpu/libs too, so the loader
# can be checked against both majors there (CUDA_WHEEL_LIBS points at them).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
exclude=$(git rev-parse --git-path info/exclude) # (in a worktree too)
mkdir -p "$(dirname "$exclude")"
grep -qx '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >>"$exclude"
rm -rf .gpu
mkdir -p .gpu/tests .gpu/bin .gpu/libs

# cargo prints one JSON message per artifact; keep the executables.
executables() {
  python3 -c '
import json, sys
for line in sys.stdin:
    if not line.startswith("{"):
        continue
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        print("tests" if m["profile"]["test"] else "bin", m["target"]["name"], m["executable"])
'
}
{
  cargo test --workspace --release --no-run --message-format=json-render-diagnostics "$@"
  cargo build --workspace --release --bins --examples --message-format=json-render-diagnostics "$@"
  # Its own lock file and target folder: it is not a member of the workspace.
  cargo build --release --manifest-path downstream/Cargo.toml --target-dir target/downstream-crate \
    --message-format=json-render-diagnostics
} | executables | sort -u | while read -r kind name exe; do
  dest=".gpu/$kind/$name"
  # Two test targets of one name (a crate's unit tests and its doc tests, say):
  # keep both, the second under cargo's hashed file name.
  [ -e "$dest" ] && dest=".gpu/$kind/$(basename "$exe")"
  cp "$exe" "$dest"
  strip --strip-debug "$dest" 2>/dev/null || true
done

for lib in .cuda/site/nvidia/cu13/lib/libcudart.so.13 .cuda/site/nvidia/cuda_runtime/lib/libcudart.so.12; do
  [ -f "$lib" ] && cp -f "$lib" .gpu/libs/
done

cat >.gpu/run.sh <<'RUN'
#!/usr/bin/env bash
# On the GPU machine, from the repository root. No arguments: every packed test
# executable, one test at a time, GPU required. `NAME ARGS...`: one packed binary.
cd "$(dirname "$0")/.."
export CUDA_REQUIRED=1 RUST_BACKTRACE=1
[ -d .gpu/libs ] && export CUDA_WHEEL_LIBS="$PWD/.gpu/libs"
if [ $# -gt 0 ]; then
  name=$1
  shift
  exec ".gpu/bin/$name" "$@"
fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv,noheader
failed=()
for t in .gpu/tests/*; do
  echo "=== $(basename "$t")"
  "$t" --test-threads=1 || failed+=("$(basename "$t")")
done
if [ -x .gpu/bin/wirespeed-downstream ]; then
  echo "=== wirespeed-downstream (downstream/: the library used as a runtime would, real runtime)"
  .gpu/bin/wirespeed-downstream || failed+=(wirespeed-downstream)
fi
if [ ${#failed[@]} = 0 ]; then echo "=== every test executable passed"; else echo "=== FAILED: ${failed[*]}"; exit 1; fi
RUN
chmod +x .gpu/run.sh
echo "packed into .gpu/ ($(du -sh .gpu | cut -f1)):"
for d in tests bin libs; do echo "  $d: $(ls .gpu/$d | tr '\n' ' ')"; done
mib=$(du -sm .gpu | cut -f1)
[ "$mib" -lt 60 ] || echo "warning: .gpu is $mib MiB; narrow it with -p CRATE if your transfer has a size limit"
