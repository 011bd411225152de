#!/usr/bin/env bash
# Checks kbcl's layering (docs/architecture.md) in a scratch copy of the source tree:
#  1. folder = layer: each top-level source folder is one layer (LAYERS below, bottom to top,
#     the order the libraries link), every .c under it is compiled into that layer's library
#     and nothing else is, and its header folders are on that library's include path and on
#     no lower one's (so a header belongs to the layer of its folder);
#  2. includes name a file, never a path: an #include "../host/kb_tl.h" (or "devd/x.h",
#     "../../ccl/x.h") fails, since a quoted include found next to the including file would
#     get past the include paths that enforce the layers; and no file includes a header of a
#     layer above its own (by the header's folder);
#  3. the build enforces it: an upward #include in each layer makes that layer's library fail
#     to compile, while the unmodified libraries build on their own.
# Each check is also shown to catch what it is for: the script injects an upward include, a
# relative include across folders, a source compiled into another layer's library and a
# source folder that is no layer, and each must make its check fail.
#   scripts/check-layers.sh [SOURCE_DIR]      exit 0 = every check held
set -euo pipefail
src=$(cd "${1:-$(dirname "$0")/..}" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/kbcl-layers.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/src"
# the sources only (no build trees)
(cd "$src" && tar cf - --exclude='./build*' --exclude='./.git' .) | (cd "$work/src" && tar xf -)
s="$work/src"
cfg() { # cfg BUILD_DIR: configures the scratch copy into BUILD_DIR
  cmake -S "$s" -B "$1" -DCMAKE_BUILD_TYPE=Debug -DKBCL_TESTS=OFF -DKBCL_LTO=OFF \
        -DKBCL_MPI=OFF >"$work/cfg.log" 2>&1 || { cat "$work/cfg.log"; exit 1; }
}
cfg "$work/b"
build() { cmake --build "$work/b" -j "${JOBS:-2}" --target "$1" >"$work/build.log" 2>&1; }

# The layers, bottom to top: folder:library. The kbcl executable (app/cli/main.c) is app's.
LAYERS="sched:kb_sched cl:kb_cl host:kb_host ccl:kb_ccl tp:kb_tp app:kb_app"
# Top-level folders that hold C but are no layer: they use the libraries, they are not in one.
NONLAYER="tests docs"
rank_of_folder() { # the layer index of a path relative to the tree (top folder), or -1
  local top=${1%%/*} i=0 l
  for l in $LAYERS; do [ "${l%%:*}" = "$top" ] && { echo $i; return; }; i=$((i + 1)); done
  echo -1
}

fail=0
# ---- 1. folder = layer, from the scratch build's compile commands (DIR: the tree, B: its build)
check_folders() {
  local dir=$1 b=$2 bad=0 f l lib tgt rel idirs d i j lf
  # every top-level folder holding C sources or headers is a layer or a known non-layer
  for f in $(cd "$dir" && find . -path './build*' -prune -o -path ./.git -prune -o \
             \( -name '*.c' -o -name '*.h' -o -name '*.S' -o -name '*.cl' \) -print |
             sed 's|^\./||' | cut -d/ -f1 | sort -u); do
    case " $NONLAYER " in *" $f "*) continue ;; esac
    [ "$(rank_of_folder "$f/x")" -ge 0 ] ||
      { echo "FAIL: folder $f/ holds sources but is no layer (layers: $LAYERS)"; bad=1; }
  done
  # compile command -> (target, source): each layer source in its own layer's library only
  sed -n 's|.*"command": ".* -o CMakeFiles/\([^ /]*\)\.dir/[^ ]* -c \([^ "]*\)".*|\1 \2|p' \
    "$b/compile_commands.json" >"$work/units"
  while read -r tgt f; do
    rel=${f#"$dir"/}
    [ "$rel" = "$f" ] && continue                    # generated, outside the tree
    i=$(rank_of_folder "$rel")
    [ "$i" -lt 0 ] && continue                       # tests, examples
    lib=$(echo $LAYERS | tr ' ' '\n' | sed -n "$((i + 1))p" | cut -d: -f2)
    if [ "$tgt" != "$lib" ] && ! { [ "$tgt" = kbcl ] && [ "$rel" = app/cli/main.c ]; }; then
      echo "FAIL: $rel is in folder ${rel%%/*}/ (layer $lib) but compiled into $tgt"; bad=1
    fi
  done <"$work/units"
  for l in $LAYERS; do
    lf=${l%%:*}; lib=${l#*:}
    # every .c of the folder is one of the library's sources
    for f in $(cd "$dir" && find "$lf" -name '*.c' | sort); do
      grep -q " $dir/$f\$" "$work/units" ||
        { [ "$f" = app/cli/main.c ] && grep -q "^kbcl $dir/$f\$" "$work/units"; } ||
        { echo "FAIL: $f is in no library"; bad=1; }
    done
    # the include path of the library's first source: its own folders and lower layers' only
    f=$(grep -m1 "^$lib " "$work/units" | cut -d' ' -f2) || true
    [ -n "$f" ] || { echo "FAIL: $lib has no sources"; bad=1; continue; }
    idirs=$(grep -F "\"file\": \"$f\"" -B2 "$b/compile_commands.json" | grep -o ' -I[^ ]*' |
            sed 's/^ -I//' || true)
    i=$(rank_of_folder "$lf/x")
    for d in $idirs; do
      rel=${d#"$dir"/}
      [ "$rel" = "$d" ] && continue
      j=$(rank_of_folder "$rel")
      if [ "$j" -lt 0 ] || [ "$j" -gt "$i" ]; then
        echo "FAIL: $lib (folder $lf/) has $rel/ on its include path"; bad=1
      elif [ "$j" -lt "$i" ] && [ "${rel##*/}" = private ]; then
        echo "FAIL: $lib has the private headers of a lower layer, $rel/, on its path"; bad=1
      fi
    done
    # every header folder of the layer is on its library's include path
    for d in $(cd "$dir" && find "$lf" -name '*.h' -printf '%h\n' | sort -u); do
      # a here-string, not a pipe: under pipefail an early-exiting grep -q could fail the echo
      grep -qx "$dir/$d" <<<"$idirs" ||
        { echo "FAIL: the headers of $d/ are on no include path of $lib (read from $f's"
          echo "  compile command; its -I folders: $(echo $idirs))"; bad=1; }
    done
  done
  return $bad
}

# ---- 2. includes name a file in a layer at or below the includer's
check_includes() {
  local dir=$1 bad=0 f h hl fl line
  # header name -> layer index, for every header in a layer folder
  (cd "$dir" && for l in $LAYERS; do find "${l%%:*}" -name '*.h'; done) |
    while read -r h; do echo "${h##*/} $(rank_of_folder "$h")"; done >"$work/headers"
  grep -rnE --include='*.c' --include='*.h' --include='*.cl' --include='*.S' \
       '^[[:space:]]*#[[:space:]]*include[[:space:]]*("[^"]*/[^"]*"|<[^>]*\.\./[^>]*>)' \
       "$dir" --exclude-dir='build*' --exclude-dir=.git >"$work/rel" || true
  while IFS= read -r line; do
    echo "FAIL: an include names a path, not a file (${line#"$dir"/})"; bad=1
  done <"$work/rel"
  for l in $LAYERS; do
    fl=$(rank_of_folder "${l%%:*}/x")
    grep -rnoE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"[^"]*"' "$dir/${l%%:*}" |
      sed 's|^\([^:]*\):\([0-9]*\):.*"\(.*\)"$|\1 \2 \3|' | while read -r f line h; do
        hl=$(awk -v n="${h##*/}" '$1 == n { print $2; exit }' "$work/headers")
        if [ -n "$hl" ] && [ "$hl" -gt "$fl" ]; then
          echo "FAIL: ${f#"$dir"/}:$line includes $h, a header of a higher layer"; echo x
        fi
      done
  done | tee "$work/up" | grep -v '^x$' || true
  if grep -qx x "$work/up"; then bad=1; fi
  # no file above the runtime names its private header
  if grep -rn 'kb_runtime_int\.h' "$dir"/ccl "$dir"/tp "$dir"/app >"$work/int"; then
    echo "FAIL: a file in ccl/, tp/ or app/ includes the runtime's private header"
    cat "$work/int"; bad=1
  fi
  return $bad
}

