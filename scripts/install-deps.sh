#!/usr/bin/env bash
# Installs the Debian packages kbcl needs to build and test. Idempotent: packages already
# present are skipped, so `make run` / `make test` can call it every time.
# KBCL_INSTALL_CHROMIUM=1 also installs chromium (the optional report_render test).
set -euo pipefail

PKGS=(
  build-essential cmake pkg-config
  libyaml-dev          # configs
  libcjson-dev         # JSON output
  libcmocka-dev        # unit tests
  libboost-context-dev # jump_fcontext for fibers on CPUs other than x86-64 (own switch there)
  ocl-icd-opencl-dev opencl-headers ocl-icd-libopencl1 clinfo
  pocl-opencl-icd      # OpenCL on the CPU (CI and machines without a GPU)
  libopenmpi-dev openmpi-bin # `kbcl sweep` under mpirun (KBCL_MPI)
  clang libclang-rt-dev # fuzz targets (KBCL_FUZZ, scripts/fuzz.sh): libFuzzer, sanitizer runtimes
)
# Headless Chromium for the report_render test: large, so only on request.
if [ "${KBCL_INSTALL_CHROMIUM:-0}" = "1" ]; then
  PKGS+=(chromium)
fi

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if [ "${#missing[@]}" -eq 0 ]; then
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
