#!/usr/bin/env bash
# Installs what Loom needs to build and test on Debian 12 (as root, or through sudo), and a
# Python virtual environment (.venv) with the `safetensors` package for the interoperability
# test and `tokenizers` for the tokenizer's tests. Safe to run again: apt and pip skip what is
# already there.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(g++ cmake ninja-build pkg-config libeigen3-dev nlohmann-json3-dev libcli11-dev libgtest-dev
          libdnnl-dev ocl-icd-opencl-dev libssl-dev libucx-dev openmpi-bin libopenmpi-dev slurm-wlm munge libbenchmark-dev libhwloc-dev liburing-dev libxxhash-dev python3 python3-venv
          clang libclang-rt-14-dev  # clang 14 and libFuzzer: the asan and tsan presets, scripts/fuzz.sh
          lld)  # LLVM's linker, four times as fast as GNU ld on the sanitized test programs
# ocl-icd-opencl-dev: Debian's oneDNN is built with its OpenCL GPU runtime, so its CMake
# package config requires OpenCL's headers; libdnnl-dev only recommends them, and
# --no-install-recommends leaves them out. libopenmpi-dev: with openmpi-bin alone, CMake's
# FindMPI finds mpicc's include path missing and stops the configuration
# (bench/peers/mpi_allreduce_perf is the Open MPI peer of docs/performance_comm.md).
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update
  $sudo apt-get install -y --no-install-recommends "${missing[@]}"
fi

# The Python peers for the safetensors interoperability test (tests/python/) and the tokenizer's
# differential tests (tests/text/; tokenizers pinned: its Unicode tables are what text/'s must
# equal, Note [Unicode tables] in text/unicode.h).
if [ ! -x .venv/bin/python ] ||
   ! .venv/bin/python -c "import safetensors, numpy, tokenizers; assert tokenizers.__version__ == '0.23.3'" 2>/dev/null; then
  /usr/bin/python3 -m venv .venv
  .venv/bin/pip install --quiet --disable-pip-version-check safetensors numpy tokenizers==0.23.3
fi
