"""The login-node agent: the site's hpctrain kept warm behind a unix socket, so a command from a
laptop costs neither a login shell nor an interpreter start on the site (docs/remote.md). It runs
the CLI itself, so it stands above it; the laptop's end is hpctrain/remote/tunnel.py.

serve.py    `python -m hpctrain.agent.serve start --token T`: the agent and its spares
session.py  one connection, in the spare that took it: the CLI's main run, its output as frames
"""
