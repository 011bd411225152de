#!/usr/bin/env bash
# `mpirun -n 2 kbcl run` must give what one process gives: for each run, the JSON of
# `kbcl run ... --threads 1` against the JSON of the same run under mpirun -n 2 (with 1 thread
# per rank, and once with 2), host-time fields aside (docs/parallel.md: a launch's SIPs spread
# over the ranks). The run list:
#   quick     (default) verified collectives over 2 and 4 SIPs (they run partitioned), tp_mlp
#             and the decoder on 4 SIPs and a collective on one SIP (they do not); and a rank
#             that cannot read its configuration fails the job on both ranks with its message;
#   --regress the regression set (tests/data/regress_bus.tsv's runs with per_sip)
#   --big     issue #34's big runs: ring_rsag 4 096 ranks at 8K, hierarchical 8 192 ranks at 1M,
#             tp_mlp on 4 SIPs (minutes on 2 cores)
# With --regress and --big, one process at --threads 2 and 16 is compared too (issue #34's
# thread counts), so each run is made four times.
# Usage: mpi_run.sh KBCL [MPIRUN] [--regress|--big]   (run from any dir)
set -euo pipefail
kbcl=$(readlink -f "$1")
MPIRUN=${2:-mpirun}
mode=${3:-quick}
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/.." && pwd)
tmp=$(mktemp -d /tmp/kbcl_mpi_run_XXXXXX)
trap 'rm -rf "$tmp"' EXIT
mpi=("$MPIRUN" --oversubscribe -n 2)
if [ "$(id -u)" = 0 ]; then mpi=("$MPIRUN" --allow-run-as-root --oversubscribe -n 2); fi
bus=(--set cube.noc.topology=bus --set pe.dma.channels=1 --set system.switch.arbitration=per_sip)

runs=$tmp/runs.tsv
case $mode in
--regress)
    grep -v '^#' "$here/data/regress_bus.tsv" | cut -f1,2 | sed "s|\$| ${bus[*]}|" >"$runs" ;;
--big)
    cat >"$runs" <<'R'
rsag_4096	--bench ccl --algorithm ring_rsag_allreduce --world-size 4096 --set system.sips.count=32 --size 8K --device none
hier_8192	--bench ccl --algorithm hierarchical_allreduce --world-size 8192 --set system.sips.count=64 --size 1M --device none
tp_mlp_4	--bench tp_mlp --set system.sips.count=4 --device ref --verify-data
R
    ;;
quick)
    cat >"$runs" <<'R'
rsag	--bench ccl --algorithm ring_rsag_allreduce --device ref --verify-data
rsag_512_4	--bench ccl --algorithm ring_rsag_allreduce --world-size 512 --set system.sips.count=4 --size 16K --device ref --verify-data
hier_512_4	--bench ccl --algorithm hierarchical_allreduce --world-size 512 --set system.sips.count=4 --size 64K --device ref --verify-data
dbtree_512_4	--bench ccl --algorithm dbtree_allreduce --world-size 512 --set system.sips.count=4 --size 64K --device ref --verify-data
ring_tcm	--bench ccl --algorithm ring_allreduce_tcm --device ref --verify-data
tp_mlp_4	--bench tp_mlp --set system.sips.count=4 --device ref --verify-data
decoder_4	--bench decoder_layer --model configs/models/tiny.yaml --param seq=16 --set system.sips.count=4 --device ref --verify-data
one_sip	--bench ccl --algorithm ring_rsag_allreduce --world-size 64 --device ref --verify-data
R
    ;;
*) echo "mpi_run: unknown mode $mode" >&2; exit 2 ;;
esac

# the JSON without its host-time fields (what differs between identical runs anyway)
canon() {
    python3 - "$1" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for k in ("wall_ms", "phase1_ms", "phase1_threads", "phase1_ranks", "events_per_s"):
    d.pop(k, None)
r = d.get("replay")
if isinstance(r, dict):
    for k in ("ms", "program_cache", "setup_ms", "setup_wait_ms", "upload_ms", "download_ms",
              "kernel_ms"):
        r.pop(k, None)
print(json.dumps(d, indent=1, sort_keys=True))
PY
}

