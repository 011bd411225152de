#!/usr/bin/env bash
# Times `kbcl report` on synthetic sweep results of growing size (issue #35: the page must
# stay linear in the rows; 40 000 rows in <= 10 s). The rows have a real sweep's header
# (point, algorithm, world_size, size, then kbcl sweep's fixed columns) over ccl.yaml's
# entries x message sizes x world sizes, with made-up but consistent numbers (algbw = size /
# time, busbw = algbw x the collective's factor), so the page has every section a real
# collectives sweep gets. No simulation runs: a 40 000-point sweep would take hours.
#
#   scripts/report-scale.sh build/kbcl [ROWS...]     (default 5000 20000 40000)
set -euo pipefail
kbcl=${1:?usage: $0 path/to/kbcl [rows...]}
shift
rows=("$@")
[ ${#rows[@]} -gt 0 ] || rows=(5000 20000 40000)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for n in "${rows[@]}"; do
    python3 - "$n" >"$tmp/r$n.csv" <<'PY'
import sys
n = int(sys.argv[1])
# (entry, factor of its collective: kb_coll_busbw_factor)
algs = [("ring_allreduce_tcm", "ar"), ("ring_allreduce_hbm", "ar"), ("ring_allreduce_sram", "ar"),
        ("tree_allreduce_7", "ar"), ("hierarchical_allreduce", "ar"), ("ring_rsag_allreduce", "ar"),
        ("rhd_allreduce", "ar"), ("dbtree_allreduce", "ar"), ("ring_allgather", "ag"),
        ("rd_allgather", "ag"), ("ring_reducescatter", "ag"), ("rh_reducescatter", "ag"),
        ("pairwise_alltoall", "ag"), ("ring_broadcast", "one"), ("tree_broadcast", "one"),
        ("ring_reduce", "one"), ("tree_reduce", "one"), ("p2p_sendrecv", "one"),
        ("mesh_allreduce_4", "ar"), ("intercube_allreduce", "ar")]
sizes = [8 << (i % 28) for i in range(25)]
nws = max(1, -(-n // (len(algs) * len(sizes))))
wss = [2 + 2 * i for i in range(nws)]
print("point,algorithm,world_size,size,bench,size_bytes,sim_time_ns,algbw_gbps,busbw_gbps,"
      "bound_ns,efficiency,bound_resource,events,wall_ms,verified,status,error")
p = 0
for ai, (a, kind) in enumerate(algs):
    for ws in wss:
        for sz in sizes:
            if p == n:
                sys.exit(0)
            t = 2000.0 + 40.0 * ws * (1 + ai % 5) + sz / (10.0 + ai)
            algbw = sz / t
            f = {"ar": 2.0 * (ws - 1) / ws, "ag": (ws - 1) / ws, "one": 1.0}[kind]
            bound = t * (0.2 + 0.7 * ((ai * 7 + ws + sz) % 97) / 97.0)
            status = "ok" if p % 997 else "error"
            print(f"{p},{a},{ws},{sz},ccl,{sz},{t:.3f},{algbw:.9g},{algbw * f:.9g},"
                  f"{bound:.3f},{bound / t:.9g},pe_dma sip0/cube0/pe{ws % 8},{100 + ws},1.5,,"
                  f"{status},{'' if status == 'ok' else 'deadlock'}")
            p += 1
PY
    TIMEFORMAT=%R
    secs=$( { time "$kbcl" report "$tmp/r$n.csv" -o "$tmp/r$n.html" >/dev/null; } 2>&1 )
    printf '%6d rows: %s s, page %s bytes\n' "$n" "$secs" "$(stat -c %s "$tmp/r$n.html")"
done
