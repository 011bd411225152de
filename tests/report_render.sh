#!/usr/bin/env bash
# Renders a `kbcl report` page in headless Chromium and checks the DOM it builds: one <svg>
# per plot, each algorithm named in the legends, the size axes labelled in bytes, the
# efficiency plots, the rows table, the terms (algbw, busbw, efficiency).
# Usage: report_render.sh KBCL [CHROMIUM]
# Without a Chromium (none given, or not executable) it exits 77, which ctest reports as
# "Skipped"; with KBCL_REQUIRE_BROWSER=1 (CI) that is a failure instead.
set -euo pipefail
KBCL=$(readlink -f "$1")
CHROMIUM=${2:-}
if [ -z "$CHROMIUM" ] || ! [ -x "$CHROMIUM" ]; then
  if [ "${KBCL_REQUIRE_BROWSER:-0}" = "1" ]; then
    echo "report_render: FAIL: no Chromium (KBCL_REQUIRE_BROWSER=1); install it with" \
         "KBCL_INSTALL_CHROMIUM=1 scripts/install-deps.sh and re-run cmake" >&2
    exit 1
  fi
  echo "report_render: skipped: no Chromium (KBCL_INSTALL_CHROMIUM=1 scripts/install-deps.sh)"
  exit 77
fi
dir=$(mktemp -d /tmp/kbcl_report_render_XXXXXX)
trap 'rm -rf "$dir"' EXIT
cd "$dir"

cat > small.yaml <<'YAML'
bench: ccl_allreduce
verify: true
grid:
  algorithm: [ring_allreduce_tcm, hierarchical_allreduce]
  world_size: [8, 16]
  size: [32, 128]
YAML
fail() { echo "report_render: FAIL: $*" >&2; exit 1; }

"$KBCL" sweep small.yaml --out r.csv --quiet
"$KBCL" report r.csv -o r.html
timeout 120 "$CHROMIUM" --headless --disable-gpu --no-sandbox --user-data-dir="$dir/profile" \
  --dump-dom "file://$dir/r.html" > dom.html 2> chromium.log || {
  cat chromium.log >&2; fail "chromium could not render the page"; }

# 2 sizes x (time, busbw, efficiency) vs world size + 2 world sizes x (busbw, time,
# efficiency) vs message size
n=$(grep -o '<svg' dom.html | wc -l)
[ "$n" -eq 12 ] || fail "expected 12 <svg> elements in the DOM, got $n"
for alg in ring_allreduce_tcm hierarchical_allreduce; do
  # (the DOM serializer may write <line ...></line> for <line .../>; the text is the same)
  m=$(grep -o ">$alg</text></g>" dom.html | wc -l)
  [ "$m" -eq 12 ] || fail "$alg: in $m legends, expected 12"
done
m=$(grep -o '<polyline' dom.html | wc -l)
[ "$m" -eq 24 ] || fail "expected a line per algorithm in each plot (24), got $m"
m=$(grep -o '>message size (bytes per rank) (log2 scale)<' dom.html | wc -l)
[ "$m" -eq 6 ] || fail "expected 6 plots against message size, got $m"
m=$(grep -o '>efficiency (bound / sim time)<' dom.html | wc -l)
[ "$m" -eq 4 ] || fail "expected 4 efficiency plots (2 vs world size, 2 vs size), got $m"
grep -q '>128 B<' dom.html || fail "no byte tick labels on the size axis"
[ "$(grep -o '<tr' dom.html | wc -l)" -eq 9 ] || fail "expected a table of 8 rows"
# the terms the plots use, defined on the page
for term in algbw busbw efficiency; do
  grep -q "<dt><b>$term</b>" dom.html || fail "no definition of $term"
done
grep -q 'all_reduce 2(n-1)/n' dom.html || fail "no all_reduce bus factor in the terms"
echo "report_render: OK"
