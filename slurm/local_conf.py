"""The files of a local Slurm cluster (`slurm/local.py`): slurm.conf, the nodes' /etc/hosts, the client wrappers.

Everything lives in one state folder. The daemons run on the emulated Ethernet cluster of `src.launch.netns`:
slurmctld in the switch namespace on the bridge's address (`CTL_ADDRESS`), node `n<i+1>` in host namespace
`h<i>` at that host's address. The plugins are the ones that work on a container without systemd or a delegated
cgroup tree: `ProctrackType=proctrack/pgid`, `TaskPlugin=task/none`, `JobAcctGatherType=jobacct_gather/none`;
no accounting database (`sacct -c` reads the job-completion file instead).
"""
from __future__ import annotations

from pathlib import Path

from src.launch.netns import SUBNET

CTL_ADDRESS = f"{SUBNET}.254"
CLIENTS = ("sbatch", "srun", "salloc", "squeue", "scontrol", "scancel", "sinfo", "sacct")


def node_name(index: int) -> str:
    return f"n{index + 1}"


def node_address(index: int) -> str:
    return f"{SUBNET}.{index + 1}"


def slurm_conf(state: Path, cluster_name: str, nodes: int, cpus: int, memory_mb: int) -> str:
    """slurm.conf of a cluster of `nodes` nodes with `cpus` CPUs each, one partition `debug`."""
    lines = [
        f"# lioncub local Slurm {cluster_name} (slurm/local.py): {nodes} node(s) in network namespaces",
        f"ClusterName={cluster_name}",
        f"SlurmctldHost=ctl({CTL_ADDRESS})",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={state / 'munge' / 'munge.socket'},cred_expire=30",  # a requeued job waits this long
        f"StateSaveLocation={state / 'ctld'}",
        f"SlurmdSpoolDir={state / 'spool' / '%n'}",
        f"SlurmctldPidFile={state / 'run' / 'slurmctld.pid'}",
        f"SlurmdPidFile={state / 'run' / 'slurmd-%n.pid'}",
        f"SlurmctldLogFile={state / 'log' / 'slurmctld.log'}",
        f"SlurmdLogFile={state / 'log' / 'slurmd-%n.log'}",
        f"PlugStackConfig={state / 'plugstack.conf'}",
        "ProctrackType=proctrack/pgid",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/filetxt",
        f"JobCompLoc={state / 'log' / 'jobcomp.txt'}",
        "SlurmdParameters=config_overrides",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "SchedulerType=sched/backfill",
        "MpiDefault=none",
        "SwitchType=switch/none",
        "ReturnToService=2",
        "JobRequeue=1",
        "MinJobAge=3600",
        "KillWait=30",
        "SlurmdTimeout=60",
        "InactiveLimit=0",
        "MailProg=/bin/true",
        f"NodeName=DEFAULT CPUs={cpus} RealMemory={memory_mb} State=UNKNOWN",
    ]
    lines += [f"NodeName={node_name(i)} NodeAddr={node_address(i)}" for i in range(nodes)]
    names = ",".join(node_name(i) for i in range(nodes))
    lines.append(f"PartitionName=debug Nodes={names} Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


def hosts_file(nodes: int) -> str:
    """/etc/hosts as the nodes see it (bound over /etc/hosts in each node's own mount namespace)."""
    lines = ["127.0.0.1 localhost", f"{CTL_ADDRESS} ctl"]
    lines += [f"{node_address(i)} {node_name(i)}" for i in range(nodes)]
    return "\n".join(lines) + "\n"


def client_wrapper(binary: str, conf: Path, namespaces: list[str], switch_ns: str) -> str:
    """A `sbatch`/`squeue`/... that talks to this cluster: inside one of its namespaces (a job) it runs the client
    as it is; anywhere else it enters the switch namespace, where slurmctld listens."""
    inside = " ".join(f"/run/netns/{ns}" for ns in namespaces)
    return f"""#!/bin/sh
# lioncub local Slurm (slurm/local.py): {Path(binary).name} for the cluster configured in {conf}
export SLURM_CONF={conf}
here=$(stat -L -c %i /proc/self/ns/net)
for ns in {inside}; do
  [ "$(stat -L -c %i "$ns" 2>/dev/null)" = "$here" ] && exec {binary} "$@"
done
exec nsenter --net=/run/netns/{switch_ns} {binary} "$@"
"""


def env_script(state: Path) -> str:
    return (f"# source this file to use the local Slurm cluster of {state}\n"
            f"export PATH={state / 'bin'}:$PATH\nexport SLURM_CONF={state / 'slurm.conf'}\n"
            "export LIONCUB_SLURM_PROFILE=local\n")
