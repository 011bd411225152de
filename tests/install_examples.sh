#!/usr/bin/env bash
# kbcl as an installed library (docs/plugins.md "Installing kbcl"): installs the build into a
# temporary prefix, builds docs/examples/ against it as a project of its own (find_package),
# runs each example program and checks the output its document quotes (doc_example.sh), runs
# the example plugin through the build's kbcl (the command of issue #17, at 1 MiB per rank on
# 12 ranks) and the installed kbcl, runs the plugin's sweep file (every row ok), and builds
# softmax_kernel and the plugin by hand with pkg-config. Removes everything it made.
#   tests/install_examples.sh BUILD_DIR SOURCE_DIR KBCL_BIN C_COMPILER
set -euo pipefail
build=$1
src=$2
kbcl=$3
cc=$4
work=$(mktemp -d "${TMPDIR:-/tmp}/kbcl-install.XXXXXX")
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
ex=$work/examples
step() { echo "== $*"; }

step "cmake --install $build --prefix $prefix"
cmake --install "$build" --prefix "$prefix" >"$work/install.log"
for f in bin/kbcl lib/libkb_sched.a lib/libkb_tp.a lib/libkb_app.a \
         lib/cmake/kbcl/kbclConfig.cmake lib/pkgconfig/kbcl.pc share/kbcl/configs/ccl.yaml; do
    [[ -e $prefix/$f ]] || { echo "install: $prefix/$f is missing" >&2; exit 1; }
done
# the public headers (docs/api.md) and nothing else
got=$(cd "$prefix/include/kbcl" && ls | tr '\n' ' ')
want="kbcl.h kbcl_base.h kbcl_ccl.h kbcl_dtype.h kbcl_plugin.h kbcl_runtime.h kbcl_tl.h "
[[ $got == "$want" ]] || { echo "install: include/kbcl holds '$got', not '$want'" >&2; exit 1; }

step "a call outside the public API fails to compile, never at dlopen"
# kb_ctx_sim is one of kbcl's internal functions (the context's event engine): no installed
# header declares it, so a plugin that calls it is a compile error
printf '#include "kbcl.h"\nvoid *f(kb_ctx *c);\nvoid *f(kb_ctx *c) { return kb_ctx_sim(c); }\n' \
    >"$work/internal.c"
if "$cc" -std=c11 -Werror=implicit-function-declaration -fPIC -shared -I"$prefix/include/kbcl" \
        "$work/internal.c" -o "$work/libinternal.so" 2>"$work/internal.log"; then
    echo "a plugin calling kb_ctx_sim compiled against the installed headers" >&2; exit 1
fi
grep -q "kb_ctx_sim" "$work/internal.log" || { cat "$work/internal.log"; exit 1; }
echo "kb_ctx_sim: $(grep -m1 -o "implicit declaration of function[^;]*" "$work/internal.log")"
# and every public header compiles on its own, as C11 with every warning
for h in "$prefix"/include/kbcl/*.h; do
    printf '#include "%s"\n' "$(basename "$h")" >"$work/one.c"
    "$cc" -std=c11 -Wall -Wextra -Wpedantic -Werror -fsyntax-only -I"$prefix/include/kbcl" \
        "$work/one.c" || { echo "$h does not compile on its own" >&2; exit 1; }
done
echo "every public header compiles on its own"

step "cmake -S docs/examples -B $ex -DCMAKE_PREFIX_PATH=$prefix && cmake --build $ex"
cmake -S "$src/docs/examples" -B "$ex" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_C_COMPILER="$cc" \
      >"$work/configure.log" 2>&1 || { cat "$work/configure.log"; exit 1; }
cmake --build "$ex" >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }

step "the examples print what their documents quote"
bash "$src/tests/doc_example.sh" "$src/docs/kernels.md" softmax_kernel "$ex/softmax_kernel"
bash "$src/tests/doc_example.sh" "$src/docs/collectives.md" ring_broadcast "$ex/ring_broadcast"
bash "$src/tests/doc_example.sh" "$src/docs/distributed.md" dist_collectives "$ex/dist_collectives"
(cd "$ex" && ctest --output-on-failure >"$work/ctest.log" 2>&1) || { cat "$work/ctest.log"; exit 1; }

step "the plugin through the build's kbcl"
out=$("$kbcl" run --plugin "$ex/libmy_ring.so" --bench ccl --algorithm my_ring --world-size 12 \
      --size 1M --device ref --verify-data)
printf '%s\n' "$out" | head -2
grep -qxF '  my_ring (ws=12): 12 OK' <<<"$out" || { echo "no OK line" >&2; exit 1; }
# the same algorithm at rank = SIP (world_size 0): one rank per SIP, in lanes over its PEs
out=$("$kbcl" run --plugin "$ex/libmy_ring.so" --bench ccl --algorithm my_ring --world-size 0 \
      --size 1M --device ref --verify-data)
printf '%s\n' "$out" | head -2
grep -qxF '  my_ring (ws=2): 2 OK' <<<"$out" || { echo "no rank = SIP OK line" >&2; exit 1; }
out=$("$kbcl" list --plugin "$ex/libmy_ring.so")
grep -q '^  my_ring .*\[plugin my_ring\]$' <<<"$out" || { echo "list: no my_ring" >&2; exit 1; }

step "the plugin through the installed kbcl, its shipped configuration"
out=$(cd "$work" && env -u KBCL_CONFIG_DIR "$prefix/bin/kbcl" run --plugin "$ex/libmy_ring.so" \
      --bench my_scale --verify-data --quiet)
grep -qxF '  my_scale (32x64 f16 over 4 PEs): OK' <<<"$out" || { echo "$out" >&2; exit 1; }
out=$(cd "$work" && env -u KBCL_CONFIG_DIR "$prefix/bin/kbcl" run --quiet --verify-data \
      --algorithm ring_allreduce_tcm --world-size 8)
grep -qxF '  ring_allreduce_tcm (ws=8): 8 OK' <<<"$out" || { echo "$out" >&2; exit 1; }

step "the plugin's sweep file: every row ok"
"$kbcl" sweep "$ex/my_ring_sweep.yaml" --jobs 2 --out "$work/sweep.csv" --quiet
rows=$(tail -n +2 "$work/sweep.csv")
[[ $(wc -l <<<"$rows") -eq 12 ]] || { echo "sweep: expected 12 rows" >&2; cat "$work/sweep.csv"; exit 1; }
# verified, ok, no error, then the roofline's three columns
if grep -vE ',true,ok,,[0-9.e+-]+,(compute|memory|comm),[0-9.e+-]+$' <<<"$rows"; then
  echo "sweep: a row is not ok" >&2; exit 1
fi
echo "12 rows, every one ok"

step "pkg-config: a program and a plugin by hand"
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
pkg-config --cflags --libs kbcl
# shellcheck disable=SC2046
"$cc" "$src/docs/examples/softmax_kernel.c" $(pkg-config --cflags --libs kbcl) -o "$work/sm"
"$work/sm" | grep -x 'max |y - ref| = 1.49e-05 over 2048 values: OK'
# shellcheck disable=SC2046
"$cc" -shared -fPIC $(pkg-config --cflags kbcl) "$src/docs/examples/my_ring.c" -o "$work/libmine.so"
"$kbcl" run --plugin "$work/libmine.so" --bench ccl --algorithm my_ring --world-size 5 \
        --n-elem 100 --verify-data --quiet | grep -xF '  my_ring (ws=5): 5 OK'
echo "install_examples: all checks held"
