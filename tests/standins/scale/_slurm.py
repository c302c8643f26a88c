"""Stand-in sacct, scontrol and scancel for thousands of jobs (tests/test_scale_slurm_calls.py).

Each call appends its argv as one JSON line to $SCALE_LOG, then answers from the ids asked:
a plain job N is COMPLETED (N % 3 == 0), RUNNING (1) or PENDING (2); an array A named in
$SCALE_ARRAYS ("A:COUNT,...") has elements A_0..A_COUNT-1, every $SCALE_LIVE_EVERY-th (default 2)
RUNNING, the others COMPLETED.
`scontrol show job -o` with no id lists every live job of $SCALE_PLAIN ("LO:HI") and the arrays.
"""

import json
import os
import sys

STATES = ("COMPLETED", "RUNNING", "PENDING")


def arrays() -> dict[str, int]:
    spec = os.environ.get("SCALE_ARRAYS", "")
    return {a: int(n) for a, n in (p.split(":") for p in spec.split(",") if p)}


EVERY = int(os.environ.get("SCALE_LIVE_EVERY", "2"))


def element(i: int) -> str:
    return "RUNNING" if i % EVERY == 0 else "COMPLETED"


def sacct(argv: list[str]) -> None:
    ids = argv[argv.index("-j") + 1].split(",") if "-j" in argv else []
    print("JobID|State|NodeList")
    for job in ids:
        if job in arrays():
            for i in range(arrays()[job]):
                print(f"{job}_{i}|{element(i)}|n1")
                print(f"{job}_{i}.batch|{element(i)}|n1")
        else:
            print(f"{job}|{STATES[int(job) % 3]}|n1")


def scontrol(argv: list[str]) -> None:
    asked = argv[3:4]  # show job -o [ID]
    lines = {}
    lo, _, hi = os.environ.get("SCALE_PLAIN", "0:0").partition(":")
    for n in range(int(lo), int(hi)):
        if n % 3:
            lines[str(n)] = f"JobId={n} JobName=x JobState={STATES[n % 3]} Reason=None"
    for a, count in arrays().items():
        for i in range(0, count, EVERY):
            lines[f"{a}_{i}"] = (
                f"JobId={i + 900000} ArrayJobId={a} ArrayTaskId={i} JobState=RUNNING"
            )
    if asked:
        if asked[0] not in lines:
            print("slurm_load_jobs error: Invalid job id specified", file=sys.stderr)
            sys.exit(1)
        print(lines[asked[0]])
        return
    print("\n".join(lines.values()))


def main() -> None:
    tool, argv = sys.argv[1], sys.argv[2:]
    with open(os.environ["SCALE_LOG"], "a") as log:
        log.write(json.dumps([tool, *argv]) + "\n")
    if tool == "sacct":
        sacct(argv)
    elif tool == "scontrol":
        scontrol(argv)


main()
