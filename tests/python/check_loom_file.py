#!/usr/bin/env python3
"""Checks that a safetensors file written by Loom reads back correctly with the reference
`safetensors` library.

Usage: check_loom_file.py FILE EXPECTED_JSON

EXPECTED_JSON describes what FILE must contain:
    {"metadata": {"key": "value", ...},
     "tensors": {"name": {"dtype": "F32", "shape": [2, 3], "values": [...]}, ...}}
where "dtype" is the safetensors dtype string and "values" lists the elements in row-major
order as JSON numbers (floats as the exact double value of the stored element; bf16/f16
values are exact in a double too, so every comparison is exact). NaN is not supported.

Besides the values, it checks Loom's writer conventions: header padded to a multiple of 8
bytes, tensors laid out back to back in ascending name order.

Exits 0 when everything matches, 1 listing every mismatch, 2 on bad usage. Needs safetensors
and numpy (scripts/install-deps.sh puts both in .venv); test_safetensors runs it with
LOOM_PYTHON, or .venv/bin/python when LOOM_PYTHON is unset.
"""

import json
import struct
import sys

import numpy as np
from safetensors import deserialize, safe_open

# numpy has no bfloat16: BF16 elements are decoded from their bits (the high half of an f32).
NUMPY_DTYPES = {
    "F64": "<f8",
    "F32": "<f4",
    "F16": "<f2",
    "I64": "<i8",
    "I32": "<i4",
    "U8": "u1",
}


def decode(dtype, data):
    if dtype == "BF16":
        bits = np.frombuffer(bytes(data), dtype="<u2").astype("<u4") << 16
        return bits.view("<f4").astype(np.float64)
    values = np.frombuffer(bytes(data), dtype=NUMPY_DTYPES[dtype])
    return values.astype(np.float64) if values.dtype.kind == "f" else values


def check(path, expected):
    problems = []

    with safe_open(path, framework="numpy") as f:
        metadata = f.metadata() or {}
    if metadata != expected.get("metadata", {}):
        problems.append(f"metadata {metadata!r} != expected {expected.get('metadata', {})!r}")
    with open(path, "rb") as raw:
        tensors = dict(deserialize(raw.read()))  # the library's own parser and validation
    want = expected["tensors"]
    if set(tensors) != set(want):
        problems.append(f"tensor names {sorted(tensors)} != expected {sorted(want)}")
    for name in sorted(set(tensors) & set(want)):
        spec, got = want[name], tensors[name]
        if got["dtype"] != spec["dtype"]:
            problems.append(f"{name}: dtype {got['dtype']} != expected {spec['dtype']}")
            continue
        if list(got["shape"]) != spec["shape"]:
            problems.append(f"{name}: shape {list(got['shape'])} != expected {spec['shape']}")
        values = decode(got["dtype"], got["data"]).tolist()
        if values != spec["values"]:
            problems.append(f"{name}: values {values} != expected {spec['values']}")

    # Loom's writer conventions, read straight from the header.
    with open(path, "rb") as raw:
        (header_size,) = struct.unpack("<Q", raw.read(8))
        header = json.loads(raw.read(header_size))
    if header_size % 8 != 0:
        problems.append(f"header length {header_size} is not a multiple of 8")
    entries = sorted((k, v) for k, v in header.items() if k != "__metadata__")
    cursor = 0
    for name, entry in entries:
        begin, end = entry["data_offsets"]
        if begin != cursor:
            problems.append(f"{name}: data_offsets {entry['data_offsets']} do not start at "
                            f"{cursor}, the end of the previous tensor in name order")
        cursor = end
    return problems


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    path, expected_path = sys.argv[1], sys.argv[2]
    with open(expected_path) as f:
        expected = json.load(f)
    problems = check(path, expected)
    for problem in problems:
        print(f"check_loom_file: {path}: {problem}", file=sys.stderr)
    if problems:
        return 1
    print(f"check_loom_file: {path}: {len(expected['tensors'])} tensors match")
    return 0


if __name__ == "__main__":
    sys.exit(main())
