#!/usr/bin/env bash
# A real multi-node Slurm cluster on this one machine, for the tests and for trying the
# slurm platform: Debian's slurm-wlm 22.05 + munge, one slurmctld and N slurmd daemons
# (NodeName=n[1-N], all on 127.0.0.1, ports 6821...), each slurmd in its own cgroup-v2 folder
# so that a whole node can be killed (cgroup.kill) or frozen (cgroup.freeze).
#
#   scripts/slurm-cluster.sh install          apt-get install slurmctld slurmd slurm-client munge (if missing)
#   scripts/slurm-cluster.sh start            (re)start a fresh cluster; waits until every node is idle
#   scripts/slurm-cluster.sh stop             end every job, daemon and task of the cluster; wait until gone
#   scripts/slurm-cluster.sh status           sinfo; exit 1 if the controller does not answer
#   scripts/slurm-cluster.sh env              print `export SLURM_CONF=...` for the clients
#   scripts/slurm-cluster.sh kill-node NODE   kill the node: slurmd, step daemons and tasks (cgroup.kill)
#   scripts/slurm-cluster.sh freeze-node NODE / thaw-node NODE      hang / resume the whole node
#   scripts/slurm-cluster.sh restart-node NODE                      kill what is left, start its slurmd, resume it
#   scripts/slurm-cluster.sh heal             cancel every job; thaw and restart any node that is not idle
#                                             or whose slurmd is gone; wait until all are idle (between tests)
#   scripts/slurm-cluster.sh stop-controller / start-controller     slurmctld only (steps keep running)
#
# Settings (environment): SLURM_CLUSTER_DIR (default /tmp/es-slurm: config, state, logs),
# SLURM_CLUSTER_NODES (3), SLURM_CLUSTER_CPUS (CPUs per node, 4), SLURM_CLUSTER_PORT (slurmctld, 6817;
# the nodes use PORT+4...). Runs as root (slurmd must). Nothing is installed into /etc: the
# clients find the cluster through SLURM_CONF=$SLURM_CLUSTER_DIR/slurm.conf.
set -euo pipefail

DIR=${SLURM_CLUSTER_DIR:-/tmp/es-slurm}
NODES=${SLURM_CLUSTER_NODES:-3}
CPUS=${SLURM_CLUSTER_CPUS:-4}
PORT=${SLURM_CLUSTER_PORT:-6817}
CONF="$DIR/slurm.conf"
SOCK="$DIR/munge/munge.socket"
export SLURM_CONF="$CONF"

die() { echo "slurm-cluster: $*" >&2; exit 1; }
say() { echo "slurm-cluster: $*" >&2; }

node_names() { local i; for ((i = 1; i <= NODES; i++)); do echo "n$i"; done; }

cgroup2_root() {
    # the cgroup-v2 mount: /sys/fs/cgroup on a pure v2 system, /sys/fs/cgroup/unified on a hybrid one
    awk '$3 == "cgroup2" { print $2; exit }' /proc/mounts
}
CGROOT="$(cgroup2_root || true)"
CGDIR="${CGROOT:+$CGROOT/es-slurm-$(basename "$DIR")}"

# A pid is alive unless /proc says it is gone or a zombie (PID 1 here reaps slowly).
alive() { local s; s=$(awk '{ sub(/.*\) /, ""); print $1 }' "/proc/$1/stat" 2>/dev/null) || return 1; [[ -n $s && $s != Z && $s != X ]]; }

wait_gone() {  # PID... : up to 15 s
    local pid t
    for ((t = 0; t < 150; t++)); do
        local any=0
        for pid in "$@"; do alive "$pid" && any=1; done
        ((any)) || return 0
        sleep 0.1
    done
    return 1
}

pidfile_pid() { [[ -s $1 ]] && cat "$1" || true; }

