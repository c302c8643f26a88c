"""Raw sequential write + fsync (then a read back) of N bytes: the baseline for a checkpoint save.

    python benchmarks/baselines/raw_write.py --bytes 50000000 --dir /same/disk

Writes one file in 8 MiB chunks of random bytes, fsyncs it and its folder, times that; then times
reading it back (page cache warm, as for a load right after a save). The file is removed afterwards.
"""

import argparse
import json
import os
import time
from pathlib import Path

CHUNK = 8 << 20


def raw_write(nbytes: int, folder: Path) -> dict[str, float]:
    chunk = os.urandom(CHUNK)  # incompressible, made before the clock starts
    path = Path(folder) / f"raw-write-{os.getpid()}.bin"
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        left = nbytes
        while left > 0:
            n = min(left, CHUNK)
            f.write(chunk[:n] if n < CHUNK else chunk)
            left -= n
        f.flush()
        os.fsync(f.fileno())
    fd = os.open(folder, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    write_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    with open(path, "rb") as f:
        while f.read(CHUNK):
            pass
    read_s = time.perf_counter() - t0
    path.unlink()
    return {"bytes": nbytes, "write_s": write_s, "read_s": read_s}


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--bytes", type=int, required=True)
    ap.add_argument("--dir", type=Path, required=True)
    args = ap.parse_args()
    print(json.dumps(raw_write(args.bytes, args.dir)))
