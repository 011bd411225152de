#!/usr/bin/env bash
# gpu-compare — the figures issue #15 asks for, on one machine: every shipped bench (the
# decoder_layer with the tiny and the Gemma-2 2B model) and the default `make run` job with
# --device ref and --device gpu (warm program cache: one untimed run first), their wall times
# (median of 5 alternating ref / DEVICE pairs; 3 for the jobs of seconds) and data digests;
# the allreduce sweep with device: ref and device: gpu; ring_rsag on 256 ranks at --size 4M
# verified on both.
#
# Usage: scripts/gpu-compare.sh [BUILD_DIR] [DEVICE]     (defaults: build, gpu)
#   BUILD_DIR holds kbcl (a build carried from another machine works). DEVICE is the OpenCL
#   device to compare with ref (gpu; cpu for PoCL). Registers NVIDIA's OpenCL driver through
#   OCL_ICD_FILENAMES when no NVIDIA ICD is installed, as gpu-smoke.sh does.
# DEVD=1 starts a device server for DEVICE first (kbcl devd --detach, stopped at the end), so
# every DEVICE run and sweep point uses it instead of setting the device up itself.
# Prints one line per job: name, ref wall ms, DEVICE wall ms (medians), ratio, digests equal or
# not, and the samples of each. Why 5: on the device machine a 150 ms job's single samples
# spread by +-30 % (frequency, page faults), so a median of 3 can flip a 1.05 ratio to 1.4.
# Exit status 0 when every digest matched.
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
dev=${2:-gpu}
kbcl=$build/kbcl
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if [ "$dev" = gpu ] && ! grep -qsi nvidia /etc/OpenCL/vendors/*.icd && [ -z "${OCL_ICD_FILENAMES:-}" ]; then
    for lib in /usr/local/nvidia/lib64/libnvidia-opencl.so.1 \
               /usr/lib/x86_64-linux-gnu/libnvidia-opencl.so.1; do
        [ -e "$lib" ] && export OCL_ICD_FILENAMES=$lib && break
    done
fi
cd "$root" || exit 2
if [ "${DEVD:-0}" = 1 ]; then
    export KBCL_DEVD_DIR=$tmp/devd
    "$kbcl" devd --device "$dev" --detach || exit 2
    trap '"$kbcl" devd --device "$dev" --stop >/dev/null; rm -rf "$tmp"' EXIT
fi

# field NAME FILE: a top-level number or string of a kbcl JSON report
field() { python3 -c "import json,sys; d=json.load(open(sys.argv[2])); print(d.get(sys.argv[1]))" "$1" "$2"; }

# run_one DEVICE JSON ARGS...: wall ms of the whole process (not the report's field: set-up too)
run_one() {
    local d=$1 j=$2 t0 t1
    shift 2
    t0=$(date +%s%N)
    "$kbcl" run "$@" --device "$d" --verify-data --json "$j" >/dev/null 2>"$tmp/err" || {
        echo "FAILED: kbcl run $* --device $d: $(tail -1 "$tmp/err")" >&2
        echo -1
        return
    }
    t1=$(date +%s%N)
    echo $(((t1 - t0) / 1000000))
}

median() { printf '%s\n' "$@" | sort -n | sed -n "$((($# + 1) / 2))p"; }

status=0
# compare NAME ARGS...: SAMPLES pairs (default 5)
compare() {
    local name=$1
    shift
    run_one "$dev" "$tmp/w.json" "$@" >/dev/null # warm the program cache
    local r=() g=()
    for ((i = 0; i < ${SAMPLES:-5}; i++)); do
        r+=("$(run_one ref "$tmp/r.json" "$@")")
        g+=("$(run_one "$dev" "$tmp/g.json" "$@")")
    done
    local rm gm dr dg
    rm=$(median "${r[@]}")
    gm=$(median "${g[@]}")
    dr=$(field data_digest "$tmp/r.json")
    dg=$(field data_digest "$tmp/g.json")
    [ "$dr" = "$dg" ] || status=1
    printf '%-34s ref %7s ms  %s %7s ms  x%-6s %s  (ref %s; %s %s)\n' "$name" "$rm" "$dev" "$gm" \
        "$(python3 -c "print(round($gm/max($rm,1),2))")" \
        "$([ "$dr" = "$dg" ] && echo "digest $dr" || echo "DIGESTS DIFFER: $dr vs $dg")" \
        "${r[*]}" "$dev" "${g[*]}"
}

echo "device: $("$kbcl" devices 2>/dev/null | grep -i "$dev" | head -1)"
compare "gemm" --bench gemm
compare "va_offset" --bench va_offset
compare "gpt3_qkv" --bench gpt3_qkv
compare "make run (ring_allreduce_tcm 256)" --bench ccl_allreduce --algorithm ring_allreduce_tcm --world-size 256 --n-elem 8
compare "tp_mlp" --bench tp_mlp
compare "tp_attention" --bench tp_attention
compare "decoder_layer tiny" --bench decoder_layer --model configs/models/tiny.yaml
SAMPLES=3 compare "decoder_layer gemma2-2b" --bench decoder_layer --model configs/models/gemma2-2b.yaml
compare "ring_rsag 256 n4096" --bench ccl_allreduce --algorithm ring_rsag_allreduce --world-size 256 --n-elem 4096
SAMPLES=3 compare "ring_rsag 256 --size 4M" --bench ccl_allreduce --algorithm ring_rsag_allreduce --world-size 256 --size 4M

# the sweep with each device (the file's own device: key replaced)
for d in ref "$dev"; do
    sed "s/^device: .*/device: $d/" configs/sweeps/allreduce.yaml >"$tmp/sw-$d.yaml"
    t0=$(date +%s%N)
    "$kbcl" sweep "$tmp/sw-$d.yaml" --jobs "$(nproc)" --out "$tmp/sw-$d.csv" >/dev/null 2>&1 || status=1
    t1=$(date +%s%N)
    echo "sweep allreduce.yaml device: $d  $(((t1 - t0) / 1000000)) ms"
done
exit $status
