#!/usr/bin/env bash
# The aarch64 (GB200) flash-attn sm_100 cell, cross-compiled on the x86_64 GPU machine (no docker,
# no network) by the local runner, after its x86_64 cell, with the compile cache shared:
#
#   bash benchmarks/gpu/aarch64.sh start     # every stage in the background (setsid)
#   bash benchmarks/gpu/aarch64.sh status    # progress
#   bash benchmarks/gpu/aarch64.sh collect $OUT   # results.tgz: logs, manifests, the comparison
#
# Stages, each logged to $A64_DIR/<stage>.log:
#   toolchain  unpack the carried cross compiler (.debs, dpkg-deb -x: no root, no apt)
#   x86        the x86_64 cell, compile cache on (it fills the cache)
#   aarch64    the aarch64 cell, compile cache on (warm from the x86_64 cell)
#   compare    verify both wheels (--no-import: this machine has no qemu and the carried aarch64
#              torch is a link kit), cubins extracted with cuobjdump and compared byte for byte,
#              and the two cells' times as a ratio
# Carried (made by benchmarks/gpu/make_aarch64_kit.py on a builder with the network):
#   .cache/aarch64-kit/debs/*.deb                       46 MiB
#   .cache/aarch64-kit/wheelhouse/cp312-aarch64/*.whl   17 MiB (torch link kit + CUDA runtime)
#   .cache/factory/wheelhouse/sdists/flash_attn-2.8.3.post2.tar.gz, .whl/ (as for acceptance.sh)
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
A64_DIR=${A64_DIR:-/tmp/factory-aarch64}
CAP=${CAP:-96g}
CPUS=${CPUS:-$(nproc)}
MATRIX=benchmarks/gpu/matrix-aarch64.toml
CELL=flash-attn-2.8.3.post2-torch2.11.0-cu130-sm100-cp312
PY=${PY:-$(command -v python3)}
XGCC=$A64_DIR/xgcc
mkdir -p "$A64_DIR"