if check_folders "$s" "$work/b"; then echo "ok: each folder is one layer, in its library only"
else fail=1; fi
if check_includes "$s"; then echo "ok: no include names a path or a higher layer's header"
else fail=1; fi

# expect_fail WHAT CHECK...: the check must fail (its output kept for the log)
expect_fail() {
  local what=$1; shift
  if "$@" >"$work/out" 2>&1; then echo "FAIL: the check missed $what"; fail=1
  else echo "ok: $what caught: $(grep -m1 FAIL "$work/out" | sed 's/^FAIL: //')"; fi
}
# prepend FILE LINE: FILE (relative) starts with LINE; unprepend FILE puts it back
prepend() { cp "$s/$1" "$s/$1.orig"; printf '%s\n' "$2" | cat - "$s/$1.orig" >"$s/$1"; }
unprepend() { mv "$s/$1.orig" "$s/$1"; }

# relative includes across folders, which the compiler would accept
for inj in 'host/kb_runtime.c:../ccl/kb_ccl.h' 'app/cli/report.c:../../tp/kb_tp.h' \
           'cl/kb_opencl.c:devd/kb_remote.h' 'tp/kb_tp.c:../host/kb_tl.h'; do
  prepend "${inj%%:*}" "#include \"${inj#*:}\""
  expect_fail "#include \"${inj#*:}\" in ${inj%%:*}" check_includes "$s"
  unprepend "${inj%%:*}"
