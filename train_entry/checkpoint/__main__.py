"""python -m train_entry.checkpoint compare A B  |  verify DIR"""

import json
import sys
from pathlib import Path

from hpctrain.kernel.checkpoint import verify
from train_entry.checkpoint.compare import compare

if len(sys.argv) == 4 and sys.argv[1] == "compare":
    result = compare(Path(sys.argv[2]), Path(sys.argv[3]))
    print(json.dumps(result))
    sys.exit(1 if result["differs"] else 0)
if len(sys.argv) == 3 and sys.argv[1] == "verify":
    _, problem = verify(Path(sys.argv[2]))
    print(problem or "ok")
    sys.exit(1 if problem else 0)
print(
    "usage: python -m train_entry.checkpoint compare CKPT_A CKPT_B | verify CKPT", file=sys.stderr
)
sys.exit(2)
