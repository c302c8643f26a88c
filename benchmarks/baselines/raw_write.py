"""Raw I/O of N bytes: the baselines of a checkpoint save (write + fsync) and load (read).

    python benchmarks/baselines/raw_write.py --bytes 50000000 --dir /same/disk

`write_synced` writes one file in 8 MiB chunks of random bytes and fsyncs it and its folder (a
save's discipline: one fsync per file, then the folder); `raw_read` reads files with plain 8 MiB
read() calls, into memory allocated before (as a load's tensors are) or dropped; `drop_cached`
drops a file's pages from the page cache (a cold read). `raw_write` times a write and a read back
(page cache warm) and removes the file.
"""

import argparse
import json
import os
import time
from collections.abc import Iterable
from pathlib import Path

CHUNK = 8 << 20


def write_synced(nbytes: int, folder: Path) -> Path:
    """A new file of `nbytes` random bytes in `folder`, fsynced with the folder."""
    chunk = os.urandom(min(CHUNK, nbytes))  # incompressible (a few ms for 8 MiB)
    path = Path(folder) / f"raw-write-{os.getpid()}.bin"
    with open(path, "wb", buffering=0) as f:
        left = nbytes
        while left > 0:
            n = min(left, CHUNK)
            f.write(chunk[:n] if n < len(chunk) else chunk)
            left -= n
        os.fsync(f.fileno())
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return path


def raw_read(paths: Iterable[Path], into: memoryview | None = None) -> int:
    """Read every file of `paths` once, in order, with 8 MiB read() calls: into `into` one after
    the other (memory allocated before, as a load's tensors are), else each chunk dropped; the
    bytes read."""
    got = 0
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            if into is None:
                while chunk := f.read(CHUNK):
                    got += len(chunk)
                continue
            while n := f.readinto(into[got : got + CHUNK]):
                got += n
    return got


def drop_cached(path: Path) -> None:
    """`path`'s pages out of the page cache (the clean ones: fsync it first)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def raw_write(nbytes: int, folder: Path) -> dict[str, float]:
    """Seconds to write + fsync `nbytes` into `folder` and to read them back (warm)."""
    t0 = time.perf_counter()
    path = write_synced(nbytes, folder)
    write_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    raw_read([path])
    read_s = time.perf_counter() - t0
    path.unlink()
    return {"bytes": nbytes, "write_s": write_s, "read_s": read_s}


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--bytes", type=int, required=True)
    ap.add_argument("--dir", type=Path, required=True)
    args = ap.parse_args()
    print(json.dumps(raw_write(args.bytes, args.dir)))
