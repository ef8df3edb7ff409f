#!/usr/bin/env python3
"""Writes a Fashion-MNIST subset: the first TRAIN training and TEST test records of SRC's idx
files (gzip) into DST, with the idx headers' counts rewritten; TEST 0 copies the test files whole.
Used by scripts/build_gpu_check.sh (the bundle's data) and scripts/gpu_check.sh --dry_run.

usage: fashion_subset.py SRC DST TRAIN [TEST]
"""
import gzip
import os
import struct
import sys


def cut(src, dst, n):
    with gzip.open(src, "rb") as f:
        magic, count = struct.unpack(">II", f.read(8))
        dims = f.read(4 * ((magic & 0xFF) - 1))  # the sizes of the dimensions after the first
        per = 1
        for i in range(0, len(dims), 4):
            per *= struct.unpack(">I", dims[i:i + 4])[0]
        if n == 0:
            n = count
        if count < n:
            sys.exit(f"{src} holds {count} records, fewer than {n}")
        body = f.read(n * per)
    with gzip.open(dst, "wb", compresslevel=9) as g:
        g.write(struct.pack(">II", magic, n) + dims + body)


def main():
    if len(sys.argv) not in (4, 5):
        sys.exit(__doc__)
    src, dst, train = sys.argv[1], sys.argv[2], int(sys.argv[3])
    test = int(sys.argv[4]) if len(sys.argv) == 5 else 0
    os.makedirs(dst, exist_ok=True)
    for kind, n in (("train", train), ("t10k", test)):
        for part in ("images-idx3-ubyte.gz", "labels-idx1-ubyte.gz"):
            cut(f"{src}/{kind}-{part}", f"{dst}/{kind}-{part}", n)


if __name__ == "__main__":
    main()
