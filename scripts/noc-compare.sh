#!/usr/bin/env bash
# noc-compare — the before/after table of issue #29 (docs/performance.md, "The interconnect"):
# every all-reduce entry of configs/ccl.yaml at 256 ranks and 1K / 1M / 64M / 1G per rank,
# the other collectives at 64M, and the Gemma-2 2B TP4 decoder layer, each on the shipped
# machine (the cube NoC a mesh of links, 4 DMA channels, posted sends) and on the model before
# issue #29 (cube.noc.topology=bus, pe.dma.channels=1, ccl.defaults.posted_sends=false, the
# hierarchical entry's hierarchical_3level wiring and 256 KiB slots, and the switch of that
# time, system.switch.arbitration=route). Timing only; runs in
# parallel, one per CPU (KBCL_JOBS to change), each at most KBCL_RUN_TIMEOUT seconds (600).
# Prints one markdown row per run: what, model, sim_time, busbw, efficiency, bound resource,
# events, wall. Usage: scripts/noc-compare.sh [KBCL] [OUTDIR]
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
kbcl=$(readlink -f "${1:-$here/build/kbcl}")
out=${2:-$(mktemp -d)}
jobs=${KBCL_JOBS:-$(nproc)}
limit=${KBCL_RUN_TIMEOUT:-600}
mkdir -p "$out"
legacy="--set cube.noc.topology=bus --set pe.dma.channels=1 --set ccl.defaults.posted_sends=false \
--set ccl.algorithms.hierarchical_allreduce.topology=hierarchical_3level \
--set ccl.algorithms.hierarchical_allreduce.slot_size=262144 \
--set system.switch.arbitration=route"

list=$out/runs.txt
: >"$list"
allreduce="ring_allreduce_tcm ring_allreduce_hbm ring_allreduce_sram mesh_allreduce_4 \
tree_allreduce_7 hierarchical_allreduce ring_rsag_allreduce rhd_allreduce dbtree_allreduce"
others="ring_allgather rd_allgather ring_reducescatter rh_reducescatter ring_broadcast \
tree_broadcast ring_reduce tree_reduce pairwise_alltoall p2p_sendrecv"
for model in net bus; do
    for a in $allreduce; do
        for size in 1K 1M 64M 1G; do
            echo "$model $a $size --bench ccl --algorithm $a --world-size 256 --size $size" >>"$list"
        done
    done
    for a in $others; do
        echo "$model $a 64M --bench ccl --algorithm $a --world-size 256 --size 64M" >>"$list"
    done
    echo "$model decoder_gemma2_tp4 - --bench decoder_layer --model $here/configs/models/gemma2-2b.yaml --set system.sips.count=4" >>"$list"
done

run_one() { # model name size args...
    local model=$1 name=$2 size=$3
    shift 3
    local tag="$model.$name.$size" extra=""
    [ "$model" = bus ] && extra=$legacy
    # shellcheck disable=SC2086
    if ! timeout "$limit" "$kbcl" run "$@" --device none $extra --json "$out/$tag.json" \
        >"$out/$tag.log" 2>&1; then
        echo "$tag failed or timed out" >"$out/$tag.err"
    fi
}
export -f run_one
export kbcl out limit legacy
# biggest first, so the long 1G runs start early
sort -k3,3 -r "$list" | xargs -P "$jobs" -L 1 bash -c 'run_one "$@"' _

echo "| collective / entry | size | model | sim_time (µs) | busbw (GB/s) | efficiency | bound | events | wall (s) |"
echo "|---|---|---|---|---|---|---|---|---|"
while read -r model name size _; do
    tag="$model.$name.$size"
    python3 - "$out/$tag.json" "$name" "$size" "$model" <<'PY'
import json, os, sys
path, name, size, model = sys.argv[1:5]
if not os.path.exists(path):
    print("| %s | %s | %s | (no result) | | | | | |" % (name, size, model))
    sys.exit(0)
d = json.load(open(path))
bw = d.get("busbw_gbps")
print("| %s | %s | %s | %.3f | %s | %.3f | %s | %d | %.2f |" % (
    name, size, model, d["sim_time_ns"] / 1e3, "%.2f" % bw if bw is not None else "-",
    d.get("efficiency", 0.0), d.get("bound_resource", "-"), d["events"], d["wall_ms"] / 1e3))
PY
done <"$list"
