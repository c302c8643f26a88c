"""The service layer: what the commands do, as functions that return records and raise domain
errors (hpctrain.kernel.errors). The CLI (hpctrain/cli/) only parses arguments and prints these
records; everything that writes a file or starts a process is here or below (runs, dispatch).
The doctor's runners live with the checks (hpctrain/checks/doctor/service.py).

  prepare.py       profile + request + run folder + rendered script (render, submit, remote)
  submit.py        submit(), start() (create + queue: also doctor's jobs), resubmit() (resume), wait()
  resume.py        resume(), preempt()
  check_resume.py  check_resume(): interrupted vs uninterrupted, bit for bit
  status.py        summary() and detail() of runs, cancel()
  logs.py          which log files, follow()
  profiles.py      publish()
"""
