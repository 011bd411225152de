#!/usr/bin/env bash
# Renders a `kbcl report` page in headless Chromium and checks the DOM it builds: one <svg>
# per plot, each algorithm named in the legends, the rows table. Registered by
# tests/CMakeLists.txt only when chromium is installed (KBCL_INSTALL_CHROMIUM=1
# scripts/install-deps.sh). Usage: report_render.sh KBCL CHROMIUM
set -euo pipefail
KBCL=$(readlink -f "$1")
CHROMIUM=${2:-chromium}
dir=$(mktemp -d /tmp/kbcl_report_render_XXXXXX)
trap 'rm -rf "$dir"' EXIT
cd "$dir"

cat > small.yaml <<'YAML'
bench: ccl_allreduce
verify: true
grid:
  algorithm: [ring_allreduce_tcm, hierarchical_allreduce]
  world_size: [8, 16]
  n_elem: [16, 64]
YAML
fail() { echo "report_render: FAIL: $*" >&2; exit 1; }

"$KBCL" sweep small.yaml --out r.csv --quiet
"$KBCL" report r.csv -o r.html
timeout 120 "$CHROMIUM" --headless --disable-gpu --no-sandbox --user-data-dir="$dir/profile" \
  --dump-dom "file://$dir/r.html" > dom.html 2> chromium.log || {
  cat chromium.log >&2; fail "chromium could not render the page"; }

# 2 n_elem x (time, busbw) vs world size + 2 world sizes x time vs message size
n=$(grep -o '<svg' dom.html | wc -l)
[ "$n" -eq 6 ] || fail "expected 6 <svg> elements in the DOM, got $n"
for alg in ring_allreduce_tcm hierarchical_allreduce; do
  # (the DOM serializer may write <line ...></line> for <line .../>; the text is the same)
  m=$(grep -o ">$alg</text></g>" dom.html | wc -l)
  [ "$m" -eq 6 ] || fail "$alg: in $m legends, expected 6"
done
grep -q '<polyline' dom.html || fail "no plotted lines"
[ "$(grep -o '<tr' dom.html | wc -l)" -eq 9 ] || fail "expected a table of 8 rows"
echo "report_render: OK"