done
# an upward include by name (the build catches it too, below)
prepend cl/kb_replay.c '#include "kb_runtime.h"'
expect_fail '#include "kb_runtime.h" in cl/kb_replay.c' check_includes "$s"
unprepend cl/kb_replay.c
# a source of host/ compiled into kb_ccl, and a source folder that is no layer
cp "$s/CMakeLists.txt" "$s/CMakeLists.txt.orig"
mkdir -p "$s/misc"
printf 'int kb_stray_a(void);\nint kb_stray_a(void) { return 0; }\n' >"$s/host/kb_stray.c"
printf 'int kb_stray_b(void);\nint kb_stray_b(void) { return 0; }\n' >"$s/misc/kb_stray.c"
printf '%s\n' 'target_sources(kb_ccl PRIVATE host/kb_stray.c)' \
       'target_sources(kb_host PRIVATE misc/kb_stray.c)' >>"$s/CMakeLists.txt"
cfg "$work/b2"
check_folders "$s" "$work/b2" >"$work/out2" 2>&1 || true
for want in 'host/kb_stray.c is in folder host/ (layer kb_host) but compiled into kb_ccl' \
            'folder misc/ holds sources but is no layer'; do
  if grep -qF "$want" "$work/out2"; then echo "ok: caught: $want"
  else echo "FAIL: the folder check missed: $want"; cat "$work/out2"; fail=1; fi
done
rm -rf "$s/misc" "$s/host/kb_stray.c" "$work/b2"
mv "$s/CMakeLists.txt.orig" "$s/CMakeLists.txt"

# ---- 3. the build: each library on its own, then an upward include breaks it
for t in kb_sched kb_cl kb_host kb_ccl kb_tp; do
  if build "$t"; then echo "ok: $t builds on its own"; else
    echo "FAIL: unmodified $t does not build"; tail -20 "$work/build.log"; fail=1; fi
done

# inject FILE HEADER TARGET: FILE (relative) gets #include HEADER; TARGET must fail with it
inject() {
  local f=$1 h=$2 t=$3
  prepend "$f" "#include \"$h\""
  if build "$t"; then
    echo "FAIL: $t still builds with #include \"$h\" in $f"; fail=1
  elif grep -q "$h: No such file" "$work/build.log"; then
    echo "ok: #include \"$h\" in $f breaks $t"
  else
    echo "FAIL: $t broke for another reason with $h in $f:"; tail -5 "$work/build.log"; fail=1
  fi
  unprepend "$f"
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

[ $fail = 0 ] && echo "layers: all checks held"
exit $fail
