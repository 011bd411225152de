#!/usr/bin/env bash
# regress — the timing regression set: fixed runs of kbcl whose sim_time_ns, events, fiber
# switches, op records and data digest must stay exactly what a recorded file says. The runs
# are made with the settings of the model before the cube NoC became a network (issue #29:
# cube.noc.topology=bus, one DMA channel), and with one of the two switch arbitrations:
#   route    tests/data/regress_bus.tsv: the model as it was until 2026-12-04, unchanged
#   per_sip  tests/data/regress_bus_per_sip.tsv: the same runs with the switch's default since
#            then (a SIP's part of a route booked when the data reach it; the collectives
#            over both SIPs run partitioned on the default --threads, one event more each)
# so any change to either shows here, to the event. The run list is regress_bus.tsv's.
# Usage: regress.sh KBCL [route|per_sip] [--write]   (--write regenerates that file from KBCL;
# run from any dir)
set -euo pipefail
kbcl=$1
arb=route
case ${2:-} in route | per_sip) arb=$2; shift ;; esac
mode=${2:-check}
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/.." && pwd)
list=$here/data/regress_bus.tsv
data=$list
[ "$arb" = route ] || data=$here/data/regress_bus_$arb.tsv
legacy=(${KBCL_REGRESS_SET---set cube.noc.topology=bus --set pe.dma.channels=1} --set system.switch.arbitration=$arb)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
out=$tmp/got.tsv
fail=0
# name <TAB> kbcl run arguments (relative paths are from the source tree)
runs=$(grep -v '^#' "$list" | cut -f1,2)
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
    { grep "^#" "$data" 2>/dev/null || true; cat "$out"; } >"$data.new" && mv "$data.new" "$data"
    echo "regress: wrote $(wc -l <"$out") runs to $data"; exit 0
fi
if ! diff <(grep -v '^#' "$data") "$out" >"$tmp/diff"; then
    echo "FAIL: the regression set moved (< recorded, > now):"; cat "$tmp/diff"; exit 1
fi
echo "regress: $(wc -l <"$out") runs identical"
