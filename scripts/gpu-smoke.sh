#!/usr/bin/env bash
# gpu-smoke — checks and measures kbcl's Phase 2 on a Linux machine with an NVIDIA GPU: the
# OpenCL device listing, the ref-vs-GPU parity tests (tests/test_opencl on the GPU), a cold
# and a warm start (program cache), bench-self --quick --device gpu (set-up cold/warm, every
# shipped bench on gpu and ref with set-up / upload / replay / download shares, kernel
# throughput),
# and with --full the acceptance runs of issue #15: the all-reduce sweep on gpu and on ref,
# and ring_rsag_allreduce on 256 ranks at --size 4M (1 GiB of rank buffers) on both.
#
# Usage: scripts/gpu-smoke.sh [BUILD_DIR] [--full]
#   BUILD_DIR (default: build) is used as is when it already holds kbcl and tests/test_opencl
#   (a build carried from another machine works: the OpenCL program is embedded in the
#   binaries); otherwise it is configured (Release) and those two targets are built.
# Output: everything is printed and also kept in $OUT (the device tool's folder) or
# BUILD_DIR/gpu-smoke-out: bench-self-quick.json (and with --full bench-self.json, whose
# Phase-1 rows include a 4 096-rank run of a minute or more), the runs' JSON and text, the
# sweeps' CSV and times.txt (wall seconds of the timed steps).
# Registers the NVIDIA OpenCL driver through OCL_ICD_FILENAMES when /etc/OpenCL/vendors has no
# NVIDIA entry (minimal images often ship only pocl.icd). The program cache and PoCL's cache
# live in a fresh folder under the output folder, so the first start is cold. Runs every
# step, then prints a summary; the exit status is 0 only if all steps passed.
# KBCL_SMOKE_DEVICE=cpu runs the same steps on an OpenCL CPU device (PoCL: tries the script
# on a machine without a GPU).
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=$root/build
full=0
for a in "$@"; do
    case $a in
        --full) full=1 ;;
        *) build=$a ;;
    esac
done
build=$(cd "$build" 2>/dev/null && pwd || echo "$build")

if [ ! -x "$build/kbcl" ] || [ ! -x "$build/tests/test_opencl" ]; then
    echo "gpu-smoke: building kbcl and test_opencl in $build"
    cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release || exit 2
    cmake --build "$build" -j "$(nproc)" --target kbcl test_opencl || exit 2
fi

if ! grep -qsi nvidia /etc/OpenCL/vendors/*.icd && [ -z "${OCL_ICD_FILENAMES:-}" ]; then
    for lib in /usr/local/nvidia/lib64/libnvidia-opencl.so.1 \
               /usr/lib/x86_64-linux-gnu/libnvidia-opencl.so.1 \
               /usr/lib64/libnvidia-opencl.so.1 /usr/lib/libnvidia-opencl.so.1; do
        if [ -e "$lib" ]; then
            export OCL_ICD_FILENAMES=$lib
            echo "gpu-smoke: no NVIDIA ICD registered; using OCL_ICD_FILENAMES=$lib"
            break
        fi
    done
fi
out=${OUT:-$build/gpu-smoke-out}
mkdir -p "$out"
export KBCL_CACHE_DIR=$out/kbcl-cache
rm -rf "$KBCL_CACHE_DIR"
export POCL_CACHE_DIR=${POCL_CACHE_DIR:-$KBCL_CACHE_DIR/pocl}
mkdir -p "$POCL_CACHE_DIR"
kbcl=$build/kbcl
dev=${KBCL_SMOKE_DEVICE:-gpu}
times=$out/times.txt
: > "$times"

declare -a names=() results=()
step() {
    local name=$1
    shift
    echo
    echo "== $name: $*"
    "$@"
    local rc=$?
    names+=("$name")
    results+=("$rc")
}

# wall NAME CMD...: runs CMD, appends "NAME <seconds>" to times.txt
wall() {
    local name=$1 t0 t1 rc
    shift
    t0=$(date +%s.%N)
    "$@"
    rc=$?
    t1=$(date +%s.%N)
    echo "$name $(awk "BEGIN { printf \"%.3f\", $t1 - $t0 }")" | tee -a "$times"
    return $rc
}

# The set-up, digest and transfer lines of a kbcl run (full output in $out/NAME.txt).
run() {
    local name=$1
    shift
    "$kbcl" run "$@" --verify-data --json "$out/$name.json" > "$out/$name.txt" 2>&1
    local rc=$?
    grep -E "verified|digest|replay|device |wall|FAIL|error" "$out/$name.txt"
    return $rc
}

command -v nvidia-smi >/dev/null && nvidia-smi -L
step devices "$kbcl" devices
step parity env KBCL_OPENCL_WANT=$dev KBCL_OPENCL_REQUIRE=1 "$build/tests/test_opencl"
# Cold then warm: the parity test used its own cache folder, so this one is still empty.
rm -rf "$KBCL_CACHE_DIR/programs"
step cold-start run gemm-gpu-cold --bench gemm --device $dev
step warm-start run gemm-gpu-warm --bench gemm --device $dev
step devices-warm "$kbcl" devices
step bench-self "$kbcl" bench-self --quick --device $dev --json "$out/bench-self-quick.json"

if [ "$full" = 1 ]; then
    step bench-self-full "$kbcl" bench-self --device $dev --json "$out/bench-self.json"
    ring="--bench ccl_allreduce --algorithm ring_rsag_allreduce --world-size 256"
    # shellcheck disable=SC2086
    step ring-4M-gpu wall ring-4M-gpu run ring-4M-gpu $ring --size 4M --device $dev
    # shellcheck disable=SC2086
    step ring-4M-ref wall ring-4M-ref run ring-4M-ref $ring --size 4M --device ref
    sed "s/^device: ref/device: $dev/" "$root/configs/sweeps/allreduce.yaml" > "$out/allreduce-gpu.yaml"
    rm -f "$out/sweep-ref.csv" "$out/sweep-gpu.csv"
    step sweep-ref wall sweep-ref "$kbcl" sweep "$root/configs/sweeps/allreduce.yaml" --jobs 8 \
        --out "$out/sweep-ref.csv" --quiet
    step sweep-gpu wall sweep-gpu "$kbcl" sweep "$out/allreduce-gpu.yaml" --jobs 8 \
        --out "$out/sweep-gpu.csv" --quiet
fi

echo
echo "== times (s)"
cat "$times"
echo
echo "== summary"
fail=0
for i in "${!names[@]}"; do
    if [ "${results[$i]}" -eq 0 ]; then
        echo "  ${names[$i]}: ok"
    else
        echo "  ${names[$i]}: FAILED (exit ${results[$i]})"
        fail=1
    fi
done
exit $fail
