#!/usr/bin/env bash
# Makes the virtual environment the Python peers run in: PyPI torch 2.15.0 (its CPU kernels
# use MKL and oneDNN), DeepSpeed 0.19.8, numpy and safetensors, at $PEERS_VENV
# (default /tmp/peers-venv). The Linux torch wheel pulls about 3 GB of CUDA wheels even for
# CPU use: about 5.7 GB on disk, several minutes to download. Not for CI.
#
#   bash bench/peers/python/setup.sh
#
# Idempotent: a venv that already imports all three packages is left as it is. DeepSpeed is
# installed without prebuilt ops (DS_BUILD_OPS=0); it compiles the ones a run needs on first
# use. Its NVMe offload (ds_zero.py --variant z3_nvme) also needs Debian's libaio-dev, which
# this installs when run as root and otherwise names.
set -euo pipefail
V=${PEERS_VENV:-/tmp/peers-venv}
if [[ -x $V/bin/python ]] && "$V/bin/python" -c "import torch, deepspeed, safetensors" 2> /dev/null; then
  echo "peers venv ready at $V"
  exit 0
fi
python3 -m venv "$V"
"$V/bin/pip" install -q --disable-pip-version-check --upgrade pip
"$V/bin/pip" install -q --disable-pip-version-check torch==2.15.0 numpy safetensors
DS_BUILD_OPS=0 "$V/bin/pip" install -q --disable-pip-version-check deepspeed==0.19.8
if ! dpkg -s libaio-dev > /dev/null 2>&1; then
  if [[ $(id -u) -eq 0 ]]; then
    apt-get install -y -q libaio-dev > /dev/null ||
      echo "note: apt-get could not install libaio-dev; DeepSpeed's NVMe offload needs it" >&2
  else
    echo "note: DeepSpeed's NVMe offload needs libaio-dev (apt-get install -y libaio-dev)" >&2
  fi
fi
echo "peers venv ready at $V"
