"""Raw sequential write + fsync (and read back) of N bytes: the baseline for a checkpoint save.

    python benchmarks/baselines/raw_write.py --bytes 50000000 --dir /same/disk --out raw.json

Writes one file in 8 MiB chunks, fsyncs it and its folder, and times that; then times reading it
back (page cache warm, as a load right after a save is). The file is removed afterwards.
"""

import argparse
import json
import os
import time
from pathlib import Path

ap = argparse.ArgumentParser()
ap.add_argument("--bytes", type=int, required=True)
ap.add_argument("--dir", type=Path, required=True)
ap.add_argument("--out", type=Path, required=True)
args = ap.parse_args()

chunk = os.urandom(8 << 20)  # incompressible, made before the clock starts
path = args.dir / "raw-write.bin"
t0 = time.perf_counter()
with open(path, "wb") as f:
    left = args.bytes
    while left > 0:
        n = min(left, len(chunk))
        f.write(chunk[:n])
        left -= n
    f.flush()
    os.fsync(f.fileno())
fd = os.open(args.dir, os.O_RDONLY)
os.fsync(fd)
os.close(fd)
write_s = time.perf_counter() - t0

t0 = time.perf_counter()
with open(path, "rb") as f:
    while f.read(8 << 20):
        pass
read_s = time.perf_counter() - t0
path.unlink()
args.out.write_text(json.dumps({"bytes": args.bytes, "write_s": write_s, "read_s": read_s,
                                "write_Bps": args.bytes / write_s}))
