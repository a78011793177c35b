#!/usr/bin/env python3
"""loom-tokenize's shards against Hugging Face `tokenizers`: the llm.c header (magic, version,
count), the token width of each format, llm.c's separator before each document (what its
dev/data scripts take: tokenizer.encode('')[0] with the post-processor, Llama 3's
<|begin_of_text|>, else GPT-2's <|endoftext|>), every id equal to tokenizers' (special tokens'
text encoded as text), the default format by vocabulary size, and the inputs and flags it must
refuse.

    loom_tokenize_matches_tokenizers.py LOOM_TOKENIZE TOKENIZERS_DIR

Exits 77 (skipped) when this python has no `tokenizers`, except under CI=true.
"""
import json
import os
import pathlib
import struct
import subprocess
import sys
import tempfile

import tokenizers_or_skip  # noqa: F401,E402  (exits when tokenizers is missing)
from tokenizers import Tokenizer  # noqa: E402

DOCUMENTS = [
    "The first document. It's short, with 12345 digits.\n",
    "Größe, 東京, Ελληνικά 😀👩‍👩‍👧‍👦\r\n\r\n\ttabs and CRLF\r\n",
    "A document that names <|endoftext|> and <|end_of_text|>: text, not control tokens.",
    "",
]
FORMATS = {"llmc-gpt2": (20240520, 1, 2), "llmc-llama3": (20240801, 7, 4)}


def fail(message):
    print(f"FAILED: {message}")
    sys.exit(1)


def run(program, *args):
    return subprocess.run([program, *map(str, args)], capture_output=True, text=True, check=False)


def read_shard(path, fmt):
    data = path.read_bytes()
    if fmt == "raw-u16":
        return list(struct.unpack(f"<{len(data) // 2}H", data))
    magic, version, count = struct.unpack_from("<3i", data)
    want_magic, want_version, width = FORMATS[fmt]
    if (magic, version) != (want_magic, want_version):
        fail(f"{path}: header magic {magic} version {version}, expected {want_magic} {want_version}")
    if any(struct.unpack_from("<253i", data, 12)):
        fail(f"{path}: header ints 3..255 are not zero")
    if len(data) != 1024 + count * width:
        fail(f"{path}: {len(data)} bytes for {count} tokens of {width} bytes")
    return list(struct.unpack_from(f"<{count}{'H' if width == 2 else 'I'}", data, 1024))


def expected_ids(tokenizer_json, docs):
    reference = Tokenizer.from_file(str(tokenizer_json))
    reference.encode_special_tokens = True  # loom-tokenize encodes special tokens' text as text
    first = reference.encode("").ids  # llm.c's Llama 3 script: tokenizer.encode('')[0]
    separator = first[0] if first else reference.token_to_id("<|endoftext|>")  # tiktoken's eot
    return [t for doc in docs for t in [separator, *reference.encode(doc, add_special_tokens=False).ids]]


def expect_refusal(result, *fragments):
    if result.returncode != 1 or not all(f in result.stderr for f in fragments):
        fail(f"expected exit 1 naming {fragments}, got {result.returncode}: {result.stderr!r}")


def main():
    program, tokenizers_dir = sys.argv[1], pathlib.Path(sys.argv[2])
    checks = 0
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        inputs = []
        for i, doc in enumerate(DOCUMENTS):
            path = tmp / f"doc{i}.txt"
            path.write_bytes(doc.encode())
            inputs.append(path)
        for family, fmt in [("gpt2-style", None), ("gpt2-style", "raw-u16"),
                            ("llama3-style", None), ("llama3-style", "llmc-llama3")]:
            tokenizer_json = tokenizers_dir / family / "tokenizer.json"
            out = tmp / f"{family}-{fmt}.bin"
            result = run(program, "--tokenizer", tokenizer_json, "--output", out,
                         *(["--format", fmt] if fmt else []), *inputs)
            if result.returncode != 0:
                fail(f"{family} {fmt}: exit {result.returncode}: {result.stderr}")
            if "tokens/s" not in result.stderr:
                fail(f"no throughput line on stderr: {result.stderr!r}")
            got = read_shard(out, fmt or "llmc-gpt2")  # both vocabularies fit 16 bits
            want = expected_ids(tokenizer_json, DOCUMENTS)
            if got != want:
                fail(f"{family} {fmt}: ids differ\n  loom-tokenize: {got}\n  tokenizers:    {want}")
            checks += 1

        # A vocabulary beyond 16 bits: llmc-llama3 by default, and llmc-gpt2 refused.
        config = json.loads((tokenizers_dir / "gpt2-style" / "tokenizer.json").read_text(encoding="utf-8"))
        first = len(config["model"]["vocab"])
        config["added_tokens"] += [{"id": first + i, "content": f"<|extra_{i}|>", "single_word": False,
                                    "lstrip": False, "rstrip": False, "normalized": False,
                                    "special": True} for i in range(65536 - first + 10)]
        wide = tmp / "wide.json"
        wide.write_text(json.dumps(config, ensure_ascii=False), encoding="utf-8")
        out = tmp / "wide.bin"
        result = run(program, "--tokenizer", wide, "--output", out, *inputs)
        if result.returncode != 0:
            fail(f"wide vocabulary: exit {result.returncode}: {result.stderr}")
        if read_shard(out, "llmc-llama3") != expected_ids(wide, DOCUMENTS):
            fail("wide vocabulary: ids differ")
        expect_refusal(run(program, "--tokenizer", wide, "--output", out, "--format", "llmc-gpt2", *inputs),
                       "[loom-tokenize] --format llmc-gpt2 holds ids below 65536", "65546",
                       "expected --format llmc-llama3")
        checks += 2

        # Inputs that are not regular files, text that is not UTF-8, a bad tokenizer.
        gpt2 = tokenizers_dir / "gpt2-style" / "tokenizer.json"
        fifo = tmp / "fifo"
        os.mkfifo(fifo)
        expect_refusal(run(program, "--tokenizer", gpt2, "--output", out, inputs[0], fifo),
                       f"[loom-tokenize] {fifo}: is not a regular file")
        expect_refusal(run(program, "--tokenizer", gpt2, "--output", out, "/dev/zero"),
                       "[loom-tokenize] /dev/zero: is not a regular file")
        bad = tmp / "latin1.txt"
        bad.write_bytes("caf\u00e9".encode("latin-1"))
        expect_refusal(run(program, "--tokenizer", gpt2, "--output", out, bad),
                       f"[loom-tokenize] {bad}: byte 0xE9 at offset 3 does not start a valid UTF-8 sequence")
        expect_refusal(run(program, "--tokenizer", bad, "--output", out, inputs[0]),
                       f"[tokenizer] {bad}: not valid JSON")
        checks += 4
    print(f"loom-tokenize: {checks} checks passed")


if __name__ == "__main__":
    main()
