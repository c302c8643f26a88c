"""The job key: a secret of one job start that only the job's own processes hold.

The batch shell draws it from /dev/urandom and exports it (jobenv.JOB_KEY); srun and torchrun pass
it on in the environment, which another account cannot read (/proc/PID/environ is the owner's). It
is never written to a file or a command line. What it guards (docs/security.md):
- a snapshot's header is signed and its data digest seeded with it (kernel/snapshot.py), so a file
  that another job, account or a stale run left in the store never loads;
- the c10d rendezvous state that torchrun's agents keep in an unauthenticated TCP store is signed
  with it, and state that fails the check is refused before torch unpickles it (launchers/rdzv.py).
A requeued job draws a new key: nothing keyed outlives its job start.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Mapping

from hpctrain.kernel import jobenv

# torchrun's --rdzv-backend whose state this key signs (launchers/rdzv.py)
RDZV_BACKEND = "hpctrain"
BYTES = 32
MAC_BYTES = 32
_HEX = re.compile(r"^[0-9a-f]{64}$")


def key(environ: Mapping[str, str] | None = None) -> bytes | None:
    """This job start's key, or None outside a job (or with a malformed value)."""
    text = (jobenv.get(jobenv.JOB_KEY, environ=environ) or "").strip().lower()
    return bytes.fromhex(text) if _HEX.match(text) else None


def fresh() -> str:
    """A new key as the environment carries it (what the batch shell draws from /dev/urandom)."""
    return secrets.token_hex(BYTES)


def sign(secret: bytes, *parts: bytes) -> bytes:
    """HMAC-SHA256 of the parts, each length-prefixed (no two splits of the same bytes agree)."""
    mac = hmac.new(secret, digestmod=hashlib.sha256)
    for part in parts:
        mac.update(len(part).to_bytes(8, "little"))
        mac.update(part)
    return mac.digest()


def verify(secret: bytes, mac: bytes, *parts: bytes) -> bool:
    return hmac.compare_digest(sign(secret, *parts), mac)


def seed(secret: bytes, purpose: bytes) -> int:
    """A 64-bit seed for a fast non-cryptographic digest (xxh3), derived from the key: such a digest
    catches damage and data of another job start; the signature over it is what an attacker lacks."""
    return int.from_bytes(sign(secret, b"seed", purpose)[:8], "little")
