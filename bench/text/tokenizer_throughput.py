#!/usr/bin/env python3
"""Tokenizer throughput: loom-tokenize against Hugging Face `tokenizers` on one thread, on the
same corpus and tokenizer.json, after checking that both give the same ids.

    .venv/bin/python bench/text/tokenizer_throughput.py \
        --loom-tokenize build/release/tools/loom_tokenize/loom-tokenize [--mb 20] [--rounds 5]
        [--tokenizers-dir DIR] [--corpus-dir DIR]

The corpus (about --mb MB in 16 documents) is a third the project's docs/*.md, a third the
multilingual sample of tests/text/make_tokenizers.py and a third seeded random "words" of
letters, digits and punctuation (so that word caches do not see only repeats); --corpus-dir
takes every *.txt file of DIR instead. The tokenizers are DIR/gpt2-style/tokenizer.json and
DIR/llama3-style/tokenizer.json (default DIR: tests/data/tokenizers; real GPT-2 and Llama 3
files can be put in such a directory). Each round runs loom-tokenize (its own encode time,
printed on its stderr, and its wall time with loading the tokenizer and writing the shard),
then tokenizers on one thread (RAYON_NUM_THREADS=1, TOKENIZERS_PARALLELISM=false; special
tokens as text, as loom-tokenize encodes) two ways: encode() of each document, whose ids must
equal loom-tokenize's, and encode_batch_fast() of the documents' lines (its fastest way here;
the ids differ a little, lines being cut apart). Rounds interleave; the table gives medians,
and the ratio is against the faster of tokenizers' two ways.
"""
import os

os.environ["RAYON_NUM_THREADS"] = "1"  # before tokenizers is imported
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import argparse
import datetime
import importlib.util
import pathlib
import platform
import random
import re
import statistics
import struct
import subprocess
import sys
import tempfile
import time

import tokenizers
from tokenizers import Tokenizer

ROOT = pathlib.Path(__file__).resolve().parents[2]
FAMILIES = ["gpt2-style", "llama3-style"]