setup_env() {
  if [ -d .whl ] && [ ! -d "$A64_DIR/site" ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$A64_DIR/site" .whl/*.whl
  fi
  export PYTHONPATH="$ROOT:$A64_DIR/site"
  # the cross compiler, relocated: gcc finds its parts next to itself; binutils' private
  # libraries sit in the prefix's multiarch lib dir
  export PATH="$XGCC/usr/bin:$A64_DIR/site/bin:$PATH"
  export LD_LIBRARY_PATH="$XGCC/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export FACTORY_MEMORY_HISTORY="$A64_DIR/memory_history.json"
  export CI=true
}

factory() { "$PY" -m factory "$@"; }

stage() {  # stage NAME COMMAND...: time it, log it, record rc
  local name=$1; shift
  local t0; t0=$(date +%s)
  "$@" >"$A64_DIR/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc seconds=$(( $(date +%s) - t0 ))" | tee -a "$A64_DIR/stages.txt"
  return $rc
}

toolchain() {
  set -e
  rm -rf "$XGCC"; mkdir -p "$XGCC"
  for deb in .cache/aarch64-kit/debs/*.deb; do dpkg-deb -x "$deb" "$XGCC"; done
  # libc.so is a linker script naming /usr/aarch64-linux-gnu/lib/...: make it search instead
  grep -l "GNU ld script" "$XGCC"/usr/aarch64-linux-gnu/lib/*.so | xargs sed -i 's|/usr/aarch64-linux-gnu/lib/||g'
  printf '#include <vector>\nint f(){std::vector<int> v{1}; return v.size();}\n' >"$A64_DIR/t.cpp"
  aarch64-linux-gnu-g++ -fPIC -shared -O2 "$A64_DIR/t.cpp" -o "$A64_DIR/t.so"
  od -An -tx1 -j18 -N2 "$A64_DIR/t.so"   # b7 00: EM_AARCH64
  # the aarch64 torch link kit where the matrix's wheelhouse has the target's wheels
  mkdir -p .cache/factory/wheelhouse
  cp -r .cache/aarch64-kit/wheelhouse/cp312-aarch64 .cache/factory/wheelhouse/
}

build_args=(--matrix "$MATRIX" --runner local --python-env existing --interpreter "$PY"
            --memory "$CAP" --cpus "$CPUS" --cache --no-import-check --json)

compare() {
  set -e
  local x86 arm
  x86=$(ls "$A64_DIR"/dist/flash_attn-*_x86_64.whl); arm=$(ls "$A64_DIR"/dist/flash_attn-*_aarch64.whl)
  factory verify --no-import --matrix "$MATRIX" "$x86" "$arm"
  for w in "$x86" "$arm"; do
    local d="$A64_DIR/cubins-$(basename "$w" .whl)"; rm -rf "$d"; mkdir -p "$d"
    (cd "$d" && unzip -q -o "$w" 'flash_attn_2_cuda*.so' && cuobjdump -xelf all flash_attn_2_cuda*.so >/dev/null \
      && sha256sum *.cubin | sed 's/flash_attn_2_cuda[^.]*\.//' | sort -k2 >../"$(basename "$d")".sha256)
  done
  ls "$A64_DIR"/cubins-*.sha256
  if diff "$A64_DIR"/cubins-*x86_64.sha256 "$A64_DIR"/cubins-*aarch64.sha256; then
    echo "cubins identical: $(wc -l <"$A64_DIR"/cubins-*x86_64.sha256) files"
  else
    echo "cubins DIFFER"; false
  fi
  "$PY" - "$A64_DIR" <<'PY'
import json, pathlib, sys
d = pathlib.Path(sys.argv[1])
secs = {ln.split()[0]: int(ln.split("seconds=")[1]) for ln in (d / "stages.txt").read_text().splitlines() if "seconds=" in ln}
print(f"x86_64 {secs['x86']} s, aarch64 (warm) {secs['aarch64']} s: {100 * secs['aarch64'] / secs['x86']:.0f} %")
for m in sorted((d / "dist").glob("*.provenance.json")):
    doc = json.loads(m.read_text())
    print(m.name.split("-cp312")[0], doc["cell"].get("platform"),
          "cache", doc.get("cache"), "build_seconds", doc.get("build_seconds"))
PY
}

run_all() {
  setup_env
  { echo "date: $(date -u +%FT%TZ)"; nproc; free -g | head -2
    "$PY" -c 'import torch, sys; print(sys.version.split()[0], torch.__version__, torch.version.cuda)'
    nvcc --version | tail -1; ldd --version | head -1; } >"$A64_DIR/machine.txt" 2>&1
  stage toolchain toolchain || return
  stage x86 factory build "$CELL" "${build_args[@]}" --out "$A64_DIR/dist" || return
  stage aarch64 factory build "$CELL-aarch64" "${build_args[@]}" --out "$A64_DIR/dist" || return
  stage compare compare
  echo done >>"$A64_DIR/stages.txt"
}

status() {
  cat "$A64_DIR/stages.txt" 2>/dev/null
  for f in toolchain x86 aarch64 compare; do
    [ -f "$A64_DIR/$f.log" ] && { echo "== $f"; tail -n 4 "$A64_DIR/$f.log" | cut -c1-300; }
  done
}

collect() {
  local dest=$1 tmp; tmp=$(mktemp -d); mkdir -p "$dest"
  cp "$A64_DIR"/{machine.txt,stages.txt,memory_history.json,run.log,*.sha256} "$tmp"/ 2>/dev/null
  for f in toolchain x86 aarch64 compare; do
    [ -f "$A64_DIR/$f.log" ] && tail -c 300000 "$A64_DIR/$f.log" >"$tmp/$f.log"
  done
  cp "$A64_DIR"/dist/*.provenance.json "$tmp"/ 2>/dev/null
  ls -la "$A64_DIR"/dist >"$tmp/wheels.txt" 2>&1
  for w in "$CELL" "$CELL-aarch64"; do
    for f in ".cache/factory/work/$w/logs/"*.log; do [ -f "$f" ] && cp "$f" "$tmp/$w.$(basename "$f")"; done
  done
  tar -C "$tmp" -czf "$dest/results.tgz" . && rm -rf "$tmp"
}

case "${1:-status}" in
  start) : >"$A64_DIR/stages.txt"; setsid nohup bash "$0" run >"$A64_DIR/run.log" 2>&1 < /dev/null & echo started ;;
  run) run_all ;;
  status) status ;;
  collect) collect "${2:?destination}" ;;
  *) echo "usage: $0 start|status|collect DEST" >&2; exit 2 ;;
esac
