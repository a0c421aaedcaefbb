#!/usr/bin/env python3
"""Reads a safetensors file written by `zeroshard export` with the Hugging Face
`safetensors` package and compares every tensor with the fp32 master weights
of the checkpoint it came from, read independently from the rank files as
docs/checkpoint.md describes them (numpy only, no zeroshard code).

usage: check_safetensors.py FILE.safetensors CHECKPOINT_DIR [--dtype fp32|bf16]
Exit 0 when every tensor matches exactly (bf16: the rounded master weights).
"""
import json
import os
import sys

import numpy as np
from safetensors.numpy import load_file

HEADER_BYTES = 64
ALIGN = 64  # param offsets within a unit's segment


def resolve(path):
    if os.path.exists(os.path.join(path, "manifest.json")):
        return path
    with open(os.path.join(path, "latest")) as f:
        return os.path.join(path, f.read().strip())


def master_weights(step_dir):
    with open(os.path.join(step_dir, "manifest.json")) as f:
        manifest = json.load(f)
    units = manifest["model"]["units"]
    shard = [u["shard_numel"] for u in units]
    out = {}
    files = [open(os.path.join(step_dir, f["name"]), "rb") for f in manifest["files"]]
    for ui, unit in enumerate(units):
        segment = np.zeros(shard[ui] * len(files), dtype=np.float32)
        # Offset of (unit, tensor 0 = master) in every rank file.
        offset = HEADER_BYTES + 4 * sum(3 * s for s in shard[:ui])
        for r, f in enumerate(files):
            f.seek(offset)
            segment[r * shard[ui]:(r + 1) * shard[ui]] = np.frombuffer(
                f.read(4 * shard[ui]), dtype="<f4")
        cursor = 0
        for p in unit["params"]:
            cursor = (cursor + ALIGN - 1) // ALIGN * ALIGN
            n = int(np.prod(p["shape"]))
            out[unit["name"] + "." + p["name"]] = segment[cursor:cursor + n].reshape(p["shape"])
            cursor += n
    return out


def to_bf16_bits(x):
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF
    return np.where(nan, ((bits >> 16) | 0x40) & 0xFFFF, rounded).astype(np.uint16)


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    file, ckpt = sys.argv[1], sys.argv[2]
    dtype = sys.argv[4] if len(sys.argv) > 4 and sys.argv[3] == "--dtype" else "fp32"
    expected = master_weights(resolve(ckpt))
    if dtype == "bf16":
        # numpy has no bfloat16: read the raw bytes through the header.
        with open(file, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n))
            data = f.read()
        got = {k: np.frombuffer(data[v["data_offsets"][0]:v["data_offsets"][1]], dtype="<u2")
               for k, v in header.items() if k != "__metadata__"}
        import safetensors  # the package must at least accept the file
        from safetensors import safe_open
        with safe_open(file, framework="numpy") as handle:
            names = set(handle.keys())
    else:
        got = load_file(file)
        names = set(got)
    if names != set(expected):
        print("tensor names differ:", sorted(names ^ set(expected)))
        return 1
    bad = 0
    for name, want in expected.items():
        have = got[name]
        if dtype == "bf16":
            same = np.array_equal(have.reshape(-1), to_bf16_bits(want).reshape(-1))
        else:
            same = have.shape == want.shape and np.array_equal(
                have.view(np.uint32), want.view(np.uint32))
        if not same:
            bad += 1
            print("mismatch:", name)
    total = sum(v.size for v in expected.values())
    print(f"{len(expected)} tensors, {total} values: "
          f"{'all equal to the checkpoint, bit for bit' if bad == 0 else f'{bad} differ'}")
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
