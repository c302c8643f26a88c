#!/usr/bin/env bash
# A real three-node Slurm cluster on this one machine, for the live tests.
#
#   sudo bash tests/slurm/cluster.sh up       # install what is missing, start, wait until n1-n3 are idle
#   sudo bash tests/slurm/cluster.sh status   # each daemon we started, then sinfo
#   sudo bash tests/slurm/cluster.sh down     # cancel jobs, stop exactly the daemons we started
#   bash tests/slurm/cluster.sh check-link    # may `up` point /etc/slurm/slurm.conf here? (exit 2: no)
#
# Debian 12's slurm-wlm 22.05 + munge + slurmdbd on MariaDB (so sacct is real). Three slurmd "nodes",
# n1 (127.0.0.2), n2 (127.0.0.3) and n3 (127.0.0.4), each in its own UTS + mount namespace with its
# own hostname and a private /etc/hosts, so torchrun's c10d rendezvous sees hosts that resolve.
# Loopback only. Most tests ask for two nodes: n3 has a higher Weight, so Slurm gives n1 and n2
# first and n3 only to a job that needs it (a hot spare: --nodes 2 --spare-nodes 1).
# Facts behind every choice: ../shared/notes/slurm-on-one-machine.md.
#
# Jobs run as root on this test cluster: SlurmUser is root and the tests submit as root. That is a
# test-cluster shortcut, not a recommendation; nothing in hpctrain depends on it.
#
# All state (config, spool, logs, database, pid files) lives in $HPCTRAIN_SLURM_STATE (default
# tests/slurm/.state, gitignored). Clients find the config through /etc/slurm/slurm.conf, a symlink
# into that folder that `up` creates only when no other slurm.conf is there and `down` removes. `up`
# re-points an existing link only when it is stale or its cluster is not running: a link to another
# state folder whose cluster runs is refused (exit 2; export HPCTRAIN_SLURM_STATE=<that folder>).
#
# `up --optional` (used by `make test`): outside CI and without root, say how to run the live tests
# and exit 0 so the rest of the suite runs; the slurm-marked tests then skip. In CI it never skips.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
STATE=${HPCTRAIN_SLURM_STATE:-$HERE/.state}
STATE=$(realpath -m -- "$STATE")   # absolute: the link in /etc/slurm must not be relative
ETC=$STATE/etc
RUN=$STATE/run
LOG=$STATE/log
CONF=$ETC/slurm.conf
SYS_CONF=${HPCTRAIN_SLURM_SYS_CONF:-/etc/slurm/slurm.conf}   # the override: tests of check-link only
CLUSTER=hpctrain
CTLD_PORT=6817
DBD_PORT=6819
DB_PORT=${HPCTRAIN_SLURM_DB_PORT:-13306}
DB_PASS=hpctrain-test        # a local, loopback-only test database
NODES=(n1 n2 n3)
declare -A ADDR=([n1]=127.0.0.2 [n2]=127.0.0.3 [n3]=127.0.0.4)
declare -A PORT=([n1]=6821 [n2]=6822 [n3]=6823)
# Slurm allocates the lowest Weight first: the two-node tests keep n1 and n2, n3 is the spare
declare -A WEIGHT=([n1]=1 [n2]=1 [n3]=10)
GPUS_PER_NODE=2              # must match site_configs/loopback.yaml slurm.gpus_per_node
PACKAGES=(slurmctld slurmd slurm-client slurmdbd munge mariadb-server)

export SLURM_CONF=$CONF
T0=$(date +%s.%N)

say() { printf 'cluster: %s\n' "$*"; }
die() { printf 'cluster: error: %s\n' "$*" >&2; exit 1; }
elapsed() { awk -v a="$T0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

# ---------- pid files: the only way we find (and stop) our daemons ----------

# alive PIDFILE COMM: the pid in PIDFILE is running and its command name is COMM (guards pid reuse).
alive() {
    local pid
    [[ -s $1 ]] || return 1
    pid=$(tr -dc '0-9' <"$1")
    [[ -n $pid && -r /proc/$pid/comm ]] || return 1
    [[ $(cat "/proc/$pid/comm" 2>/dev/null) == "$2" ]]
}

# stop NAME PIDFILE COMM: TERM our daemon, wait until it is gone (KILL after 20 s).
stop() {
    local name=$1 file=$2 comm=$3 pid i
    if ! alive "$file" "$comm"; then
        rm -f "$file"
        return 0
    fi
    pid=$(tr -dc '0-9' <"$file")
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 200; i++)); do
        [[ -d /proc/$pid && $(cat "/proc/$pid/comm" 2>/dev/null) == "$comm" ]] || break
        sleep 0.1
    done
    if [[ -d /proc/$pid && $(cat "/proc/$pid/comm" 2>/dev/null) == "$comm" ]]; then
        say "$name (pid $pid) ignored TERM for 20 s: KILL"
        kill -KILL "$pid" 2>/dev/null || true
        sleep 0.5
    fi
    rm -f "$file"
    say "stopped $name (pid $pid)"
}

