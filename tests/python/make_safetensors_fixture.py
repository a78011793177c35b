#!/usr/bin/env python3
"""Writes tests/data/python_written.safetensors with the reference `safetensors` library.

The file is checked in; test_safetensors (Safetensors.LoadsPythonWrittenFile) loads it and
compares against the exact values below, so change both together. The output is
deterministic: running this again must reproduce the checked-in bytes.

Needs torch (for bfloat16) and safetensors, e.g.:
    /usr/bin/python3 -m venv --system-site-packages /tmp/stvenv   # sees Debian's torch
    /tmp/stvenv/bin/pip install safetensors
    /tmp/stvenv/bin/python tests/python/make_safetensors_fixture.py [OUTPUT]
"""

import hashlib
import pathlib
import sys

import torch
from safetensors.torch import save_file


def fixture_tensors():
    # Every value is exactly representable in its dtype, so C++ can compare with ==.
    return {
        # f32 [2, 3]
        "f32": torch.tensor([[0.5, -1.25, 3.0], [1024.0, -0.0, 6.103515625e-05]],
                            dtype=torch.float32),
        # f16 bit patterns 0x3C00 0xC000 0x2E66 0x7BFF (0x2E66 is f16(0.1), 0x7BFF the max)
        "f16": torch.tensor([1.0, -2.0, 0.0999755859375, 65504.0], dtype=torch.float16),
        # bf16 [2, 2] bit patterns 0x3F80 0xBF00 0x4049 0x7F80
        "bf16": torch.tensor([[1.0, -0.5], [3.140625, float("inf")]], dtype=torch.bfloat16),
        "i64": torch.tensor([-(2**63), 0, 2**63 - 1], dtype=torch.int64),
        "u8": torch.tensor([0, 1, 127, 128, 255], dtype=torch.uint8),
        # 0-d f32 scalar and a zero-element f32 [0, 4]
        "scalar": torch.tensor(42.0, dtype=torch.float32),
        "empty": torch.zeros((0, 4), dtype=torch.float32),
    }


FIXTURE_METADATA = {"format": "pt", "source": "make_safetensors_fixture.py"}


def main():
    default = pathlib.Path(__file__).resolve().parent.parent / "data" / "python_written.safetensors"
    out = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else default
    save_file(fixture_tensors(), str(out), metadata=FIXTURE_METADATA)
    data = out.read_bytes()
    print(f"wrote {out} ({len(data)} bytes, sha256 {hashlib.sha256(data).hexdigest()})")


if __name__ == "__main__":
    main()