install() {
    local missing=()
    for bin in slurmctld slurmd srun munged; do command -v "$bin" >/dev/null || missing+=("$bin"); done
    if ((${#missing[@]} == 0)); then say "slurm and munge are installed"; return 0; fi
    [[ $(id -u) == 0 ]] || die "installing needs root (missing: ${missing[*]})"
    say "installing slurmctld slurmd slurm-client munge (missing: ${missing[*]})"
    # package scripts must not start system-wide daemons: this cluster runs its own
    local prc=/usr/sbin/policy-rc.d had_prc=0
    [[ -e $prc ]] && had_prc=1 && cp -p "$prc" "$prc.es-slurm-save"
    printf '#!/bin/sh\nexit 101\n' >"$prc"; chmod 755 "$prc"
    local pkgs=(slurmctld slurmd slurm-client munge)
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${pkgs[@]}" >"/tmp/es-slurm-apt.log" 2>&1; then
        DEBIAN_FRONTEND=noninteractive apt-get update -q >>"/tmp/es-slurm-apt.log" 2>&1 || true
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${pkgs[@]}" >>"/tmp/es-slurm-apt.log" 2>&1 \
            || { ((had_prc)) && mv "$prc.es-slurm-save" "$prc" || rm -f "$prc"; die "apt-get install failed: see /tmp/es-slurm-apt.log"; }
    fi
    if ((had_prc)); then mv "$prc.es-slurm-save" "$prc"; else rm -f "$prc"; fi
    # a package may still have started the system munged / slurmd: this cluster does not use them
    for bin in slurmctld slurmd; do command -v "$bin" >/dev/null || die "$bin missing after install"; done
    say "installed: $(slurmctld -V)"
}

write_config() {
    local last=$((PORT + 3 + NODES))
    mkdir -p "$DIR"/{munge,state,log,run,tmp,spool}
    chmod 700 "$DIR/munge"
    local n; for n in $(node_names); do mkdir -p "$DIR/spool/$n"; done
    cat >"$CONF" <<CONF
# written by scripts/slurm-cluster.sh: $NODES nodes on this machine
ClusterName=es
SlurmctldHost=localhost
SlurmctldPort=$PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$SOCK,cred_expire=20
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
TmpFS=$DIR/tmp
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
SlurmdParameters=config_overrides
ReturnToService=1
SlurmdTimeout=10
SlurmctldTimeout=10
MessageTimeout=5
KillWait=5
InactiveLimit=0
MinJobAge=600
SchedulerParameters=sched_interval=2
NodeName=n[1-$NODES] NodeHostname=localhost NodeAddr=127.0.0.1 Port=[$((PORT + 4))-$last] CPUs=$CPUS Boards=1 SocketsPerBoard=1 CoresPerSocket=$CPUS ThreadsPerCore=1 RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
}

start_munge() {
    local key="$DIR/munge/munge.key"
    [[ -s $key ]] || { dd if=/dev/urandom of="$key" bs=1024 count=1 status=none; chmod 400 "$key"; }
    rm -f "$SOCK" "$SOCK.lock"
    setsid munged -F --force -S "$SOCK" --key-file="$key" --pid-file="$DIR/munge/munged.pid" \
        --seed-file="$DIR/munge/munged.seed" --log-file="$DIR/log/munged.log" </dev/null >>"$DIR/log/munged.out" 2>&1 &
    echo $! >"$DIR/run/munged.pid"
    local t; for ((t = 0; t < 100; t++)); do [[ -S $SOCK ]] && return 0; sleep 0.1; done
    die "munged did not start: $(tail -5 "$DIR/log/munged.log" "$DIR/log/munged.out" 2>/dev/null)"
}

# A daemon in the foreground (-D) copies every line of its log file to stderr. Its .out file
# keeps only what the log file does not get (errors before the log file is open, a crash), so
# that no line is written twice: a "PREFIX: ..." line is dropped once LOGFILE has grown. (The
# filter's own stdout/stderr are replaced with exec: a copy of the caller's would hold its pipe.)
log_copy_filter() {  # LOGFILE PREFIX
    local logfile=$1 prefix=$2 size0 line
    size0=$(stat -c %s "$logfile" 2>/dev/null || echo 0)
    while IFS= read -r line; do
        if [[ $line == "$prefix"* ]] && (($(stat -c %s "$logfile" 2>/dev/null || echo 0) > size0)); then continue; fi
        printf '%s\n' "$line"
    done
}

start_controller() {
    setsid slurmctld -D -f "$CONF" </dev/null \
        > >(exec >>"$DIR/log/slurmctld.out" 2>&1; log_copy_filter "$DIR/log/slurmctld.log" "slurmctld: ") 2>&1 &
    echo $! >"$DIR/run/slurmctld.main.pid"
    local t; for ((t = 0; t < 150; t++)); do
        timeout 5 scontrol ping 2>/dev/null | grep -q "is UP" && return 0
        alive "$(cat "$DIR/run/slurmctld.main.pid")" || break
        sleep 0.1
    done
    die "slurmctld did not answer: $(tail -5 "$DIR/log/slurmctld.log" "$DIR/log/slurmctld.out" 2>/dev/null)"
}

start_node() {  # NODE: its slurmd in its own cgroup (when cgroup v2 is writable)
    local n=$1 cg=""
    if [[ -n $CGDIR ]] && mkdir -p "$CGDIR/$n" 2>/dev/null && [[ -w $CGDIR/$n/cgroup.procs ]]; then cg="$CGDIR/$n"; fi
    mkdir -p "$DIR/spool/$n"
    CG="$cg" setsid bash -c '[[ -n $CG ]] && echo $$ > "$CG/cgroup.procs"; exec slurmd -D -N "$0" -f "$1"' \
        "$n" "$CONF" </dev/null > >(exec >>"$DIR/log/slurmd-$n.out" 2>&1; log_copy_filter "$DIR/log/slurmd-$n.log" "slurmd: ") 2>&1 &
    echo $! >"$DIR/run/slurmd-$n.main.pid"
}

wait_idle() {  # every node idle (or mixed/allocated: just responding), 30 s at most
    local t out
    for ((t = 0; t < 300; t++)); do
        out=$(timeout 5 sinfo -h -N -o "%N %t" 2>/dev/null || true)
        if [[ -n $out ]] && ! grep -qvE ' (idle|mix|alloc)$' <<<"$out" && (($(wc -l <<<"$out") == NODES)); then return 0; fi
        sleep 0.1
    done
    die "nodes not idle after 30 s: $(timeout 5 sinfo -N 2>&1 | tr '\n' ' ')"
}

start() {
    [[ $(id -u) == 0 ]] || die "the cluster needs root (slurmd runs the tasks as any user)"
    for bin in slurmctld slurmd munged srun; do command -v "$bin" >/dev/null || die "$bin is missing: run '$0 install'"; done
    stop quiet
    rm -rf "$DIR/state" "$DIR/spool" "$DIR/run"
    write_config
    start_munge
    start_controller
    local n; for n in $(node_names); do start_node "$n"; done
    wait_idle
    say "up: $NODES nodes (SLURM_CONF=$CONF)${CGDIR:+, node cgroups under $CGDIR}"
    timeout 5 sinfo -N >&2 || true
}

node_cg() {
    local n=$1
    [[ -n $CGDIR && -d $CGDIR/$n ]] || die "node $n has no cgroup (cgroup v2 not writable here?)"
    echo "$CGDIR/$n"
}

kill_node() {
    local n=$1 cg pids
    cg=$(node_cg "$n")
    echo 0 >"$cg/cgroup.freeze" 2>/dev/null || true
    echo 1 >"$cg/cgroup.kill"
    local t; for ((t = 0; t < 100; t++)); do
        pids=$(cat "$cg/cgroup.procs" 2>/dev/null || true)
        [[ -z $pids ]] && return 0
        sleep 0.05
    done
    say "warning: processes left in $cg: $pids"
}

stop() {
    local quiet=${1:-}
    local pids=() n f pid
    # jobs first (their tasks live in the node cgroups, which are killed below anyway)
    if [[ -f $CONF ]] && [[ -S $SOCK ]]; then timeout 5 scancel --quiet --user=root 2>/dev/null || true; fi
    for n in $(node_names) $(ls "$CGDIR" 2>/dev/null || true); do
        if [[ -n $CGDIR && -d $CGDIR/$n ]]; then
            echo 0 >"$CGDIR/$n/cgroup.freeze" 2>/dev/null || true
            echo 1 >"$CGDIR/$n/cgroup.kill" 2>/dev/null || true
        fi
    done
    for f in "$DIR"/run/slurmd-*.pid "$DIR"/run/slurmd-*.main.pid "$DIR"/run/slurmctld.pid "$DIR"/run/slurmctld.main.pid "$DIR"/run/munged.pid "$DIR"/munge/munged.pid; do
        [[ -f $f ]] || continue
        pid=$(pidfile_pid "$f")
        [[ -n $pid ]] && alive "$pid" && { kill -CONT "$pid" 2>/dev/null || true; kill -TERM "$pid" 2>/dev/null || true; pids+=("$pid"); }
    done
    if ((${#pids[@]})); then
        wait_gone "${pids[@]}" || { for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done; wait_gone "${pids[@]}" || true; }
    fi
    if [[ -n $CGDIR && -d $CGDIR ]]; then
        for n in "$CGDIR"/*/; do [[ -d $n ]] && rmdir "$n" 2>/dev/null || true; done
        rmdir "$CGDIR" 2>/dev/null || true
    fi
    [[ -n $quiet ]] || say "stopped"
}

restart_node() {  # NODE
    local n=$1 t
    if [[ -n $CGDIR && -d $CGDIR/$n ]]; then kill_node "$n"; fi
    start_node "$n"
    for ((t = 0; t < 100; t++)); do
        timeout 5 scontrol update nodename="$n" state=resume >/dev/null 2>&1 || true
        timeout 5 sinfo -h -n "$n" -o %t 2>/dev/null | grep -qE '^(idle|mix|alloc)$' && return 0
        sleep 0.2
    done
    say "node $n did not come back: $(timeout 5 sinfo -n "$n" 2>&1)"
    return 1
}

heal() {
    # No job left and every node idle with a live slurmd: what each test may assume. A node
    # killed or frozen by the previous test is thawed and restarted; a slurmd that died is
    # restarted before slurmctld notices (SlurmdTimeout), so the next job does not land on it.
    timeout 10 scontrol ping 2>/dev/null | grep -q "is UP" || die "heal: slurmctld does not answer (not started? run '$0 start')"
    timeout 5 scancel --quiet --user=root 2>/dev/null || true
    local n state out t pid
    for n in $(node_names); do
        if [[ -n $CGDIR && -d $CGDIR/$n ]]; then echo 0 >"$CGDIR/$n/cgroup.freeze" 2>/dev/null || true; fi
        pid=$(pidfile_pid "$DIR/run/slurmd-$n.main.pid")
        if [[ -z $pid ]] || ! alive "$pid"; then say "heal: slurmd of $n is gone: restarting it"; restart_node "$n" || true; fi
    done
    for ((t = 0; t < 900; t++)); do  # 90 s
        out=$(timeout 5 sinfo -h -N -o "%N %t" 2>/dev/null || true)
        if [[ -n $out ]] && ! grep -qv ' idle$' <<<"$out" && (($(wc -l <<<"$out") == NODES)) \
            && [[ -z $(timeout 5 squeue -h 2>/dev/null) ]]; then
            return 0
        fi
        if ((t % 30 == 29)); then  # every 3 s: restart what is down, drained or not responding
            timeout 5 scancel --quiet --user=root 2>/dev/null || true
            while read -r n state; do
                case $state in idle | mix | alloc | comp | "") ;; *) say "heal: $n is $state: restarting it"; restart_node "$n" || true ;; esac
            done <<<"$out"
        fi
        sleep 0.1
    done
    die "cluster not healthy after 90 s: $(timeout 5 sinfo -N 2>&1 | tr '\n' ' ') jobs: $(timeout 5 squeue -h 2>&1 | tr '\n' ' ')"
}

case "${1:-}" in
    install) install ;;
    start) start ;;
    stop) stop ;;
    status) timeout 10 sinfo -N || die "the controller does not answer (SLURM_CONF=$CONF)" ;;
    env) echo "export SLURM_CONF=$CONF" ;;
    kill-node) [[ -n ${2:-} ]] || die "kill-node NODE"; kill_node "$2" ;;
    freeze-node) [[ -n ${2:-} ]] || die "freeze-node NODE"; echo 1 >"$(node_cg "$2")/cgroup.freeze" ;;
    thaw-node) [[ -n ${2:-} ]] || die "thaw-node NODE"; echo 0 >"$(node_cg "$2")/cgroup.freeze" ;;
    restart-node) [[ -n ${2:-} ]] || die "restart-node NODE"; restart_node "$2" || exit 1 ;;
    heal) heal ;;
    stop-controller)
        pid=$(pidfile_pid "$DIR/run/slurmctld.main.pid"); [[ -n $pid ]] && kill -TERM "$pid" 2>/dev/null; wait_gone "$pid" || kill -KILL "$pid" ;;
    start-controller) start_controller ;;
    *) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
