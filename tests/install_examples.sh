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
for f in bin/kbcl lib/libkb_sched.a lib/libkb_tp.a lib/libkb_app.a include/kbcl/kb_runtime.h \
         include/kbcl/kb_tl.h include/kbcl/kb_ccl.h include/kbcl/kb_plugin.h \
         lib/cmake/kbcl/kbclConfig.cmake lib/pkgconfig/kbcl.pc share/kbcl/configs/ccl.yaml; do
    [[ -e $prefix/$f ]] || { echo "install: $prefix/$f is missing" >&2; exit 1; }
done
# private headers: the runtime's, the CLI's and every split module's internal *_int.h
if [[ -e $prefix/include/kbcl/kb_cli.h ]] || compgen -G "$prefix/include/kbcl/*_int.h" >/dev/null; then
    echo "install: a private header was installed" >&2
    exit 1
fi

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
