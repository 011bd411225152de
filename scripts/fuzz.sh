#!/usr/bin/env bash
# Runs kbcl's fuzz targets (tests/fuzz/, docs/reliability.md) with libFuzzer.
#
#   scripts/fuzz.sh TARGET SECONDS [JOBS]   fuzz TARGET (or `all`: every target in turn) for
#                                           SECONDS each with JOBS workers (default 1)
#   scripts/fuzz.sh list                    the targets
#   scripts/fuzz.sh pack DIR                a folder to fuzz on another x86-64 machine that
#                                           has no compiler: DIR/fuzz.sh, the binaries, the
#                                           seed corpora, the dictionaries, configs/
#
# Each run starts from a scratch copy of the target's seed corpus (the tree is never written)
# and stops at the first finding: a crash, a sanitizer report, a leak, a failed check, an
# input slower than FUZZ_TIMEOUT or bigger than FUZZ_RSS_MB. The crash file's path is in the
# output, and the exit status is non-zero. The last lines are one summary row per target.
#
# Environment:
#   FUZZ_BIN=DIR      prebuilt fuzz binaries (fuzz_NAME): nothing is built
#   FUZZ_BUILD=DIR    the fuzz build folder (default build-fuzz; configured with clang and
#                     -DKBCL_FUZZ=ON when it has no CMakeCache.txt)
#   FUZZ_WORK=DIR     where the scratch corpora, crash files and logs go (default: a new
#                     folder under $TMPDIR or /tmp, removed after a clean run unless
#                     FUZZ_KEEP=1)
#   FUZZ_TIMEOUT=S    seconds one input may take (default 25)
#   FUZZ_RSS_MB=MB    memory one worker may use (default 2048)
#   FUZZ_ARGS="..."   more libFuzzer options
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
if [ -f "$HERE/../CMakeLists.txt" ] && [ -d "$HERE/../tests/fuzz" ]; then
    ROOT=$(cd "$HERE/.." && pwd)             # the source tree
    CORPUS=$ROOT/tests/fuzz/corpus
    DICTS=$ROOT/tests/fuzz
    CONFIGS=$ROOT/configs
else
    ROOT=""                                  # a folder made by `fuzz.sh pack`
    CORPUS=$HERE/corpus
    DICTS=$HERE/dict
    CONFIGS=$HERE/configs
    FUZZ_BIN=${FUZZ_BIN:-$HERE/bin}
fi
TIMEOUT=${FUZZ_TIMEOUT:-25}
RSS_MB=${FUZZ_RSS_MB:-2048}

# usage [STATUS]: the header above; to stdout for --help (0), else to stderr (2)
usage() {
    if [ "${1:-2}" -eq 0 ]; then
        sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
    else
        sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
    fi
    exit "${1:-2}"
}

die() {
    echo "fuzz.sh: $*" >&2
    exit 2
}

# Sets BIN to the folder of the fuzz binaries, building them first when needed.
build() {
    if [ -n "${FUZZ_BIN:-}" ]; then
        BIN=$FUZZ_BIN
        [ -d "$BIN" ] || die "FUZZ_BIN=$BIN is not a folder"
        return
    fi
    [ -n "$ROOT" ] || die "no fuzz binaries: set FUZZ_BIN"
    local b=${FUZZ_BUILD:-$ROOT/build-fuzz}
    if [ ! -f "$b/CMakeCache.txt" ]; then
        command -v clang >/dev/null || die "the fuzz build needs clang (scripts/install-deps.sh)"
        # the binaries are carried to other machines: no MPI, no tests (cmocka)
        CC=clang cmake -S "$ROOT" -B "$b" -DCMAKE_BUILD_TYPE=Release -DKBCL_FUZZ=ON \
            -DKBCL_TESTS=OFF -DKBCL_MPI=OFF >"$b.configure.log" 2>&1 ||
            { cat "$b.configure.log" >&2; die "configuring $b failed"; }
        rm -f "$b.configure.log"
    fi
    cmake --build "$b" -j "${FUZZ_BUILD_JOBS:-$(nproc 2>/dev/null || echo 2)}" --target kbcl_fuzz \
        >"$b/fuzz-build.log" 2>&1 || { tail -40 "$b/fuzz-build.log" >&2; die "building in $b failed"; }
    BIN=$b/fuzz
}

targets() {
    local f
    for f in "$BIN"/fuzz_*; do
        [ -x "$f" ] && [ -f "$f" ] && basename "$f" | sed 's/^fuzz_//'
    done | sort
}

SUMMARY=()
FAILED=0

