#!/usr/bin/env bash
# `mpirun -n 2 kbcl sweep` must give the same rows as `kbcl sweep --jobs 2`: the same point
# indices, keys and numbers (wall_ms and row order aside), one row per point, written by rank 0
# alone; and --resume under mpirun finishes a cut file the same way.
# Usage: sweep_mpi.sh KBCL [MPIRUN]
set -euo pipefail
KBCL=$(readlink -f "$1")
MPIRUN=${2:-mpirun}
dir=$(mktemp -d /tmp/kbcl_sweep_mpi_XXXXXX)
trap 'rm -rf "$dir"' EXIT
cd "$dir"

cat > small.yaml <<'YAML'
bench: ccl_allreduce
device: ref
verify: true
grid:
  algorithm: [ring_allreduce_tcm, ring_rsag_allreduce]
  world_size: [8, 16]
  n_elem: [16]
YAML

mpi=("$MPIRUN" --oversubscribe -n 2)
if [ "$(id -u)" = 0 ]; then mpi=("$MPIRUN" --allow-run-as-root --oversubscribe -n 2); fi

# rows without wall_ms, sorted by point
canon() {
  awk -F, -v OFS=, 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "wall_ms") w = i; print; next }
                    { $w = ""; print }' "$1" | sort -t, -k1,1n
}
fail() { echo "sweep_mpi: FAIL: $*" >&2; exit 1; }

"$KBCL" sweep small.yaml --out jobs.csv --jobs 2 --quiet
"${mpi[@]}" "$KBCL" sweep small.yaml --out mpi.csv --quiet
[ "$(wc -l < jobs.csv)" -eq 5 ] || fail "jobs.csv: expected a header and 4 rows"
[ "$(wc -l < mpi.csv)" -eq 5 ] || fail "mpi.csv: expected a header and 4 rows, got $(wc -l < mpi.csv) lines"
diff <(canon jobs.csv) <(canon mpi.csv) || fail "mpirun rows differ from --jobs 2 rows"

# a cut last row is repaired and its point rerun under mpirun too
head -c -9 mpi.csv > cut.csv
"${mpi[@]}" "$KBCL" sweep small.yaml --out cut.csv --resume --quiet
diff <(canon jobs.csv) <(canon cut.csv) || fail "mpirun --resume rows differ"

# a sweep-file error stops every rank with exit 2
printf 'grid:\n  nope: [1]\n' > bad.yaml
set +e
"${mpi[@]}" "$KBCL" sweep bad.yaml --out bad.csv > bad.log 2>&1
rc=$?
set -e
[ "$rc" -eq 2 ] || fail "bad sweep file under mpirun: exit $rc, expected 2"
grep -q "bad.yaml:2:3: grid: unknown axis 'nope'" bad.log || fail "no file:line:col message"
echo "sweep_mpi: OK"