# wait_for SECONDS CMD...: poll CMD every 0.2 s until it succeeds.
wait_for() {
    local secs=$1 i
    shift
    for ((i = 0; i < secs * 5; i++)); do
        "$@" >/dev/null 2>&1 && return 0
        sleep 0.2
    done
    return 1
}

# ---------- the one /etc/slurm/slurm.conf ----------

# other_state: the state folder $SYS_CONF points into when it is one of ours (TARGET = STATE/etc/
# slurm.conf and written by this script), else empty.
other_state() {
    local target
    target=$(readlink -- "$SYS_CONF") || return 0
    [[ $target == /*/etc/slurm.conf && -f $target ]] || return 0
    head -1 -- "$target" | grep -q '^# Written by tests/slurm/cluster.sh' || return 0
    dirname -- "$(dirname -- "$target")"
}

# cluster_running STATE_DIR: a daemon of the cluster whose state is STATE_DIR is alive.
cluster_running() {
    local f
    for f in "$1"/run/slurmctld.pid "$1"/run/slurmdbd.pid; do
        alive "$f" "$(basename "$f" .pid)" && return 0
    done
    for f in "$1"/run/slurmd-*.pid; do alive "$f" slurmd && return 0; done
    return 1
}

# check_link: may `up` point $SYS_CONF at this state folder? Yes when there is no link, when it
# already points here, when its target is gone (stale) or is a cluster of ours that is not running.
# No (exit 2, one message, nothing changed) when it points at another state folder whose cluster
# still runs, or at a config this script did not write.
check_link() {
    local target other
    [[ -L $SYS_CONF ]] || return 0
    target=$(readlink -- "$SYS_CONF")
    [[ $target == "$CONF" || $target -ef $CONF || ! -e $target ]] && return 0
    other=$(other_state)
    if [[ -z $other ]]; then
        printf 'cluster: error: %s points to %s, which this script did not write; fix: move that link away, or run on a machine without a Slurm config\n' \
            "$SYS_CONF" "$target" >&2
        exit 2
    fi
    if cluster_running "$other"; then
        printf 'cluster: error: %s points to %s, whose test cluster is running; fix: export HPCTRAIN_SLURM_STATE=%s to use that cluster (or stop it: HPCTRAIN_SLURM_STATE=%s %s down)\n' \
            "$SYS_CONF" "$other" "$other" "$other" "$0" >&2
        exit 2
    fi
}

# ---------- install ----------

install_packages() {
    local missing=() p
    for p in "${PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    ((${#missing[@]} == 0)) && return 0
    say "installing ${missing[*]}"
    # Keep the packages' init scripts from starting system-wide daemons we would not own.
    local guard=""
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod 755 /usr/sbin/policy-rc.d
        guard=1
    fi
    local rc=0
    {
        DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
                -o Dpkg::Use-Pty=0 "${missing[@]}"
    } >"$STATE/apt.log" 2>&1 || rc=$?
    [[ -n $guard ]] && rm -f /usr/sbin/policy-rc.d
    ((rc == 0)) || { tail -20 "$STATE/apt.log" >&2; die "apt-get install failed (log: $STATE/apt.log)"; }
    say "installed in $(elapsed) s"
}

# ---------- config ----------

write_config() {
    local ctl_host mem n
    ctl_host=$(hostname -s)
    mem=2000   # MB per node; the nodes share one machine, so this is nominal (config_overrides)
    mkdir -p "$ETC" "$RUN" "$LOG" "$STATE/ctld" "$STATE/dev"
    for n in "${NODES[@]}"; do mkdir -p "$STATE/spool/$n"; done

    # Fake GPUs: character devices gres can point at (same numbers as /dev/null).
    local i
    for ((i = 0; i < GPUS_PER_NODE; i++)); do
        [[ -c $STATE/dev/nvidia$i ]] || mknod "$STATE/dev/nvidia$i" c 1 3
    done

    cat >"$CONF.new" <<EOF
# Written by tests/slurm/cluster.sh: a three-node test cluster on loopback. Do not edit; edit the script.
ClusterName=$CLUSTER
SlurmctldHost=$ctl_host(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire=5 (its minimum): a requeued job may start again after ~6 s instead of 121 s (a site keeps the
# default; issue 34 measures hpctrain's own part of "running again within 10 s").
AuthInfo=cred_expire=5
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool/%n
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd-%n.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0,sched_interval=2,bf_interval=1
JobRequeue=1
KillWait=5
# Finished jobs stay visible to scontrol for 10 minutes.
MinJobAge=600
InactiveLimit=0
GresTypes=gpu
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$DBD_PORT
AccountingStorageTRES=gres/gpu
JobCompType=jobcomp/none
EOF
    for n in "${NODES[@]}"; do
        echo "NodeName=$n NodeHostname=$n NodeAddr=${ADDR[$n]} Port=${PORT[$n]} CPUs=2 Boards=1" \
            "SocketsPerBoard=1 CoresPerSocket=2 ThreadsPerCore=1 RealMemory=$mem" \
            "Gres=gpu:$GPUS_PER_NODE Weight=${WEIGHT[$n]} State=UNKNOWN" >>"$CONF.new"
    done
    # OverSubscribe: two small jobs may share the nodes' cores at once (GPUs are never shared).
    echo "PartitionName=debug Nodes=$(IFS=,; echo "${NODES[*]}") Default=YES MaxTime=30 State=UP" \
        "OverSubscribe=FORCE:2" >>"$CONF.new"
    if [[ -f $CONF ]] && ! cmp -s "$CONF.new" "$CONF"; then CONF_CHANGED=1; fi
    mv "$CONF.new" "$CONF"

    {
        echo "# Written by tests/slurm/cluster.sh"
        for n in "${NODES[@]}"; do
            echo "NodeName=$n Name=gpu File=$STATE/dev/nvidia[0-$((GPUS_PER_NODE - 1))]"
        done
    } >"$ETC/gres.conf"

    umask 077
    cat >"$ETC/slurmdbd.conf" <<EOF
# Written by tests/slurm/cluster.sh (mode 600: it holds the database password)
AuthType=auth/munge
DbdAddr=127.0.0.1
DbdHost=$ctl_host
DbdPort=$DBD_PORT
SlurmUser=root
PidFile=$RUN/slurmdbd.pid
LogFile=$LOG/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=$DB_PASS
StorageLoc=slurm_acct_db
EOF
    chmod 600 "$ETC/slurmdbd.conf"
    umask 022

    # The nodes' private /etc/hosts: each node name, and the controller, resolve on loopback. Each
    # node also has an `<name>i` alias, as JSC's nodes have for their InfiniBand address (the
    # profile key rendezvous.host_suffix is tested through it).
    {
        echo "127.0.0.1 localhost $ctl_host"
        for n in "${NODES[@]}"; do echo "${ADDR[$n]} $n ${n}i"; done
        echo "::1 localhost ip6-localhost ip6-loopback"
    } >"$ETC/hosts"

    # Clients (sbatch, squeue, sacct, scontrol inside jobs) read /etc/slurm/slurm.conf.
    mkdir -p "$(dirname "$SYS_CONF")"
    if [[ -L $SYS_CONF ]]; then
        check_link   # up checked it before it started; a cluster started since must not lose it
        ln -sfn "$CONF" "$SYS_CONF"
    elif [[ -e $SYS_CONF ]]; then
        die "$SYS_CONF exists and is not ours; move it away or run on a machine without a Slurm config"
    else
        ln -s "$CONF" "$SYS_CONF"
    fi
}

# ---------- daemons ----------

start_munge() {
    if munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
        alive "$RUN/munged.pid" munged || say "munged: using the one already running (not ours: not stopped by down)"
        return 0
    fi
    mkdir -p /run/munge
    chown munge:munge /run/munge
    chmod 755 /run/munge
    runuser -u munge -- munged --force --pid-file=/run/munge/munged.pid >>"$LOG/munged.out" 2>&1 \
        || die "munged failed to start (see $LOG/munged.out)"
    wait_for 10 bash -c 'munge -n </dev/null | unmunge' || die "munged is not answering"
    cp /run/munge/munged.pid "$RUN/munged.pid"
    say "munged started (pid $(cat "$RUN/munged.pid"))"
}

db_sql() { mariadb --no-defaults -S "$RUN/mariadb.sock" -u root -e "$1"; }

start_mariadb() {
    local db=$STATE/mariadb
    if alive "$RUN/mariadb.pid" mariadbd; then return 0; fi
    if [[ ! -d $db/mysql ]]; then
        mariadb-install-db --no-defaults --datadir="$db" --user=root --skip-test-db \
            --auth-root-authentication-method=socket >"$LOG/mariadb-install.log" 2>&1 \
            || die "mariadb-install-db failed (see $LOG/mariadb-install.log)"
    fi
    setsid mariadbd --no-defaults --user=root --datadir="$db" --port="$DB_PORT" \
        --bind-address=127.0.0.1 --socket="$RUN/mariadb.sock" --pid-file="$RUN/mariadb.pid" \
        --log-error="$LOG/mariadb.log" --skip-name-resolve --skip-log-bin \
        --innodb-buffer-pool-size=32M --innodb-log-file-size=16M </dev/null >/dev/null 2>&1 &
    wait_for 30 db_sql 'SELECT 1' || die "MariaDB did not start (see $LOG/mariadb.log)"
    db_sql "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
            GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';" \
        || die "could not create the slurm database user"
    say "mariadb started on 127.0.0.1:$DB_PORT (pid $(cat "$RUN/mariadb.pid"))"
}

start_slurmdbd() {
    if ! alive "$RUN/slurmdbd.pid" slurmdbd; then
        slurmdbd >>"$LOG/slurmdbd.out" 2>&1 </dev/null || die "slurmdbd failed (see $LOG/slurmdbd.log)"
        wait_for 10 alive "$RUN/slurmdbd.pid" slurmdbd || die "slurmdbd did not stay up (see $LOG/slurmdbd.log)"
        say "slurmdbd started (pid $(cat "$RUN/slurmdbd.pid"))"
    fi
    wait_for 30 sacctmgr -n -P show cluster || die "slurmdbd is not answering (see $LOG/slurmdbd.log)"
    # The cluster must be known to the database before slurmctld registers with it.
    if ! sacctmgr -n -P show cluster format=cluster | grep -qx "$CLUSTER"; then
        sacctmgr -i add cluster "$CLUSTER" >/dev/null || die "sacctmgr add cluster failed"
    fi
}

start_slurmctld() {
    if ! alive "$RUN/slurmctld.pid" slurmctld; then
        slurmctld -f "$CONF" >>"$LOG/slurmctld.out" 2>&1 </dev/null || die "slurmctld failed (see $LOG/slurmctld.log)"
        wait_for 30 scontrol ping || die "slurmctld is not answering (see $LOG/slurmctld.log)"
        say "slurmctld started (pid $(cat "$RUN/slurmctld.pid" 2>/dev/null))"
    fi
}

start_slurmd() {
    local n=$1
    alive "$RUN/slurmd-$n.pid" slurmd && return 0
    # A private hostname and /etc/hosts; the daemon (and every job step under it) inherits them.
    # shellcheck disable=SC2016  # expanded by the inner bash
    setsid unshare --uts --mount --propagation private -- bash -c \
        'hostname "$1" && mount --bind "$2" /etc/hosts && exec slurmd -N "$1" -f "$3"' \
        _ "$n" "$ETC/hosts" "$CONF" >>"$LOG/slurmd-$n.out" 2>&1 </dev/null \
        || die "slurmd $n failed (see $LOG/slurmd-$n.log)"
    wait_for 10 alive "$RUN/slurmd-$n.pid" slurmd || die "slurmd $n did not stay up (see $LOG/slurmd-$n.log)"
    say "slurmd $n started (pid $(cat "$RUN/slurmd-$n.pid"))"
}

nodes_idle() {
    local states
    states=$(sinfo -h -N -p debug -o '%N %t' 2>/dev/null | sort -u)
    [[ $(grep -cE "^($(IFS='|'; echo "${NODES[*]}")) (idle|mix|alloc)\$" <<<"$states") -eq ${#NODES[@]} ]]
}

up() {
    if ((EUID != 0)); then
        local how="run it as root: sudo make test-slurm (or sudo make cluster-up)"
        if [[ ${OPTIONAL:-} && ${CI:-} != true ]]; then
            say "not root: the live Slurm tests will be skipped; $how"
            exit 0
        fi
        die "the test cluster needs root; $how"
    fi
    check_link
    mkdir -p "$STATE" "$RUN" "$LOG"
    install_packages
    CONF_CHANGED=""
    write_config
    if [[ $CONF_CHANGED ]] && alive "$RUN/slurmctld.pid" slurmctld; then
        say "slurm.conf changed while the cluster was up: restarting it"
        down
        write_config   # down removed the clients' link to it
    fi
    start_munge
    start_mariadb
    start_slurmdbd
    start_slurmctld
    local n
    for n in "${NODES[@]}"; do start_slurmd "$n"; done
    # A node a previous run left DOWN comes back by itself (ReturnToService=2) once its slurmd registers.
    wait_for 60 nodes_idle || { sinfo -N >&2 || true; die "nodes did not become idle (see $LOG/)"; }
    say "up in $(elapsed) s"
    sinfo
}

down() {
    if ((EUID != 0)); then
        local f
        for f in "$RUN"/*.pid; do [[ -s $f ]] && die "stopping the test cluster needs root: sudo make cluster-down"; done
        say "nothing of ours is running"
        return 0
    fi
    if alive "$RUN/slurmctld.pid" slurmctld; then
        # Leave no job behind to be restarted by the next `up`.
        local ids
        ids=$(squeue -h -o %i 2>/dev/null | tr '\n' ' ')
        if [[ -n ${ids// /} ]]; then
            # shellcheck disable=SC2086
            scancel $ids 2>/dev/null || true
            # shellcheck disable=SC2016  # expanded by the inner bash
            wait_for 20 bash -c '[[ -z $(squeue -h -o %i) ]]' || true
        fi
    fi
    local n
    for n in "${NODES[@]}"; do stop "slurmd $n" "$RUN/slurmd-$n.pid" slurmd & done
    wait
    stop slurmctld "$RUN/slurmctld.pid" slurmctld
    stop slurmdbd "$RUN/slurmdbd.pid" slurmdbd
    stop mariadb "$RUN/mariadb.pid" mariadbd
    stop munged "$RUN/munged.pid" munged
    if [[ -L $SYS_CONF && ($(readlink -- "$SYS_CONF") == "$CONF" || $SYS_CONF -ef $CONF) ]]; then
        rm -f -- "$SYS_CONF"   # ours; a link to another state folder is that cluster's
        say "removed $SYS_CONF"
    fi
    say "down in $(elapsed) s"
}

status() {
    local rc=0 n
    row() {
        if alive "$2" "$3"; then printf '  %-10s running (pid %s)\n' "$1" "$(tr -dc '0-9' <"$2")"
        else printf '  %-10s not running (under this script)\n' "$1"; rc=1; fi
    }
    echo "daemons (state in $STATE):"
    if alive "$RUN/munged.pid" munged; then row munged "$RUN/munged.pid" munged
    elif munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then printf '  %-10s running (not ours)\n' munged
    else row munged "$RUN/munged.pid" munged; fi
    row mariadb "$RUN/mariadb.pid" mariadbd
    row slurmdbd "$RUN/slurmdbd.pid" slurmdbd
    row slurmctld "$RUN/slurmctld.pid" slurmctld
    for n in "${NODES[@]}"; do row "slurmd $n" "$RUN/slurmd-$n.pid" slurmd; done
    if ((rc == 0)); then sinfo -N -o '%N %P %t %G %c' || rc=1; fi
    return $rc
}

cmd=${1:-}
shift || true
OPTIONAL=""
for arg in "$@"; do
    case $arg in
        --optional) OPTIONAL=1 ;;
        *) die "unknown option $arg" ;;
    esac
done
case $cmd in
    up) up ;;
    down) down ;;
    status) status ;;
    check-link) check_link; echo "cluster: $SYS_CONF may point to $CONF" ;;
    *) echo "usage: $0 up [--optional] | down | status | check-link" >&2; exit 2 ;;
esac
