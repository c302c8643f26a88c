"""The preflight gate: quick checks on every node of an allocation before training starts.

    node.py   what each node runs (one process per node, in parallel, inside the job's srun)
    gate.py   what the batch shell runs after them: names the failing or lagging nodes, and says
              whether the job continues on all nodes, on the healthy ones, or excludes and requeues
    bisect.py `hpctrain doctor --bisect`: the failing node among N by halving

File names inside a gate's folder (`<run>/preflight/<job_id>-<restart>/`) and the environment
names used here are defined once, below. What is checked and how to tune it: docs/bad-nodes.md.
"""

from __future__ import annotations

from hpctrain.kernel import jobenv, layout

# environment names read by the gate (set by the rendered script / Slurm)
ENV_WANT_GPU = jobenv.WANT_GPU
ENV_GPUS_PER_NODE = jobenv.GPUS_PER_NODE
ENV_SCHEDULER = jobenv.SCHEDULER
ENV_RUN_DIR = jobenv.RUN_DIR

# files in a gate's folder
NODE_REPORT = "node-{node}.json"  # node.py: local checks of node index {node}
NODE_FAILURE = "fail-{node}.txt"  # the node command: node.py could not run (exit code, stderr tail)
NET_REPORT = "net.json"  # node.py, group rank 0: the all-reduce between the nodes
NET_ERROR = "net-error-{node}.json"  # node.py: the all-reduce failed on this node
VERDICT = "verdict.json"  # gate.py: the decision
LATEST = layout.PREFLIGHT_LATEST  # gate.py, in the run folder: the newest verdict (`status`)
FOLDER = layout.PREFLIGHT  # under the run folder
