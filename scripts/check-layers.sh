#!/usr/bin/env bash
# Checks that the build enforces kbcl's layering (docs/architecture.md): in a scratch copy of
# the source tree, an upward #include in each layer must make that layer's library fail to
# compile, while the unmodified libraries build on their own.
#   scripts/check-layers.sh [SOURCE_DIR]      exit 0 = every check held
set -euo pipefail
src=$(cd "${1:-$(dirname "$0")/..}" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/kbcl-layers.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/src"
# the sources only (no build trees)
(cd "$src" && tar cf - --exclude='./build*' --exclude='./.git' .) | (cd "$work/src" && tar xf -)
cmake -S "$work/src" -B "$work/b" -DCMAKE_BUILD_TYPE=Debug -DKBCL_TESTS=OFF -DKBCL_LTO=OFF \
      -DKBCL_MPI=OFF >"$work/cfg.log" 2>&1 || { cat "$work/cfg.log"; exit 1; }
build() { cmake --build "$work/b" -j "${JOBS:-2}" --target "$1" >"$work/build.log" 2>&1; }

fail=0
for t in kb_sched kb_cl kb_host kb_ccl kb_tp; do
  if build "$t"; then echo "ok: $t builds on its own"; else
    echo "FAIL: unmodified $t does not build"; tail -20 "$work/build.log"; fail=1; fi
done

# inject FILE HEADER TARGET: FILE (relative) gets #include HEADER; TARGET must fail with it
inject() {
  local f="$work/src/$1" h=$2 t=$3
  cp "$f" "$f.orig"
  printf '#include "%s"\n' "$h" | cat - "$f.orig" >"$f"
  if build "$t"; then
    echo "FAIL: $t still builds with #include \"$h\" in $1"; fail=1
  elif grep -q "$h: No such file" "$work/build.log"; then
    echo "ok: #include \"$h\" in $1 breaks $t"
  else
    echo "FAIL: $t broke for another reason with $h in $1:"; tail -5 "$work/build.log"; fail=1
  fi
  mv "$f.orig" "$f"
}
inject ccl/kb_ccl.c        kb_tp.h         kb_ccl
inject host/kb_runtime.c   kb_ccl.h        kb_host
inject host/kb_tl.c        kb_dist.h       kb_host
inject cl/kb_replay.c      kb_runtime.h    kb_cl
inject cl/devd/kb_devd.c   kb_runtime.h    kb_cl
inject sched/kb_sim.c      kb_runtime.h    kb_sched
inject sched/kb_res.c      kb_oplog.h      kb_sched
inject ccl/kb_ipcq.c       kb_runtime_int.h kb_ccl
inject tp/kb_tp.c          kb_runtime_int.h kb_tp
inject tp/kb_tp.c          kb_bench.h      kb_tp

# no file above the runtime names a private runtime header
if grep -rn 'kb_runtime_int\.h' "$src"/ccl "$src"/tp "$src"/app >/dev/null; then
  echo "FAIL: a file in ccl/, tp/ or app/ includes the runtime's private header"
  grep -rn 'kb_runtime_int\.h' "$src"/ccl "$src"/tp "$src"/app; fail=1
else
  echo "ok: nothing in ccl/, tp/, app/ includes kb_runtime_int.h"
fi
[ $fail = 0 ] && echo "layers: all checks held"
exit $fail