# run TARGET SECONDS JOBS: one libFuzzer run; appends its summary row.
run() {
    local t=$1 secs=$2 jobs=$3 exe=$BIN/fuzz_$1 w=$WORK/$1 rc=0 cpu execs ncorp result
    mkdir -p "$w/corpus" "$w/artifacts" "$w/tmp"
    [ -d "$CORPUS/$t" ] && cp -R "$CORPUS/$t/." "$w/corpus/"
    local args=(-max_total_time="$secs" -timeout="$TIMEOUT" -rss_limit_mb="$RSS_MB"
                -artifact_prefix="$w/artifacts/" -print_final_stats=1)
    [ -f "$DICTS/$t.dict" ] && args+=(-dict="$DICTS/$t.dict")
    [ "$jobs" -gt 1 ] && args+=(-fork="$jobs")
    # shellcheck disable=SC2206
    [ -n "${FUZZ_ARGS:-}" ] && args+=($FUZZ_ARGS)
    echo "fuzz.sh: $t: ${secs}s, $jobs worker(s), log $w/log"
    # the harnesses rewrite a scratch file per input: in memory (/dev/shm) when there is one,
    # since on a disk each rewrite waits for the file system
    local tmp=$w/tmp
    if [ -d /dev/shm ] && [ -w /dev/shm ]; then
        tmp=$(mktemp -d /dev/shm/kbcl-fuzz.XXXXXX)
    fi
    local t0=$SECONDS
    # a sweep's default configuration is configs/
    { TIMEFORMAT='%U %S'
      time TMPDIR="$tmp" KBCL_CONFIG_DIR="${KBCL_CONFIG_DIR:-$CONFIGS}" \
          "$exe" "${args[@]}" "$w/corpus" </dev/null >"$w/log" 2>&1; } 2>"$w/cpu" || rc=$?
    [ "$tmp" = "$w/tmp" ] || rm -rf "$tmp"
    cpu=$(awk '{printf "%.0f", $1 + $2}' "$w/cpu")
    # plain runs print libFuzzer's final stats; fork mode's parent, its "#N: cov: ..." lines
    execs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$w/log" | tail -1 | awk '{print $2}' || true)
    [ -n "$execs" ] || execs=$(grep -o '^#[0-9]*' "$w/log" | tail -1 | tr -d '#' || true)
    ncorp=$(find "$w/corpus" -type f | wc -l)
    local found
    found=$(find "$w/artifacts" -type f | sort)
    if [ "$rc" -eq 0 ] && [ -z "$found" ]; then
        result=clean
    else
        FAILED=1
        result="FINDING"
        [ -n "$found" ] || result="FAILED (exit $rc, no crash file)"
        echo "----- $t: last lines of $w/log" >&2
        grep -v '^#[0-9]' "$w/log" | tail -40 >&2 || true
        local a
        for a in $found; do
            echo "fuzz.sh: $t: crash file $a" >&2
            result="$result $a"
        done
    fi
    SUMMARY+=("$(printf '%-10s %8s %7s %9s %12s %7s  %s' "$t" "$((SECONDS - t0))" "$jobs" \
                       "$cpu" "${execs:-?}" "$ncorp" "$result")")
}

[ $# -ge 1 ] || usage
case "$1" in
    -h|--help) usage 0 ;;
    list)
        build
        targets
        exit 0 ;;
    pack)
        [ $# -eq 2 ] || usage
        [ -n "$ROOT" ] || die "pack runs in the source tree"
        build
        d=$2
        mkdir -p "$d/bin" "$d/corpus" "$d/dict"
        cp "$BIN"/fuzz_* "$d/bin/"
        cp -R "$CORPUS/." "$d/corpus/"
        cp "$DICTS"/*.dict "$d/dict/" 2>/dev/null || true
        rm -rf "$d/configs"
        cp -R "$CONFIGS" "$d/configs"
        cp "$0" "$d/fuzz.sh"
        echo "fuzz.sh: $d: run it there as $d/fuzz.sh all SECONDS JOBS; the binaries need:"
        ldd "$d"/bin/fuzz_* | awk '/=>/ {print "  " $1}' | sort -u
        exit 0 ;;
esac
[ $# -ge 2 ] && [ $# -le 3 ] || usage
TARGET=$1 SECS=$2 JOBS=${3:-1}
[[ "$SECS" =~ ^[1-9][0-9]*$ ]] || die "SECONDS must be a positive whole number"
[[ "$JOBS" =~ ^[1-9][0-9]*$ ]] || die "JOBS must be a positive whole number"
build
if [ "$TARGET" = all ]; then
    mapfile -t LIST < <(targets)
    [ "${#LIST[@]}" -gt 0 ] || die "no fuzz binaries in $BIN"
else
    [ -x "$BIN/fuzz_$TARGET" ] || die "no target '$TARGET' in $BIN (targets: $(targets | tr '\n' ' '))"
    LIST=("$TARGET")
fi
if [ -n "${FUZZ_WORK:-}" ]; then
    WORK=$FUZZ_WORK
    mkdir -p "$WORK"
else
    WORK=$(mktemp -d "${TMPDIR:-/tmp}/kbcl-fuzz.XXXXXX")
fi
for t in "${LIST[@]}"; do
    run "$t" "$SECS" "$JOBS"
done
echo
printf '%-10s %8s %7s %9s %12s %7s  %s\n' target seconds workers cpu_s execs corpus result
printf '%s\n' "${SUMMARY[@]}"
if [ "$FAILED" -ne 0 ]; then
    echo "fuzz.sh: findings; crash files, corpora and logs are in $WORK" >&2
    exit 1
fi
if [ "${FUZZ_KEEP:-0}" = 1 ] || [ -n "${FUZZ_WORK:-}" ]; then
    echo "fuzz.sh: corpora and logs are in $WORK"
else
    rm -rf "$WORK"
fi
