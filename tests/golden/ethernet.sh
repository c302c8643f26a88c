#!/bin/bash
#SBATCH --job-name=golden
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=4
#SBATCH --cpus-per-task=32
#SBATCH --mem=256G
#SBATCH --time=60
#SBATCH --partition=gpu
#SBATCH --output=/scratch/runs/golden/logs/batch.log
#SBATCH --open-mode=append
#SBATCH --requeue
#SBATCH --signal=B:USR2@120
# Rendered by hpctrain. Not `set -e`: the script must always reach its requeue and state logic.
set -uo pipefail
# checkpoints, logs and exports: yours alone (storage.share none: 077) or group-readable (027)
umask 077

export HPCTRAIN_RUN_DIR=/scratch/runs/golden
export HPCTRAIN_STOP_FILE="$HPCTRAIN_RUN_DIR/STOP"
export HPCTRAIN_NNODES=2
export HPCTRAIN_GPUS_PER_NODE=4
export HPCTRAIN_WANT_GPU=1
export HPCTRAIN_SCHEDULER=slurm
export HPCTRAIN_PROFILE=ethernet
export HPCTRAIN_RUN_NAME=golden
# train_entry writes logs/rank-<R>.log itself; a user's script gets torchrun's per-rank files (--tee)
export HPCTRAIN_TEE=0
# collective timeout and stall heartbeat (profile watchdog:), read by train_entry
export HPCTRAIN_PG_TIMEOUT_S=600
# A secret of this job start, in the environment only (kernel/jobkey.py): it signs the rendezvous
# state and keys the snapshots, so no other account can steer them.
HPCTRAIN_JOB_KEY=$(od -vAn -N32 -tx1 /dev/urandom | tr -d ' \n')
if [ "${#HPCTRAIN_JOB_KEY}" != 64 ]; then echo "hpctrain: error: cannot read 32 bytes from /dev/urandom on $(hostname)"; exit 2; fi
export HPCTRAIN_JOB_KEY
mkdir -p "$HPCTRAIN_RUN_DIR/logs"
export HPCTRAIN_JOB_ID="$SLURM_JOB_ID"
export HPCTRAIN_RESTART_COUNT="${SLURM_RESTART_COUNT:-0}"

