#!/usr/bin/env bash
# chunk-lines — the cache lines one IPCQ step touches, counted rather than timed (issue #34,
# docs/parallel.md "A third VM"): one thread's cost per chunk at thousands of PEs is set by how
# many lines each step touches per PE, and wall time on a shared host swings by 2x and more
# with the other tenants' use of the L3. Runs ring_rsag_allreduce at 8 KiB per rank,
# --threads 1, timing only, under cachegrind with an L1 of 32 KiB (8-way) and a last level of
# LL bytes (default 6 MiB, 12-way; the sizes at which 1 024 ranks sit where 4 096 ranks sit
# on a 24 MiB share of an L3), and prints instructions, L1 misses and last-level misses per
# IPCQ chunk. The counts are the same on every run of one binary (cachegrind simulates the
# caches), so two builds compare exactly. Needs valgrind (not a build dependency).
# Usage: scripts/chunk-lines.sh [KBCL] [RANKS (a multiple of 128, default 1024)] [LL,ASSOC]
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
kbcl=$(readlink -f "${1:-$here/build/kbcl}")
ranks=${2:-1024}
ll=${3:-6291456,12}
if ! command -v valgrind >/dev/null; then
    echo "chunk-lines: needs valgrind (apt-get install valgrind)" >&2
    exit 2
fi
if (( ranks < 128 || ranks % 128 )); then
    echo "chunk-lines: RANKS must be a multiple of 128 (one SIP each), got $ranks" >&2
    exit 2
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
valgrind --tool=cachegrind --cache-sim=yes --D1=32768,8,64 --LL="$ll",64 \
    --cachegrind-out-file="$tmp/cg.out" "$kbcl" run --bench ccl \
    --algorithm ring_rsag_allreduce --world-size "$ranks" \
    --set system.sips.count=$((ranks / 128)) --size 8K --device none --threads 1 \
    --json "$tmp/run.json" >"$tmp/run.txt" 2>"$tmp/cg.txt"
python3 - "$tmp" "$ranks" "$ll" <<'EOF'
import json, re, sys
tmp, ranks, ll = sys.argv[1], sys.argv[2], sys.argv[3]
log = open(f"{tmp}/cg.txt").read()
def total(name):
    m = re.search(name + r":\s+([\d,]+)", log)
    if not m:
        sys.exit(f"chunk-lines: no '{name}' in cachegrind's output")
    return int(m.group(1).replace(",", ""))
def find(d, key):
    if isinstance(d, dict):
        for k, v in d.items():
            if k == key:
                return v
            r = find(v, key)
            if r is not None:
                return r
    return None
chunks = find(json.load(open(f"{tmp}/run.json")), "ipcq_chunks")
ins, l1, lld = total(r"I\s+refs"), total(r"D1\s+misses"), total(r"LLd misses")
print(f"ring_rsag {ranks} ranks 8K, last level {ll}: {chunks} chunks; per chunk "
      f"{ins / chunks:.0f} instructions, {l1 / chunks:.2f} L1 misses, "
      f"{lld / chunks:.2f} last-level misses")
EOF
