#!/usr/bin/env bash
# regress — the timing regression set: fixed runs of kbcl whose sim_time_ns, events, fiber
# switches, op records and data digest must stay exactly what tests/data/regress_bus.tsv
# records. The file was written by the model before the cube NoC became a network (issue
# #29): every run is made with the settings that reproduce that model (cube.noc.topology=bus,
# one DMA channel), so any change to it shows here, to the event.
# Usage: regress.sh KBCL [--write]   (--write regenerates the file from KBCL; run from any dir)
set -euo pipefail
kbcl=$1
mode=${2:-check}
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/.." && pwd)
data=$here/data/regress_bus.tsv
legacy=(${KBCL_REGRESS_SET---set cube.noc.topology=bus --set pe.dma.channels=1})
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
out=$tmp/got.tsv
fail=0
# name <TAB> kbcl run arguments (relative paths are from the source tree)
runs=$(grep -v '^#' "$data" | cut -f1,2)
while IFS=$'\t' read -r name args; do
    [ -n "$name" ] || continue
    # shellcheck disable=SC2086
    if ! (cd "$src" && "$kbcl" run $args "${legacy[@]}" --json "$tmp/$name.json" >"$tmp/$name.log" 2>&1); then
        echo "FAIL: $name: kbcl run $args exited non-zero"; sed 's/^/  /' "$tmp/$name.log"
        fail=1; continue
    fi
    python3 - "$tmp/$name.json" "$name" "$args" >>"$out" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print("\t".join([sys.argv[2], sys.argv[3], repr(d["sim_time_ns"]), str(d["events"]),
                 str(d["fiber_switches"]), str(d["op_records"]), str(d.get("data_digest", "-"))]))
PY
done <<<"$runs"
[ "$fail" = 0 ] || exit 1
if [ "$mode" = "--write" ]; then
    { grep "^#" "$data" || true; cat "$out"; } >"$data.new" && mv "$data.new" "$data"
    echo "regress: wrote $(wc -l <"$out") runs to $data"; exit 0
fi
if ! diff <(grep -v '^#' "$data") "$out" >"$tmp/diff"; then
    echo "FAIL: the regression set moved (< recorded, > now):"; cat "$tmp/diff"; exit 1
fi
echo "regress: $(wc -l <"$out") runs identical"
