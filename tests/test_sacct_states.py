"""Array elements' states from recorded sacct output (tests/sacct/, real Slurm 22.05 text).

A range record (`43_[0-2] CANCELLED`, the task cancelled while pending) must not make a running
element look cancelled: issue 20 saw `hpctrain preempt arr/0` refused with "CANCELLED, not RUNNING"
while point 0 trained. sacct and scontrol are stand-ins at the subprocess boundary that print what
the real ones printed; hpctrain runs its own commands (submitit's sacct command) against them.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from hpctrain.dispatch import sacct, slurm

HERE = Path(__file__).resolve().parent / "sacct"

# fixture -> the state of elements 0, 1, 2 (UNKNOWN: no record anywhere; a run whose own cancel
# event names that job then reads CANCELLED, hpctrain/dispatch/slurm.py)
EXPECT = {
    "issue-20": ["RUNNING", "RUNNING", "CANCELLED"],
    "range-stale-pending": ["PENDING", "PENDING", "UNKNOWN"],
    "range-stale-cancelled": ["CANCELLED", "CANCELLED", "CANCELLED"],
    "range-pending-after-cancel": ["PENDING", "PENDING", "UNKNOWN"],
    "element-without-record": ["RUNNING", "RUNNING", "UNKNOWN"],
    "cancelled-all": ["CANCELLED", "CANCELLED", "UNKNOWN"],
    "requeue-3-requeued0": ["PENDING", "RUNNING", "UNKNOWN"],
    "requeue-4-after": ["RUNNING", "RUNNING", "UNKNOWN"],
    "requeue-5-cancelled-all": ["CANCELLED", "CANCELLED", "UNKNOWN"],
}


def sections(name: str) -> dict[str, str]:
    """`### COMMAND` -> what it printed."""
    parts = re.split(r"^### (.*)\n", (HERE / f"{name}.txt").read_text(), flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_every_fixture_has_an_expectation():
    assert sorted(p.stem for p in HERE.glob("*.txt")) == sorted(EXPECT)


@pytest.fixture
def standins(tmp_path, monkeypatch):
    """`sacct` prints one recorded listing, `scontrol show job -o ID` the recorded JobState."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "sacct").write_text('#!/bin/sh\ncat "$SACCT_TEXT"\n')
    (bin_ / "scontrol").write_text(
        '#!/bin/sh\nf="$SCONTROL_DIR/$4"\n'
        '[ -s "$f" ] || { echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1; }\n'
        'echo "JobId=0 $(cat "$f")"\n'
    )
    for f in bin_.iterdir():
        f.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_}{os.pathsep}{os.environ['PATH']}")
    return tmp_path


@pytest.mark.parametrize("name", sorted(EXPECT))
def test_array_element_states_from_recorded_sacct(name, standins, monkeypatch):
    found = sections(name)
    listings = [text for cmd, text in found.items() if cmd.startswith("sacct")]
    control = standins / "scontrol"
    control.mkdir()
    for cmd, text in found.items():
        if cmd.startswith("scontrol "):
            (control / cmd.split()[1]).write_text(text.strip())
    monkeypatch.setenv("SCONTROL_DIR", str(control))
    array = re.search(r"^(\d+)_", "".join(listings), flags=re.M).group(1)
    assert listings
    for i, listing in enumerate(listings):  # submitit's command and `-D` (every attempt) agree
        text = standins / f"sacct-{i}.txt"
        text.write_text(listing)
        monkeypatch.setenv("SACCT_TEXT", str(text))
        got = [slurm.state(f"{array}_{n}") for n in range(3)]
        assert got == EXPECT[name], f"{name}, {list(found)[i]}"


def test_own_records_win_over_ranges_and_requeued_attempts():
    text = "JobID|State\n7_[0-3%2]|CANCELLED\n7_1|REQUEUED\n7_1|RUNNING\n7_1.batch|RUNNING\n"
    assert sacct.find(text, "7_1") == sacct.Found("RUNNING", "element")
    assert sacct.find(text, "7_3") == sacct.Found("CANCELLED", "range")
    assert sacct.find(text, "7_4") is None
    assert sacct.find(text, "7") is None  # the array's id alone is no element
    assert sacct.find("JobID|State\n9|COMPLETED\n", "9") == sacct.Found("COMPLETED", "job")
    # a range is only a guess: a live state the controller does not confirm is no state
    assert slurm.decide(sacct.Found("PENDING", "range"), lambda: None) == "UNKNOWN"
    assert slurm.decide(sacct.Found("CANCELLED by 0", "range"), lambda: None) == "CANCELLED"
    assert slurm.decide(sacct.Found("CANCELLED", "range"), lambda: "RUNNING") == "RUNNING"
    # a live state in sacct may lag the controller (slurmdbd is told later): the controller wins
    assert slurm.decide(sacct.Found("PENDING", "job"), lambda: "RUNNING") == "RUNNING"
    assert slurm.decide(sacct.Found("RUNNING", "element"), lambda: "COMPLETED") == "COMPLETED"
    assert slurm.decide(sacct.Found("RUNNING", "element"), lambda: None) == "RUNNING"
    assert slurm.decide(sacct.Found("COMPLETED", "job"), lambda: "RUNNING") == "COMPLETED"
