#!/usr/bin/env bash
# chunk-ratio — issue #34's item 4 as measured on 2026-12-05 (docs/parallel.md "Item 4 on the
# H100 host, measured again"): one thread's Phase-1 cost per IPCQ chunk at LARGE ranks against
# SMALL ranks, ring_rsag_allreduce at 8 KiB per rank, --threads 1, timing only. A 256-rank run
# lasts 30-170 ms, so on a shared host one run of it catches whatever spell the host is in,
# while a 4 096-rank run (8-30 s) averages over many. So each round runs SMALL ranks back to
# back for SECS seconds and sums their phase1_ms over their chunks, then makes one LARGE-rank
# run: both figures cover the same stretch of the host's time. Prints each round's µs per
# chunk and ratio, then the ratio of the sums over all rounds and the median round's.
# The cost per chunk is phase1_ms / ipcq_chunks of the run's JSON (set-up included, as the
# issue measured it).
# Usage: scripts/chunk-ratio.sh [KBCL] [SECS (default 10)] [ROUNDS (default 3)]
#   CPU=N pins every run to CPU N (taskset); SMALL / LARGE set the rank counts (multiples of
#   128, defaults 256 and 4096).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
kbcl=$(readlink -f "${1:-$here/build/kbcl}")
secs=${2:-10}
rounds=${3:-3}
small=${SMALL:-256}
large=${LARGE:-4096}
die() { echo "chunk-ratio: $*" >&2; exit 2; }
[ -x "$kbcl" ] || die "no kbcl binary at $kbcl"
[[ $secs =~ ^[1-9][0-9]*$ ]] || die "SECS must be a positive integer, got '$secs'"
[[ $rounds =~ ^[1-9][0-9]*$ ]] || die "ROUNDS must be a positive integer, got '$rounds'"
for n in "$small" "$large"; do
    [[ $n =~ ^[1-9][0-9]*$ ]] && (( n % 128 == 0 )) ||
        die "SMALL and LARGE must be multiples of 128 (one SIP each), got '$n'"
done
pin=()
if [ -n "${CPU:-}" ]; then
    command -v taskset >/dev/null || die "CPU=$CPU needs taskset (util-linux)"
    pin=(taskset -c "$CPU")
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
one() { # ranks json
    "${pin[@]}" "$kbcl" run --bench ccl --algorithm ring_rsag_allreduce --world-size "$1" \
        --set system.sips.count=$(($1 / 128)) --size 8K --device none --threads 1 \
        --json "$2" >/dev/null 2>"$tmp/err" || { cat "$tmp/err" >&2; die "the run at $1 ranks failed"; }
}
for r in $(seq 1 "$rounds"); do
    mkdir -p "$tmp/r$r/small"
    t0=$SECONDS
    i=0
    while (( SECONDS - t0 < secs )); do
        i=$((i + 1))
        one "$small" "$tmp/r$r/small/$(printf %06d $i).json"
    done
    one "$large" "$tmp/r$r/large.json"
done
python3 - "$tmp" "$rounds" "$small" "$large" <<'EOF'
import glob, json, sys
tmp, rounds, small, large = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def cost(files):  # phase1_ms and ipcq_chunks are top-level keys of a run's JSON
    ms = chunks = 0.0
    for f in files:
        d = json.load(open(f))
        ms += d["phase1_ms"]
        chunks += d["ipcq_chunks"]
    return ms, chunks
tot = [0.0, 0.0, 0.0, 0.0]
ratios = []
for r in range(1, rounds + 1):
    files = sorted(glob.glob(f"{tmp}/r{r}/small/*.json"))
    sm, sc = cost(files)
    lm, lc = cost([f"{tmp}/r{r}/large.json"])
    s, l = sm * 1e3 / sc, lm * 1e3 / lc
    ratios.append(l / s)
    tot = [tot[0] + sm, tot[1] + sc, tot[2] + lm, tot[3] + lc]
    print(f"round {r}: {small} ranks {s:.4f} us/chunk ({len(files)} runs, {sm:.0f} ms), "
          f"{large} ranks {l:.4f} us/chunk ({lm:.0f} ms): {l / s:.2f}x")
s, l = tot[0] * 1e3 / tot[1], tot[2] * 1e3 / tot[3]
ratios.sort()
print(f"all rounds: {small} ranks {s:.4f}, {large} ranks {l:.4f} us/chunk: {l / s:.2f}x "
      f"(median round {ratios[len(ratios) // 2]:.2f}x)")
EOF
