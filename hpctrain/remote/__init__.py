"""Remote sites over SSH: a profile's `login:` names a login node, and `submit`, `status`, `logs`,
`cancel`, `preempt`, `resume`, `runs` and `doctor` work from this machine (docs/remote.md).

ssh.py     the OpenSSH transport (one control connection per site, strict host keys)
site.py    hpctrain on the site: run its commands there, resolve the site's variables there
wire.py    the frames both ends of the login-node agent (hpctrain/agent/) speak (PROTO)
tunnel.py  this machine's end of the agent: a socket forwarded over the control connection, or ssh exec
code.py    the user's code for the site: the committed tree of the git repo, or --sync DIR
submit.py  submit from here: render and validate here, upload, submit on the site
index.py   this machine's index of remote runs: which host and folder each one lives in
forward.py status/logs/cancel/... of a remote run: the same command, run on the site
"""
