#!/usr/bin/env bash
# On a GPU machine without Rust, after `scripts/gpu-bundle.sh` here and a copy
# of the repository there (with .gpu/): the stages named on the command line
# (default: suite probe bench), each log named by what it measured, in $OUT
# (default ./gpu-out).
#
#   scripts/gpu-check.sh                       # suite, loader probe, full bench
#   scripts/gpu-check.sh suite12 shuffle python
#
# Stages:
#   suite     the whole suite with CUDA_REQUIRED=1 on the system runtime
#   suite12   the runtime, kernel and loader tests on CUDA 12's runtime (.gpu/libs)
#   suite12all  every test executable on CUDA 12's runtime
#   resident  the resident way of the shuffle bench from Rust and from Python, 4 GiB file
#   probe     the loader probe on the system runtime and the packed wheel runtimes
#   bench     the full bench (BENCH_ARGS adds arguments)
#   compare   auto, ring-cache, windows and budget-reuse by every packed bench
#             (.gpu/bin/bench-*: earlier commits' benches, packed by hand) and this one
#   shuffle   the shuffle bench (SHUFFLE_ARGS adds arguments), then a cold pool run
#   python    the Python package (.gpu/wheels): the training example alone and
#             under torchrun (two ranks, one GPU), the ranks' shares checked
#   pool      the pool and ring ways (32 GiB file), registered and resident (16 GiB), registered (8 GiB)
#   pieces    64 MiB pieces queued back to back (bench and Python), batches' first pass, 80 MiB rows
#   registered  the registered and resident ways (16 GiB file), the registered (8 GiB)
#   poolonly  the pool and the ring (32 GiB file), from Rust and Python, no torch rows
#   shapes    shapes of the gather kernel on registered host memory (an experiment; needs nvcc)
#   firstpass Python's batches, first pass beside the later ones
#   regload   registering in a second context while gathers or copies run (an experiment; needs nvcc)
#   cpugather threads gathering random records of a page-cached file, with and without prefetch
#   poolring  the pool twice (default blocks) and the ring way with 8, 12 and 16 threads (32 GiB
#             file), the pool from Python too
#   hostrows  Python's read_into from host arrays (rows.py: 32 rows of 80 MiB, 1024 of 2.5 MiB)
#   cold      a 4 GiB file cold and hot: auto, the disk's O_DIRECT rate and KvikIO in one run
#             (KvikIO's wheels, where carried in .gpu/kvikio, installed first)
#   ddp       the caller's queued work and training: wirespeed.Loader from Python with 50 ms of
#             matmuls per batch queued (next()'s host time, wall against loader and work alone;
#             every way, 8 GiB file), the training loop's bound (bench/python_train.py: resident,
#             registered, pool), and the two-rank torchrun test on the real GPU
#   pyloop    Python's loop of read_into over 64 MiB pieces: reading ahead, not, and registered
#   readahead 64 MiB pieces one at a time from Rust, without and with reading ahead
#   first     first use: auto beside a new streamer and mapping per pass (one-shot) and a
#             fresh mapping per pass (new-map), 64 MiB pieces queued back to back (spans),
#             rows through the ring beside PyTorch's, and Python's batches and read_into
set -u
out=${OUT:-gpu-out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 CUDA_REQUIRED=1
[ -d .gpu/libs ] && export CUDA_WHEEL_LIBS="$PWD/.gpu/libs"
stages=("$@")
[ ${#stages[@]} = 0 ] && stages=(suite probe bench)
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv,noheader

summary() { # the pass/fail lines of a suite log
  grep -E "^=== every|^=== FAILED|^failures:|FAILED" "$1" | head -20
  grep -E "^test result" "$1" | awk '{p+=$4; f+=$6; i+=$8} END {print "tests passed", p, "failed", f, "ignored", i}'
}

file16g() { # a 16 GiB file of random bytes, written once; prints its path
  local f=/tmp/file16g.bin
  [ -f $f ] || python3 -c "
import numpy as np
b = np.random.default_rng(1).integers(0, 256, 64 << 20, dtype=np.uint8)
with open('$f', 'wb') as f:
    for k in range(256):
        f.write(b.tobytes()); b += 1
"
  echo $f
}

registered_rows() { # the registered and resident ways on a 16 GiB file, the registered on 8 GiB
  timeout 150 .gpu/run.sh shuffle --size 16G --ways registered,resident --no-torch \
    >"$out/shuffle-16g-file-registered-resident.log" 2>&1
  echo "shuffle 16G rc=$?"; sed -n '/^| row/,$p' "$out/shuffle-16g-file-registered-resident.log"
  timeout 60 .gpu/run.sh shuffle --size 8G --ways registered --no-torch --no-python \
    >"$out/shuffle-8g-file-registered.log" 2>&1
  echo "shuffle 8G rc=$?"; sed -n '/^| row/,$p' "$out/shuffle-8g-file-registered.log"
}

python_env() { # the packed wheel, installed once
  if [ ! -d /tmp/wirespeed-site ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/wirespeed-site .gpu/wheels/*.whl || return 1
  fi
  export PYTHONPATH=/tmp/wirespeed-site${PYTHONPATH:+:$PYTHONPATH}
}

for stage in "${stages[@]}"; do
  echo "== $stage ($(date +%T))"
  case $stage in
  suite)
    timeout 300 .gpu/run.sh >"$out/suite-cuda13.log" 2>&1
    echo "suite rc=$?"
    summary "$out/suite-cuda13.log"
    ;;
  suite12)
    lib=$PWD/.gpu/libs/libcudart.so.12
    for t in safe_kernel shuffle_loader loader safe_api safe_async pinned_stream; do
      echo "=== $t"
      CUDA_SYS_RUNTIME=$lib timeout 120 ".gpu/tests/$t" --test-threads=1 2>&1
    done >"$out/suite-cuda12-kernel-loader-api.log"
    summary "$out/suite-cuda12-kernel-loader-api.log"
    ;;
  suite12all)
    lib=$PWD/.gpu/libs/libcudart.so.12
    failed=()
    for t in .gpu/tests/*; do
      echo "=== $(basename "$t")"
      CUDA_SYS_RUNTIME=$lib timeout 120 "$t" --test-threads=1 2>&1 || failed+=("$(basename "$t")")
    done >"$out/suite-cuda12.log"
    if [ ${#failed[@]} = 0 ]; then echo "=== every test executable passed" >>"$out/suite-cuda12.log"; else echo "=== FAILED: ${failed[*]}" >>"$out/suite-cuda12.log"; fi
    summary "$out/suite-cuda12.log"
    ;;
  resident)
    # The resident way from Rust and from Python on one file, in one run.
    python_env || echo "no wheel: the Python row is skipped"
    timeout 120 .gpu/run.sh shuffle --size 4G --ways resident --no-torch \
      >"$out/shuffle-4g-file-resident-rust-and-python.log" 2>&1
    echo "resident rc=$?"
    sed -n '/^| row/,$p' "$out/shuffle-4g-file-resident-rust-and-python.log"
    ;;
  probe)
    { .gpu/run.sh probe; ls .gpu/libs/libcudart.so.* >/dev/null 2>&1 && .gpu/run.sh probe .gpu/libs/libcudart.so.*; } >"$out/loader-probe.log" 2>&1
    cut -c1-160 "$out/loader-probe.log"
    ;;
  bench)
    # shellcheck disable=SC2086
    timeout 420 .gpu/run.sh bench ${BENCH_ARGS:-} --out "$out" >"$out/bench.log" 2>&1
    echo "bench rc=$?"
    sed -n '/^strategy\|^run /,$p' "$out/bench.log" | head -80
    ;;
  compare)
    rows=auto,ring-cache,windows,budget-reuse
    for b in .gpu/bin/bench-* .gpu/bin/bench; do
      name=$(basename "$b")
      timeout 150 "$b" --only $rows --no-cold --size 4G --budget 512M >"$out/compare-$name.log" 2>&1
      echo "$name rc=$?"
      grep -E "^(auto|ring-cache|windows|budget-reuse|line rate)|GB/s" "$out/compare-$name.log" | head -12
    done
    ;;
  shuffle)
    python_env || echo "no wheel: the Python rows are skipped"
    # shellcheck disable=SC2086
    timeout 420 .gpu/run.sh shuffle --json "$out/shuffle.json" ${SHUFFLE_ARGS:-} >"$out/shuffle-32g-file-4g-pin-8g-pool.log" 2>&1
    echo "shuffle rc=$?"
    sed -n '/^| row/,$p' "$out/shuffle-32g-file-4g-pin-8g-pool.log"
    timeout 120 .gpu/run.sh shuffle --size 8G --ways pool --cold --reps 1 --no-torch --no-python \
      >"$out/shuffle-8g-file-cold-pool.log" 2>&1
    echo "cold rc=$?"
    sed -n '/^| row/,$p' "$out/shuffle-8g-file-cold-pool.log"
    ;;
  python)
    python_env || { echo "no wheel"; continue; }
    timeout 200 python3 python/examples/train_memmap.py --records 2000000 --steps 300 --folder /tmp \
      >"$out/python-train-memmap-loader-vs-dataloader.log" 2>&1
    echo "train rc=$?"; tail -5 "$out/python-train-memmap-loader-vs-dataloader.log"
    timeout 200 python3 -m torch.distributed.run --nproc_per_node=2 python/examples/train_memmap.py \
      --records 2000000 --steps 200 --folder /tmp --no-dataloader >"$out/python-train-memmap-torchrun-2-ranks.log" 2>&1
    echo "torchrun rc=$?"; tail -4 "$out/python-train-memmap-torchrun-2-ranks.log"
    WIRESPEED_DDP_REAL=1 timeout 200 python3 -m pytest -q --noconftest -p no:cacheprovider \
      python/tests/test_loader_ddp.py >"$out/python-torchrun-ranks-disjoint.log" 2>&1
    echo "ddp test rc=$?"; tail -3 "$out/python-torchrun-ranks-disjoint.log"
    ;;
  first)
    timeout 240 .gpu/run.sh bench --size 16G --budget 4G --only auto,one-shot,new-map --strategy auto/spans=64M \
      --no-cold >"$out/bench-16g-file-4g-budget-one-shot-new-map-64m-spans.log" 2>&1
    echo "first-use bench rc=$?"
    grep -E "GB/s|line rate|PASS|MISS" "$out/bench-16g-file-4g-budget-one-shot-new-map-64m-spans.log" | head -20
    python_env || { echo "no wheel"; continue; }
    timeout 150 .gpu/run.sh bench --size 1G --only ring-cache --pytorch-rows --no-cold >"$out/bench-rows-ring-reserve.log" 2>&1
    echo "rows rc=$?"; grep -iE "rows|anchor|PASS|MISS" "$out/bench-rows-ring-reserve.log" | head -12
    timeout 200 python3 python/examples/file_batches.py /tmp/file-batches-4g.bin --passes 3 \
      >"$out/python-file-batches-first-pass.log" 2>&1
    echo "file_batches rc=$?"; tail -8 "$out/python-file-batches-first-pass.log"
    timeout 120 python3 python/examples/rows.py >"$out/python-rows-read-into-from-host.log" 2>&1
    echo "rows.py rc=$?"; tail -8 "$out/python-rows-read-into-from-host.log"
    ;;
  pool)
    # The pool, the ring (8 and 16 threads) on a 32 GiB file, beside DataLoader's rows and the
    # Python Loader; then the registered and resident ways on a 16 GiB file (the registered
    # goal's size) and the registered way on an 8 GiB file.
    python_env || echo "no wheel: the Python rows are skipped"
    timeout 300 .gpu/run.sh shuffle --ways pool,ring,ring:16 --json "$out/shuffle-32g.json" \
      >"$out/shuffle-32g-file-pool-ring.log" 2>&1
    echo "shuffle 32G rc=$?"; sed -n '/^| row/,$p' "$out/shuffle-32g-file-pool-ring.log"
    grep "whole block" "$out/shuffle-32g-file-pool-ring.log"
    registered_rows
    ;;
  registered)
    python_env || echo "no wheel: the Python rows are skipped"
    registered_rows
    ;;
  pieces)
    # 64 MiB pieces queued back to back over one 16 GiB file: the bench's spans rows beside
    # auto and one-shot, then read_into from Python; Python's batches first pass; rows.
    f=$(file16g)
    timeout 200 .gpu/run.sh bench $f --budget 4G --only auto,one-shot --strategy auto/spans=64M \
      --strategy auto/spans=1G --no-cold >"$out/bench-16g-file-4g-budget-64m-pieces-queued.log" 2>&1
    echo "pieces bench rc=$?"
    grep -E "GB/s|line rate|PASS|MISS" "$out/bench-16g-file-4g-budget-64m-pieces-queued.log" | grep -v "rep " | head -20
    python_env || { echo "no wheel"; continue; }
    timeout 150 python3 bench/python_pieces.py $f --passes 5 >"$out/python-16g-file-64m-pieces-read-into.log" 2>&1
    echo "python pieces rc=$?"; grep -vE " pass [0-9]" "$out/python-16g-file-64m-pieces-read-into.log" | tail -6
    timeout 150 python3 python/examples/file_batches.py /tmp/file-batches-4g.bin --passes 3 \
      >"$out/python-file-batches-first-pass.log" 2>&1
    echo "file_batches rc=$?"; tail -6 "$out/python-file-batches-first-pass.log"
    timeout 100 python3 python/examples/rows.py --rows 32 --row-mib 80 --threads "${ROW_THREADS:-}" >"$out/python-rows-80m-read-into-from-host.log" 2>&1
    echo "rows.py rc=$?"; tail -7 "$out/python-rows-80m-read-into-from-host.log"
    ;;
  poolonly)
    # The pool and the ring (8 threads) on a 32 GiB file (no torch rows), from Rust and from Python.
    python_env || echo "no wheel: the Python row is skipped"
    timeout 240 .gpu/run.sh shuffle --ways pool,ring --no-torch >"$out/shuffle-32g-file-pool-ring.log" 2>&1
    echo "pool rc=$?"; sed -n '/^| row/,$p' "$out/shuffle-32g-file-pool-ring.log"
    grep -E "whole block|ran chained|added up" "$out/shuffle-32g-file-pool-ring.log"
    # The same streaming without the pool: one range, and 64 MiB pieces in file order, of a
    # 32 GiB file within the same 4 GiB budget, with their breakdowns.
    timeout 200 .gpu/run.sh bench --size 32G --budget 4G --only auto --strategy auto/spans=64M --reps 3 \
      --no-cold >"$out/bench-32g-file-4g-budget-auto-64m-pieces.log" 2>&1
    echo "32G pieces bench rc=$?"
    grep -E "GB/s|line rate|in place" "$out/bench-32g-file-4g-budget-auto-64m-pieces.log" | head -24
    ;;
  shapes)
    # Shapes of the gather kernel reading registered host memory (bench/experiments/gather_shapes.cu).
    # SHAPES lists the library kernel's team sizes and rounds to try (WARPS:ROUNDS);
    # the first is the checked-in kernel's.
    # SHAPES_GIB sets the GiB of registered host memory (default 8).
    gib=${SHAPES_GIB:-8}
    for wr in ${SHAPES:-4:2 1:8 4:8 2:4 4:4}; do
      log="$out/gather-kernel-shapes-registered-${gib}g-warps${wr%:*}-rounds${wr#*:}.log"
      nvcc -O3 -arch=sm_90 -DWARPS=${wr%:*} -DROUNDS=${wr#*:} -o /tmp/gather_shapes bench/experiments/gather_shapes.cu &&
        timeout 120 /tmp/gather_shapes $gib >"$log" 2>&1
      echo "shapes $wr rc=$?"; cat "$log"
    done
    ;;
  firstpass)
    # Python's batches: the first pass beside the later ones (python/examples/file_batches.py).
    python_env || { echo "no wheel"; continue; }
    timeout 150 python3 python/examples/file_batches.py /tmp/file-batches-4g.bin --passes 3 \
      >"$out/python-file-batches-first-pass.log" 2>&1
    echo "file_batches rc=$?"; tail -6 "$out/python-file-batches-first-pass.log"
    ;;
  regload)
    # Registering in a second context while the primary one idles, gathers or copies
    # (bench/experiments/register_under_kernels.cu).
    nvcc -O3 -arch=sm_90 -o /tmp/register_under_kernels bench/experiments/register_under_kernels.cu -lcuda -lpthread &&
      timeout 60 /tmp/register_under_kernels >"$out/register-second-context-under-gathers.log" 2>&1
    echo "regload rc=$?"; cat "$out/register-second-context-under-gathers.log"
    ;;
  cpugather)
    # CPU threads gathering random 2,883-byte records of a page-cached file, with and without
    # prefetching (bench/examples/cpu_gather.rs).
    timeout 120 .gpu/bin/cpu_gather "$(file16g)" >"$out/cpu-gather-records-prefetch.log" 2>&1
    echo "cpu_gather rc=$?"; cat "$out/cpu-gather-records-prefetch.log"
    ;;
  poolring)
    python_env || echo "no wheel: the Python rows are skipped"
    timeout 300 .gpu/run.sh shuffle --ways ${POOLRING_WAYS:-pool,ring,ring:12,ring:16,pool} --no-torch --json "$out/shuffle-32g.json" \
      >"$out/shuffle-32g-file-pool-twice-ring-threads.log" 2>&1
    echo "pool/ring rc=$?"; sed -n '/^| row/,$p' "$out/shuffle-32g-file-pool-twice-ring-threads.log"
    grep -E "whole block|ran chained|added up" "$out/shuffle-32g-file-pool-twice-ring-threads.log"
    ;;
  hostrows)
    python_env || { echo "no wheel"; continue; }
    timeout 100 python3 python/examples/rows.py --rows 32 --row-mib 80 --threads "${ROW_THREADS:-}" >"$out/python-rows-80m-read-into-from-host-prepared.log" 2>&1
    echo "rows.py 80 MiB rc=$?"; tail -10 "$out/python-rows-80m-read-into-from-host-prepared.log"
    timeout 100 python3 python/examples/rows.py --threads "${ROW_THREADS:-}" >"$out/python-rows-2m5-read-into-from-host-prepared.log" 2>&1
    echo "rows.py 2.5 MiB rc=$?"; tail -10 "$out/python-rows-2m5-read-into-from-host-prepared.log"
    ;;
  cold)
    if ls .gpu/kvikio/*.whl >/dev/null 2>&1 && [ ! -d /tmp/kvikio-site ]; then
      python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/kvikio-site .gpu/kvikio/*.whl
    fi
    if [ -d /tmp/kvikio-site ]; then
      # libkvikio finds libcufile through the dynamic loader when its wheel is not in site-packages.
      export PYTHONPATH=/tmp/kvikio-site${PYTHONPATH:+:$PYTHONPATH}
      export LD_LIBRARY_PATH=/tmp/kvikio-site/nvidia/cufile/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    fi
    timeout 300 .gpu/run.sh bench --size 4G --budget 512M --only auto,kvikio,disk-direct,cold-auto --reps 3 \
      >"$out/bench-4g-file-cold-hot-auto-kvikio.log" 2>&1
    echo "cold bench rc=$?"
    grep -E "GB/s|line rate|PASS|MISS|KvikIO" "$out/bench-4g-file-cold-hot-auto-kvikio.log" | grep -v "rep " | head -24
    ;;
  lonepieces)
    # 64 MiB pieces of a 16 GiB file within 4 GiB, each ordered before a stream (as a loop of
    # Python read_into runs them) or waited for before the next starts, by strategy: auto (the
    # ring for a piece read once), a ring of another shape; then auto's pieces queued at once;
    # then Python's read_into of 64 MiB pieces, one call each.
    f=$(file16g)
    # LONE_STRATEGIES replaces the list (each KIND:ARGS/spans=...).
    lone=(${LONE_STRATEGIES:-auto/spans=64M,then auto/spans=64M,wait ring:32,4M,8/spans=64M,then auto/spans=64M})
    # shellcheck disable=SC2046
    timeout 300 .gpu/run.sh bench $f --budget 4G --only auto --no-cold --reps 3 \
      $(printf -- '--strategy %s ' "${lone[@]}") \
      >"$out/bench-16g-file-4g-budget-64m-pieces-one-at-a-time-by-strategy.log" 2>&1
    echo "lone pieces rc=$?"
    grep -E "GB/s|line rate|in place" "$out/bench-16g-file-4g-budget-64m-pieces-one-at-a-time-by-strategy.log" | grep -v "rep " | head -30
    python_env || { echo "no wheel"; continue; }
    timeout 150 python3 bench/python_pieces.py $f --passes 5 >"$out/python-16g-file-64m-pieces-read-into-lone-ring.log" 2>&1
    echo "python pieces rc=$?"; grep -vE " pass [0-9]" "$out/python-16g-file-64m-pieces-read-into-lone-ring.log" | tail -8
    ;;
  pyloop)
    # Python's loop of read_into over 64 MiB pieces of a 16 GiB file within 4 GiB: through the
    # ring (auto) reading ahead, the same without reading ahead, and each piece registered whole
    # (what auto did before), alternating. PYLOOP_WAYS replaces the list (STRATEGY:on|off).
    python_env || { echo "no wheel"; continue; }
    f=$(file16g)
    for w in ${PYLOOP_WAYS:-auto:on auto:off whole-file:off auto:on auto:off}; do
      timeout 100 python3 bench/python_pieces.py $f --passes 3 --piece-strategy "${w%%:*}" --read-ahead "${w##*:}"
      echo "python pieces $w rc=$?"
    done >"$out/python-16g-file-64m-pieces-read-into-read-ahead-ring-registered.log" 2>&1
    grep -E "median|line rate" "$out/python-16g-file-64m-pieces-read-into-read-ahead-ring-registered.log"
    ;;
  readahead)
    # 64 MiB pieces of a 16 GiB file within 4 GiB from Rust, one at a time (each ordered before
    # a stream before the next starts, as a loop of Python read_into runs them, or waited for),
    # without and with reading ahead, beside the same pieces queued at once. READAHEAD_STRATEGIES
    # replaces the list.
    f=$(file16g)
    ra=(${READAHEAD_STRATEGIES:-auto/spans=64M,then auto/spans=64M,then/ahead=5ms auto/spans=64M,wait/ahead=5ms auto/spans=64M auto/spans=64M,then/ahead=5ms auto/spans=64M,then})
    # shellcheck disable=SC2046
    timeout 300 .gpu/run.sh bench $f --budget 4G --only auto --no-cold --reps 3 \
      $(printf -- '--strategy %s ' "${ra[@]}") \
      >"$out/bench-16g-file-4g-budget-64m-pieces-one-at-a-time-read-ahead.log" 2>&1
    echo "read-ahead rc=$?"
    grep -E "GB/s|line rate|read ahead" "$out/bench-16g-file-4g-budget-64m-pieces-one-at-a-time-read-ahead.log" | grep -v "rep " | head -40
    ;;
  ddp)
    # BUSY_MS sets the work per batch (default 50: with the host 6 batches ahead, 250 ms queued).
    python_env || { echo "no wheel"; continue; }
    timeout 480 .gpu/run.sh shuffle --size 8G --ways resident,registered,pool,ring --no-torch \
      --busy "${BUSY_MS:-50}" --busy-batches 300 --json "$out/shuffle-8g-busy.json" \
      >"$out/shuffle-8g-file-python-loader-busy-${BUSY_MS:-50}ms-work.log" 2>&1
    echo "busy rc=$?"; sed -n '/^| row/,$p' "$out/shuffle-8g-file-python-loader-busy-${BUSY_MS:-50}ms-work.log"
    timeout 300 python3 bench/python_train.py --records 2000000 --folder /tmp --ways resident,registered,pool \
      >"$out/python-train-loop-bound-resident-registered-pool.log" 2>&1
    echo "train bound rc=$?"; grep -E "^train-|steps/s|skipped" "$out/python-train-loop-bound-resident-registered-pool.log"
    WIRESPEED_DDP_REAL=1 timeout 200 python3 -m pytest -q --noconftest -p no:cacheprovider \
      python/tests/test_loader_ddp.py >"$out/python-torchrun-ranks-disjoint-ddp.log" 2>&1
    echo "ddp test rc=$?"; tail -3 "$out/python-torchrun-ranks-disjoint-ddp.log"
    ;;
  *) echo "unknown stage $stage" ;;
  esac
done