# JSON lines without a fork: the UTC clock of every file hpctrain writes (printf's own strftime)
# and a string escaper, so any message (quotes, backslashes, newlines, control characters) is valid.
hpctrain_now() { TZ=UTC0 printf -v hpctrain_t '%(%Y-%m-%dT%H:%M:%SZ)T' -1; }
hpctrain_json() {  # TEXT: hpctrain_j = TEXT as a JSON string literal
  local s=$1 c i out=''
  s=${s//\\/\\\\}; s=${s//\"/\\\"}; s=${s//$'\t'/\\t}; s=${s//$'\n'/\\n}; s=${s//$'\r'/\\r}
  if [[ $s == *[$'\x01'-$'\x1f'$'\x7f']* ]]; then
    for ((i = 0; i < ${#s}; i++)); do
      c=${s:i:1}
      if [[ $c == [$'\x01'-$'\x1f'$'\x7f'] ]]; then printf -v c '\\u%04x' "'$c"; fi
      out+=$c
    done
    s=$out
  fi
  hpctrain_j="\"$s\""
}
hpctrain_jsonl() {  # FILE [KEY VALUE]...: append one object; VALUE is text, or a number for KEY:=
  local file=$1 line='' key
  shift
  while [ "$#" -ge 2 ]; do
    key=$1
    if [[ $key == *:= ]] && [[ $2 =~ ^-?[0-9]+$ ]]; then
      hpctrain_j=$2
    else
      hpctrain_json "$2"
    fi
    key=${key%:=}
    line+="${line:+, }\"$key\": $hpctrain_j"
    shift 2
  done
  if [ "$#" -eq 1 ]; then  # an odd argument (an older template's JSON fragment): kept as text
    hpctrain_json "$1"
    line+="${line:+, }\"extra\": $hpctrain_j"
  fi
  printf '%s\n' "{$line}" >>"$file"
}
hpctrain_event() {  # EVENT [KEY VALUE]...: one line of events.jsonl (KEY:= for a number)
  hpctrain_now
  hpctrain_jsonl "$HPCTRAIN_RUN_DIR/events.jsonl" time "$hpctrain_t" event "$1" job_id "$HPCTRAIN_JOB_ID" \
    restart_count:= "$HPCTRAIN_RESTART_COUNT" "${@:2}"
}
hpctrain_fail() {  # MESSAGE: a setup failure, before any training started
  echo "hpctrain: error: $*" >&2
  hpctrain_event failed reason "$*"
  hpctrain_finish FAILED 1
}
# shellcheck disable=SC2317  # called before a profile value that names a variable (hpctrain/jobs/envrefs.py)
hpctrain_need() {  # WHERE NAME...: a profile value expands $NAME; under set -u an unset one kills bash
  local name
  for name in "${@:2}"; do
    if [ -z "${!name+set}" ]; then
      hpctrain_fail "$1 (profile ethernet) uses \$$name, which is not set on $HOSTNAME; fix: set it before it is used (environment.modules, environment.setup or environment.env), or write \${$name:-} to allow it unset"
    fi
  done
}
hpctrain_finish() {  # STATE EXIT_CODE
  exit "$2"
}

hpctrain_module() {  # ARGS...: one `module` command; a failure stops the job, naming it
  if ! type module >/dev/null 2>&1; then
    hpctrain_fail "environment.modules: there is no module command in the batch shell; load the site's module init in environment.setup (e.g. source /etc/profile.d/lmod.sh)"
  fi
  set +u  # module scripts read unset variables
  module "$@"
  local rc=$?
  set -u
  if [ "$rc" -ne 0 ]; then hpctrain_fail "module $* failed (exit $rc): check environment.modules of profile ethernet"; fi
}
hpctrain_module load cuda/12.4
eval "$(conda shell.bash hook)" || hpctrain_fail "conda is not available to activate the profile's environment"
conda activate train || hpctrain_fail "cannot activate the conda environment"
export GLOO_SOCKET_IFNAME="eth0"
export NCCL_IB_DISABLE="1"
export NCCL_NSOCKS_PERTHREAD="4"
export NCCL_SOCKET_IFNAME="=eth0"
export NCCL_SOCKET_NTHREADS="4"
export OMP_NUM_THREADS="8"
export TORCH_NCCL_ASYNC_ERROR_HANDLING="3"
export TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC="600"
export HPCTRAIN_PYTHON=/opt/hpctrain/bin/python

# The per-node command: each srun task (or simulated node) runs it in its own bash, with the entry's
# argv as "$@": one task per node (launcher torchrun) or one per GPU (launcher srun). Everything
# node-specific is read here, on the node, inside the container if there is one.
# shellcheck disable=SC2016
hpctrain_node_cmd='
node=${HPCTRAIN_NODEID:-${SLURM_NODEID:-0}}
export HPCTRAIN_NODEID=$node
exec >>"$HPCTRAIN_RUN_DIR/logs/node-$node.log" 2>&1
ifnames=${GLOO_SOCKET_IFNAME:-}
for ifname in ${ifnames//,/ }; do
  if [ ! -e "/sys/class/net/$ifname" ]; then
    echo "hpctrain: error: network interface $ifname (GLOO_SOCKET_IFNAME, from the profile) does not exist on $(hostname); it has: $(ls /sys/class/net | tr "\n" " ")"
    exit 2
  fi
done
# GPUs: NVIDIA (nvidia-smi) or AMD (rocm-smi or /dev/kfd); torch calls both "cuda" (RCCL is its nccl)
device=cpu
gpu=none
if [ "$HPCTRAIN_WANT_GPU" = 1 ]; then
  if nvidia-smi -L >/dev/null 2>&1; then device=cuda; gpu=nvidia
  elif rocm-smi >/dev/null 2>&1 || [ -e /dev/kfd ]; then device=cuda; gpu=amd
  fi
fi
if [ "$gpu" = amd ]; then
  # One visibility variable on ROCm: ROCR_VISIBLE_DEVICES (the runtime level); HIP would index a
  # second list into the first one.
  if [ -z "${ROCR_VISIBLE_DEVICES:-}" ] && [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
    export ROCR_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES
  fi
  unset CUDA_VISIBLE_DEVICES HIP_VISIBLE_DEVICES
fi
export HPCTRAIN_DEVICE=$device
# What unchanged launcher-aware scripts expect: Accelerate trains on CPU only when told to (else
# each process runs alone, world 1). torchrun itself sets RANK, LOCAL_WORLD_SIZE, MASTER_ADDR/PORT.
if [ "$device" = cpu ] && [ -z "${ACCELERATE_USE_CPU+set}" ]; then export ACCELERATE_USE_CPU=1; fi  # a profile value wins
is_host=0
if [ "$node" = 0 ]; then is_host=1; fi
# In-job restarts: a fresh store for every rendezvous round. The shared one (torch >= 2.4) keeps
# the keys of the round before, so restarted gloo ranks would read the addresses of dead peers.
if [ -z "${TORCH_DISABLE_SHARE_RDZV_TCP_STORE+set}" ]; then export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1; fi  # a profile value wins
echo "hpctrain: node $node on $(hostname) device=$device gpu=$gpu CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset} restart=$HPCTRAIN_RESTART_COUNT endpoint=$HPCTRAIN_RDZV_ENDPOINT"
tee=()
if [ "$HPCTRAIN_TEE" = 1 ]; then tee=(--tee=3 --log-dir="$HPCTRAIN_RUN_DIR/logs/torchrun/node-$node"); fi
exec "$HPCTRAIN_PYTHON" -m hpctrain.launchers.rdzv --nnodes="$HPCTRAIN_NNODES" --nproc-per-node="$HPCTRAIN_GPUS_PER_NODE" --rdzv-backend=hpctrain --rdzv-endpoint="$HPCTRAIN_RDZV_ENDPOINT" --rdzv-id="$HPCTRAIN_JOB_ID" --rdzv-conf="is_host=$is_host" --max-restarts=2 --monitor-interval=0.5 "${tee[@]}" "$@"
'

hpctrain_wait() {  # PID...: wait for all, through trapped signals; hpctrain_rc = first failure
  local pid rc fatal=0
  local saved=0
  local -a left=("$@")
  hpctrain_rc=0
  while [ "${#left[@]}" -gt 0 ]; do
    if [ "$fatal" = 0 ] && [ -e "$HPCTRAIN_RUN_DIR/FATAL" ]; then
      fatal=1  # an error that repeats: stop the step now, before a restart trains into it again
      kill -TERM "$@" 2>/dev/null
    fi
    # A rank left 75, the stop's checkpoint committed (kernel/fatal.left_preempted): each node's
    # torchrun then leaves by itself before it would start its workers again, and before any store
    # call that could wait 60 s on a node already gone (launchers/rdzv.py Guarded; ending the step
    # a second after the save raced that wait: 68-71 s from the save to the requeue). 3 s later, a
    # TERM for one still there (a worker that did not leave): torchrun then stops its workers.
    if [ "$saved" -gt 0 ] && [ "$saved" -lt 4 ]; then
      saved=$((saved + 1))
      if [ "$saved" = 4 ]; then kill -TERM "$@" 2>/dev/null; fi
    fi
    if [ "$saved" = 0 ] && [ "$preempted" = 1 ] && [ -e "$HPCTRAIN_RUN_DIR/PREEMPTED" ]; then
      saved=1
      echo "hpctrain: a rank left 75 after the stop's checkpoint: ending the step (no in-job restart)"
    fi
    local -a still=()
    for pid in "${left[@]}"; do
      if kill -0 "$pid" 2>/dev/null; then still+=("$pid"); continue; fi
      wait "$pid"; rc=$?
      if [ "$rc" -ne 0 ] && [ "$hpctrain_rc" -eq 0 ]; then
        hpctrain_rc=$rc
      fi
    done
    left=("${still[@]}")
    if [ "${#left[@]}" -gt 0 ]; then sleep 1 & wait "$!"; fi  # a trapped signal ends this wait at once
  done
}

# The preemption relay: torchrun does not forward USR1/USR2, so the signal becomes the STOP file that
# every rank polls at each step boundary. TERM (scancel, cancel) stops without a requeue.
preempted=0
cancelled=0
timed_out=0
hpctrain_node_pids=()
# shellcheck disable=SC2317  # invoked by the traps below
hpctrain_on_signal() {  # SIGNAL
  hpctrain_event signal signal "$1"
  touch "$HPCTRAIN_STOP_FILE"
  if [ "$1" = TERM ]; then
    cancelled=1
  else
    preempted=1
  fi
}
trap 'hpctrain_on_signal USR2' USR2
trap 'hpctrain_on_signal TERM' TERM

if [ "${SLURM_NNODES:-}" != "$HPCTRAIN_NNODES" ]; then
  hpctrain_fail "Slurm gave ${SLURM_NNODES:-no} nodes, the run needs $HPCTRAIN_NNODES"
fi
# A rank's stall watchdog (train_entry) wrote STALLED after every rank dumped its stack: keep the
# marker with the stacks and requeue, as after a preemption.
hpctrain_stalled() {
  [ -e "$HPCTRAIN_RUN_DIR/STALLED" ] || return 1
  mkdir -p "$HPCTRAIN_RUN_DIR/stacks/$HPCTRAIN_JOB_ID-$HPCTRAIN_RESTART_COUNT"
  mv -f "$HPCTRAIN_RUN_DIR/STALLED" "$HPCTRAIN_RUN_DIR/stacks/$HPCTRAIN_JOB_ID-$HPCTRAIN_RESTART_COUNT/STALLED"
  return 0
}
hpctrain_rc=0  # a launch's first failure (hpctrain_wait); 0 when the gate stops the job before any
hpctrain_nodes=  # the nodes to train on, when the gate dropped some (comma-separated)
# A node list goes to a command by a file, never as one argument (Linux refuses an argument over
# 128 KiB: ~12,000 names); scontrol reads SLURM_JOB_NODELIST itself.
hpctrain_list_file() {  # FILE LIST [FLAG]: one name a line (srun --nodelist=FILE), or FLAG and
  mkdir -p "${1%/*}"  # LIST as two lines, what Python's argparse reads from @FILE
  if [ -n "${3:-}" ]; then printf '%s\n' "$3" "$2" >"$1"; else tr ',' '\n' <<<"$2" >"$1"; fi
}
hpctrain_entry=(-m train_entry --run-dir /scratch/runs/golden --strategy ddp --max-steps 10)

hpctrain_fatal=0  # an error that repeats (the FATAL file): the job fails with it
hpctrain_cause=  # its line (empty when the rank could not write it: then its own log says)

while :; do
  rm -f "$HPCTRAIN_STOP_FILE" "$HPCTRAIN_RUN_DIR/PREEMPTED" "$HPCTRAIN_RUN_DIR/FATAL"
  hpctrain_now
  hpctrain_jsonl "$HPCTRAIN_RUN_DIR/restarts.jsonl" time "$hpctrain_t" job_id "$HPCTRAIN_JOB_ID" \
    restart_count:= "$HPCTRAIN_RESTART_COUNT" host "$HOSTNAME"
  # where this start's lines begin in the appended batch.log (`status` reads srun's task lines after it)
  echo "hpctrain: start of job $HPCTRAIN_JOB_ID restart $HPCTRAIN_RESTART_COUNT on $HOSTNAME"

  # Rendezvous: the head is the first node; its address from getent (never `hostname -i`, which may
  # say 127.0.1.1), from its name with the site's suffix, or from one of its interfaces (this batch
  # shell runs on it); the port from the job id inside the profile's range, never 29500 unless the
  # profile names it, never in the ephemeral range, and free on the head.
  hpctrain_head=${hpctrain_nodes%%,*}  # no argument grows with nodes: scontrol reads SLURM_JOB_NODELIST
  if [ -z "$hpctrain_head" ]; then hpctrain_head=$(scontrol show hostnames | head -n 1); fi
  hpctrain_head_addr=$(getent ahostsv4 "$hpctrain_head" | awk 'NR == 1 {print $1}')
  if [ -z "$hpctrain_head_addr" ]; then
    hpctrain_fail "cannot resolve the head node '$hpctrain_head' to an IPv4 address (getent ahostsv4)"
  fi
  read -r hpctrain_eph_lo hpctrain_eph_hi </proc/sys/net/ipv4/ip_local_port_range
  hpctrain_port_min=20000
  hpctrain_span=$(( 32000 - hpctrain_port_min ))
  # The free-port probe runs here, outside any container: the node Python, else the system's. Like
  # torch's store it sets SO_REUSEADDR: a port held only by TIME_WAIT connections is free.
  hpctrain_probe=$HPCTRAIN_PYTHON
  command -v "$hpctrain_probe" >/dev/null 2>&1 || hpctrain_probe=python3
  hpctrain_port=
  # A busy port is skipped by a stride, not by one: the next job id's port is not the next try.
  hpctrain_stride=$(( hpctrain_span / 64 + 1 ))
  for ((i = 0; i < hpctrain_span && i < 64; i++)); do
    p=$(( hpctrain_port_min + (HPCTRAIN_JOB_ID + i * hpctrain_stride) % hpctrain_span ))
    if [ "$p" -eq 29500 ] || { [ "$p" -ge "$hpctrain_eph_lo" ] && [ "$p" -le "$hpctrain_eph_hi" ]; }; then
      continue
    fi
    if ! command -v "$hpctrain_probe" >/dev/null 2>&1 || "$hpctrain_probe" -c 'import socket as s, sys; k = s.socket(); k.setsockopt(s.SOL_SOCKET, s.SO_REUSEADDR, 1); k.bind(("", int(sys.argv[1])))' "$p" 2>/dev/null; then
      hpctrain_port=$p
      break
    fi
  done
  if [ -z "$hpctrain_port" ]; then
    hpctrain_fail "no free rendezvous port in 20000-32000 outside 29500 and the ephemeral range $hpctrain_eph_lo-$hpctrain_eph_hi: set rendezvous.port_min/port_max in the profile"
  fi
  export HPCTRAIN_RDZV_ENDPOINT="$hpctrain_head_addr:$hpctrain_port"

  unset HPCTRAIN_NODEID
  hpctrain_launch=(srun --nodes="$HPCTRAIN_NNODES" --ntasks-per-node=1 --kill-on-bad-exit=1)
  if [ -n "$hpctrain_nodes" ]; then  # the gate's healthy nodes, by a file (srun reads a path's names)
    hpctrain_list_file "$HPCTRAIN_RUN_DIR/preflight/$HPCTRAIN_JOB_ID-$HPCTRAIN_RESTART_COUNT/training.txt" "$hpctrain_nodes"
    hpctrain_launch+=(--nodelist="$HPCTRAIN_RUN_DIR/preflight/$HPCTRAIN_JOB_ID-$HPCTRAIN_RESTART_COUNT/training.txt")
  fi
  hpctrain_launch+=(--cpus-per-task=32)
  "${hpctrain_launch[@]}" bash -c "$hpctrain_node_cmd" hpctrain-node "${hpctrain_entry[@]}" &
  hpctrain_node_pids=("$!")
  hpctrain_wait "${hpctrain_node_pids[@]}"  # torchrun restarts its workers itself (--max-restarts)
  hpctrain_node_pids=()

  if [ -e "$HPCTRAIN_RUN_DIR/FATAL" ]; then  # an error that repeats: neither restarted nor requeued
    hpctrain_fatal=1
    read -r hpctrain_cause <"$HPCTRAIN_RUN_DIR/FATAL"
    break
  fi
  hpctrain_why=preempted
  if hpctrain_stalled; then preempted=1; hpctrain_why=stall; fi
  # A stop request the entry did not act on: it trained to its end and every node left with 0 (and
  # no rank left 75 under launcher srun). The run is finished: no requeue, it ends COMPLETED.
  if [ "$preempted" = 1 ] && [ "$hpctrain_why" = preempted ] && [ "$hpctrain_rc" -eq 0 ] &&
     [ ! -e "$HPCTRAIN_RUN_DIR/PREEMPTED" ]; then
    echo "hpctrain: the entry exited 0 after the stop request: the run is complete, no requeue"
    preempted=0
  fi
  if [ "$preempted" = 1 ] && [ "$cancelled" = 0 ] && [ "$timed_out" = 0 ]; then
    if true && [ "$HPCTRAIN_RESTART_COUNT" -lt 10 ]; then
      hpctrain_event requeue reason "$hpctrain_why"
      # From the batch shell, outside any container (scontrol is often missing inside one).
      scontrol requeue "$SLURM_JOB_ID" || hpctrain_fail "scontrol requeue $SLURM_JOB_ID failed"
      exit 0
    fi
  fi
  break
done

if [ "$hpctrain_fatal" = 1 ] && [ "$cancelled" = 0 ] && [ "$timed_out" = 0 ]; then
  if [ -n "$hpctrain_cause" ]; then
    echo "hpctrain: the run failed with an error that repeats (first in \`hpctrain status\`): not restarted" >&2
    hpctrain_event failed exit_code:= "$(( hpctrain_rc ? hpctrain_rc : 1 ))" reason "$hpctrain_cause"
  else
    hpctrain_event failed exit_code:= "$(( hpctrain_rc ? hpctrain_rc : 1 ))"
  fi
  hpctrain_finish FAILED "$(( hpctrain_rc ? hpctrain_rc : 1 ))"
elif [ "$hpctrain_rc" -eq 0 ] && [ "$preempted" = 0 ] && [ "$cancelled" = 0 ] && [ "$timed_out" = 0 ]; then
  hpctrain_event "done"
  hpctrain_finish COMPLETED 0
elif [ "$timed_out" = 1 ]; then
  hpctrain_finish TIMEOUT 124
elif [ "$cancelled" = 1 ]; then
  hpctrain_finish CANCELLED "$(( hpctrain_rc ? hpctrain_rc : 143 ))"
elif [ "$preempted" = 1 ]; then
  hpctrain_finish PREEMPTED "$(( hpctrain_rc ? hpctrain_rc : 75 ))"
fi
echo "hpctrain: the run failed (exit code $hpctrain_rc); the node logs say why: $HPCTRAIN_RUN_DIR/logs/node-*.log" >&2
hpctrain_event failed exit_code:= "$hpctrain_rc"
hpctrain_finish FAILED "$hpctrain_rc"
