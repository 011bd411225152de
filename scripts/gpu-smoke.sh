#!/usr/bin/env bash
# gpu-smoke — checks kbcl's Phase 2 on a Linux machine with an NVIDIA GPU: the OpenCL device
# listing, the ref-vs-GPU parity tests (tests/test_opencl on the GPU) and the replay benchmark.
#
# Usage: scripts/gpu-smoke.sh [BUILD_DIR]
#   BUILD_DIR (default: build) is used as is when it already holds kbcl and tests/test_opencl
#   (a build carried from another machine works: the OpenCL program is embedded in the
#   binaries); otherwise it is configured (Release) and those two targets are built.
# Registers the NVIDIA OpenCL driver through OCL_ICD_FILENAMES when /etc/OpenCL/vendors has no
# NVIDIA entry (minimal images often ship only pocl.icd). Runs every step, then prints a
# summary; the exit status is 0 only if all steps passed.
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}

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
export POCL_CACHE_DIR=${POCL_CACHE_DIR:-$build/pocl-cache}
mkdir -p "$POCL_CACHE_DIR"

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

command -v nvidia-smi >/dev/null && nvidia-smi -L
step devices "$build/kbcl" devices
step parity env KBCL_OPENCL_WANT=gpu KBCL_OPENCL_REQUIRE=1 "$build/tests/test_opencl"
step bench-self "$build/kbcl" bench-self --device gpu

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