def multilingual_sample():
    spec = importlib.util.spec_from_file_location("make_tokenizers", ROOT / "tests/text/make_tokenizers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return "\n".join(module.MULTILINGUAL) + "\n"


def random_words(rng, size):
    syllables = ["ka", "to", "ri", "mun", "sel", "ba", "qu", "zor", "ie", "ph", "ü", "ß", "é"]
    out, length = [], 0
    while length < size:
        kind = rng.random()
        if kind < 0.75:
            word = "".join(rng.choice(syllables) for _ in range(rng.randint(1, 5)))
        elif kind < 0.9:
            word = str(rng.randint(0, 10 ** rng.randint(1, 8)))
        else:
            word = rng.choice([",", ".", ";", " -", "(", ")", "!", "?", ":", "'s", "\n"])
        out.append(word)
        length += len(word) + 1
    return " ".join(out)


def corpus(megabytes, directory):
    rng = random.Random(20261204)
    docs = "".join(p.read_text(encoding="utf-8") for p in sorted((ROOT / "docs").glob("*.md")))
    sample = multilingual_sample()
    part = megabytes * 1_000_000 // 3
    text = ((docs * (part // len(docs.encode()) + 1))[:part] +
            (sample * (part // len(sample.encode()) + 1))[:part // 2] +
            random_words(rng, part))
    chunk = len(text) // 16
    paths = []
    for i in range(16):
        path = directory / f"doc{i:02d}.txt"
        path.write_text(text[i * chunk:(i + 1) * chunk], encoding="utf-8")
        paths.append(path)
    return paths


def read_shard(path):
    data = path.read_bytes()
    magic, version, count = struct.unpack_from("<3i", data)
    width = {20240520: 2, 20240801: 4}[magic]
    return list(struct.unpack_from(f"<{count}{'H' if width == 2 else 'I'}", data, 1024))


def run_loom(program, tokenizer_json, paths, output):
    start = time.perf_counter()
    command = [program, "--tokenizer", str(tokenizer_json), "--output", str(output), *map(str, paths)]
    proc = subprocess.run(command, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - start
    encode = float(re.search(r" in ([0-9.]+) s:", proc.stderr).group(1))
    return encode, wall


def run_tokenizers(tokenizer, texts):
    start = time.perf_counter()
    ids = [tokenizer.encode(t, add_special_tokens=False).ids for t in texts]
    return time.perf_counter() - start, ids


def run_tokenizers_lines(tokenizer, lines):
    start = time.perf_counter()
    tokenizer.encode_batch_fast(lines, add_special_tokens=False)
    return time.perf_counter() - start


def isa_line():
    flags, model = "", platform.processor()
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags") and not flags:
            flags = line
        if line.startswith("model name") and model == platform.processor():
            model = line.split(":", 1)[1].strip()
    avx512 = "avx512f present" if " avx512f" in flags else "no avx512f"
    avx2 = "avx2" if " avx2" in flags else "no avx2"
    return f"{model}; {avx2}, {avx512}; {os.cpu_count()} CPUs"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--loom-tokenize",
                        default=str(ROOT / "build/release/tools/loom_tokenize/loom-tokenize"))
    parser.add_argument("--mb", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokenizers-dir", type=pathlib.Path, default=ROOT / "tests/data/tokenizers")
    parser.add_argument("--corpus-dir", type=pathlib.Path)
    args = parser.parse_args()
    print(f"host: {isa_line()}")
    print(f"tokenizers {tokenizers.__version__}, {datetime.date.today()}, "
          f"command: {' '.join([pathlib.Path(sys.argv[0]).name] + sys.argv[1:])}")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        paths = sorted(args.corpus_dir.glob("*.txt")) if args.corpus_dir else corpus(args.mb, tmp)
        texts = [p.read_bytes().decode("utf-8") for p in paths]  # read_text would turn \r\n into \n
        lines = [line for t in texts for line in t.splitlines(keepends=True)]
        megabytes = sum(p.stat().st_size for p in paths) / 1e6
        rows = []
        for family in FAMILIES:
            tokenizer_json = args.tokenizers_dir / family / "tokenizer.json"
            reference = Tokenizer.from_file(str(tokenizer_json))
            reference.encode_special_tokens = True
            # The token loom-tokenize puts before each document (llm.c's choice).
            names = ["<|begin_of_text|>", "<|endoftext|>", "<|end_of_text|>"]
            eot = next(reference.token_to_id(t) for t in names if reference.token_to_id(t) is not None)
            output = tmp / f"{family}.bin"
            loom_encode, loom_wall, hf, hf_lines = [], [], [], []
            for round_ in range(args.rounds):
                encode, wall = run_loom(args.loom_tokenize, tokenizer_json, paths, output)
                seconds, ids = run_tokenizers(reference, texts)
                hf_lines.append(run_tokenizers_lines(reference, lines))
                if round_ == 0:  # validate before timing counts
                    expected = [t for doc in ids for t in [eot, *doc]]
                    got = read_shard(output)
                    if got != expected:
                        raise SystemExit(f"{family}: loom-tokenize's ids differ from tokenizers'")
                    tokens = len(got)
                loom_encode.append(encode)
                loom_wall.append(wall)
                hf.append(seconds)
            le, lw, h, hl = (statistics.median(x) for x in (loom_encode, loom_wall, hf, hf_lines))
            rows.append((family, tokens, le, lw, h, hl))
        print(f"\ncorpus: {megabytes:.1f} MB in {len(paths)} documents; medians of {args.rounds} interleaved rounds\n")
        print("| tokenizer.json | tokens | loom-tokenize encode | loom-tokenize wall (load, write) "
              "| tokenizers encode per document | tokenizers encode_batch_fast of lines | loom / best tokenizers |")
        print("|---|---|---|---|---|---|---|")
        for family, tokens, le, lw, h, hl in rows:
            print(f"| {family} | {tokens:,} | {megabytes / le:.1f} MB/s | {megabytes / lw:.1f} MB/s "
                  f"| {megabytes / h:.2f} MB/s | {megabytes / hl:.2f} MB/s | {min(h, hl) / le:.1f}x |")


if __name__ == "__main__":
    main()
