#!/usr/bin/env python3
"""The basic blocks of a CUDA kernel's tensor-core loops, from its SASS: how many instructions
the GPU issues per mma.sync (HMMA) on each path through a loop, the static side of a kernel's
speed that the CPU can see (docs/cuda.md, "Attention v3": issue slots).

    python3 scripts/sass_blocks.py OBJECT KERNEL [--cuobjdump PATH]

OBJECT is a compiled .cu.o (sm_90 SASS inside, as the release build makes), KERNEL a substring
of the mangled kernel name (e.g. attention_forward_mmaILi64E). For each loop (a backward
branch) that holds an HMMA, it prints every basic block of the loop: its address, its
instruction count, its HMMA, MUFU (exp2 and the like), LDSM (ldmatrix) and LDGSTS (cp.async)
counts, and the branch that ends it. Summing the blocks of one path (say, the key tile without
the causal mask) gives the instructions a warp issues for that path's HMMAs.

cuobjdump is not in every CUDA toolkit install (not in this machine's); PyPI's
nvidia-cuda-cuobjdump wheel carries it (bin/cuobjdump inside the wheel).
"""

import argparse
import collections
import re
import shutil
import subprocess
import sys

INSTRUCTION = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);")
BRANCH_TARGET = re.compile(r"\bBRA\b.*?0x([0-9a-f]+)")
PREDICATE = re.compile(r"^@!?U?P\w+\s+")
COUNTED = ("HMMA", "MUFU", "LDSM", "LDGSTS")


def opcode(text):
    """The instruction's opcode without its predicate and modifiers: 'HMMA', 'FADD', ..."""
    return PREDICATE.sub("", text).split()[0].split(".")[0]


def kernels(sass):
    """(mangled name, [(address, instruction text)]) for each function in cuobjdump's output."""
    for chunk in re.split(r"\n\s*Function : ", sass)[1:]:
        name, body = chunk.split("\n", 1)
        code = [(int(m.group(1), 16), m.group(2).strip())
                for m in map(INSTRUCTION.match, body.split("\n")) if m]
        yield name.strip(), code


def loops(code):
    """(first, last) indices of each backward branch's range: the loops, innermost or not."""
    index = {address: i for i, (address, _) in enumerate(code)}
    for i, (address, text) in enumerate(code):
        m = BRANCH_TARGET.search(text)
        if m and opcode(text) == "BRA":
            target = int(m.group(1), 16)
            if target <= address and target in index:
                yield index[target], i


def basic_blocks(code):
    """Splits instructions at branch targets and after branches."""
    targets = {int(m.group(1), 16) for _, text in code for m in [BRANCH_TARGET.search(text)] if m}
    block = []
    for address, text in code:
        if address in targets and block:
            yield block
            block = []
        block.append((address, text))
        if opcode(text) in ("BRA", "EXIT", "RET"):
            yield block
            block = []
    if block:
        yield block


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("object")
    parser.add_argument("kernel")
    parser.add_argument("--cuobjdump", default=shutil.which("cuobjdump") or "cuobjdump")
    args = parser.parse_args()
    try:
        sass = subprocess.run([args.cuobjdump, "-sass", args.object], check=True,
                              capture_output=True, text=True).stdout
    except FileNotFoundError:
        sys.exit(f"sass_blocks: no cuobjdump at '{args.cuobjdump}': pass --cuobjdump PATH "
                 "(PyPI's nvidia-cuda-cuobjdump wheel has one)")
    matched = [(n, c) for n, c in kernels(sass) if args.kernel in n]
    if not matched:
        sys.exit(f"sass_blocks: no kernel in {args.object} has '{args.kernel}' in its name")
    for name, code in matched:
        print(f"{name}: {len(code)} instructions")
        for first, last in loops(code):
            body = code[first:last + 1]
            if not any(opcode(t) == "HMMA" for _, t in body):
                continue
            print(f"  loop {body[0][0]:#x}..{body[-1][0]:#x}")
            for block in basic_blocks(body):
                counts = collections.Counter(opcode(t) for _, t in block)
                ends = block[-1][1] if opcode(block[-1][1]) == "BRA" else ""
                tally = " ".join(f"{op} {counts[op]:3d}" for op in COUNTED)
                print(f"    {block[0][0]:#07x} {len(block):5d} instructions  {tally}  {ends}")


if __name__ == "__main__":
    main()