fail=0 n=0 k=0
while IFS=$'\t' read -r name args; do
    [ -n "$name" ] || continue
    k=$((k + 1))
    th=1
    [ $((k % 2)) = 0 ] && th=2 # threads x ranks mixed: every other run 2 threads per rank
    # shellcheck disable=SC2086
    if ! (cd "$src" && "$kbcl" run $args --threads 1 --json "$tmp/$name.one.json" \
            </dev/null >"$tmp/$name.one.log" 2>&1); then
        echo "FAIL: $name: kbcl run $args --threads 1 failed"; sed 's/^/  /' "$tmp/$name.one.log"
        fail=1; continue
    fi
    # shellcheck disable=SC2086
    if ! (cd "$src" && "${mpi[@]}" "$kbcl" run $args --threads $th --json "$tmp/$name.mpi.json" \
            </dev/null >"$tmp/$name.mpi.log" 2>&1); then
        echo "FAIL: $name: mpirun -n 2 kbcl run $args --threads $th failed"
        sed 's/^/  /' "$tmp/$name.mpi.log"; fail=1; continue
    fi
    if ! diff <(canon "$tmp/$name.one.json") <(canon "$tmp/$name.mpi.json") >"$tmp/diff"; then
        echo "FAIL: $name: mpirun -n 2 (--threads $th) differs from one process (< one, > mpi):"
        cat "$tmp/diff"; fail=1; continue
    fi
    more=""
    if [ "$mode" != quick ]; then
        for t in 2 16; do
            # shellcheck disable=SC2086
            if ! (cd "$src" && "$kbcl" run $args --threads $t --json "$tmp/$name.t$t.json" \
                    </dev/null >"$tmp/$name.t$t.log" 2>&1) ||
                ! diff <(canon "$tmp/$name.one.json") <(canon "$tmp/$name.t$t.json") \
                    >"$tmp/diff"; then
                echo "FAIL: $name: --threads $t differs from --threads 1 or failed:"
                cat "$tmp/diff" "$tmp/$name.t$t.log"; fail=1; continue 2
            fi
        done
        more=", threads 2 and 16 too"
    fi
    # the run's figures, and proof that it ran on two ranks
    if ! python3 - "$tmp/$name.mpi.json" "$name" "$th" "$more" >>"$tmp/ok" <<'PY'; then
import json, sys
d = json.load(open(sys.argv[1]))
assert d.get("phase1_ranks") == 2, "no phase1_ranks 2 in the JSON"
print("\t".join([sys.argv[2], repr(d["sim_time_ns"]), "forked %d" % d.get("forked_launches", 0),
                 str(d.get("data_digest", "-")), "threads %s x 2 ranks%s" % (sys.argv[3], sys.argv[4])]))
PY
        echo "FAIL: $name: the mpirun JSON is not a 2-rank run's"; fail=1; continue
    fi
    n=$((n + 1))
done <"$runs"
[ -f "$tmp/ok" ] && cat "$tmp/ok"
if [ "$mode" = quick ]; then
    # one rank that cannot load its configuration fails the job on every rank, with that
    # rank's message, instead of leaving the others waiting at the first partitioned launch
    if (cd "$src" && timeout 120 "${mpi[@]}" sh -c 'if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then
            export KBCL_CONFIG_DIR=/nonexistent; fi; exec "$0" run --bench ccl --algorithm \
            ring_rsag_allreduce --device none' "$kbcl" </dev/null >"$tmp/bad.log" 2>&1); then
        echo "FAIL: a rank without its configuration: the job succeeded"; fail=1
    elif ! grep -q 'kbcl: rank 1: /nonexistent/topology.yaml: cannot open' "$tmp/bad.log"; then
        echo "FAIL: a rank without its configuration: not the expected message (or a hang):"
        sed 's/^/  /' "$tmp/bad.log"; fail=1
    fi
fi
[ "$fail" = 0 ] || exit 1
echo "mpi_run: $n runs identical under mpirun -n 2"
