"""Build and tear down the emulated cluster's namespaces, links and qdiscs (Lion Cub, Section 7 "Ethernet").

`create_cluster(nodes, link)` makes a switch namespace with a bridge and `nodes` host namespaces, each joined to
the bridge by a veth pair with a token-bucket filter on both ends (see `src.launch.netns` for the topology and
names), and gives each host an /etc/hosts naming all of them (/etc/netns/<namespace>/hosts, which `ip netns
exec` binds over /etc). If any step fails, whatever was already made is removed before the error propagates.
`teardown(cluster)` kills what still runs inside the namespaces, deletes the links (their qdiscs go with them), the
bridge, the namespaces and their /etc/netns folders, and releases the run's lock; it never touches an object
without the run's prefix and id.
`cleanup_leftovers()` does the same for runs whose owner died (their lock is free) and leaves live runs alone.
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path

from src.launch.netns import (MAX_NODES, NS_PATTERN, PREFIX, SUBNET, Cluster, Host, LinkSpec, NetnsError,
                              format_rate, kill_namespace_processes, list_namespaces, live_run_ids, lock_path,
                              new_run_id, release_lock, run_cmd, try_lock)


# `ip netns exec NAME` binds the files of /etc/netns/NAME over /etc: a hosts file there lets every host resolve the
# others' addresses (gloo's TCP store looks up its peers' names and warns on every connection when it cannot).
ETC_NETNS = Path("/etc/netns")


def _write_hosts_files(cluster: Cluster) -> None:
    """Each host's /etc/hosts names every host (skipped where /etc cannot be written: only the warnings remain)."""
    lines = ["127.0.0.1 localhost", "::1 localhost", *(f"{h.address} {h.netns}" for h in cluster.hosts),
             *(f"::ffff:{h.address} {h.netns}" for h in cluster.hosts)]  # as a dual-stack socket sees a peer
    for host in cluster.hosts:
        try:
            (ETC_NETNS / host.netns).mkdir(parents=True, exist_ok=True)
            (ETC_NETNS / host.netns / "hosts").write_text("\n".join(lines) + "\n")
        except OSError:
            return


def _host_names(run_id: str, index: int) -> tuple[str, str, str]:
    """(namespace, host-end link, switch-end link) of host `index`."""
    return f"{PREFIX}-{run_id}-h{index}", f"{PREFIX}{run_id}-h{index}", f"{PREFIX}{run_id}-s{index}"


def _add_namespace(cluster: Cluster, name: str) -> None:
    run_cmd(["ip", "netns", "add", name])
    cluster.namespaces.append(name)


def _add_host(cluster: Cluster, index: int) -> Host:
    netns, host_if, switch_if = _host_names(cluster.run_id, index)
    mtu = str(cluster.link.mtu)
    _add_namespace(cluster, netns)
    sw = cluster.switch_ns
    run_cmd(["ip", "-n", sw, "link", "add", switch_if, "mtu", mtu, "type", "veth",
             "peer", "name", host_if, "mtu", mtu, "netns", netns])
    run_cmd(["ip", "-n", sw, "link", "set", switch_if, "master", cluster.bridge])
    run_cmd(["ip", "-n", sw, "link", "set", switch_if, "up"])
    address = f"{SUBNET}.{index + 1}"
    run_cmd(["ip", "-n", netns, "addr", "add", f"{address}/24", "dev", host_if])
    run_cmd(["ip", "-n", netns, "link", "set", "lo", "up"])
    run_cmd(["ip", "-n", netns, "link", "set", host_if, "up"])
    if cluster.link.rate is not None:
        run_cmd(["tc", "-n", netns, "qdisc", "add", "dev", host_if, "root", *cluster.link.tbf_args()])
        run_cmd(["tc", "-n", sw, "qdisc", "add", "dev", switch_if, "root", *cluster.link.tbf_args()])
    return Host(index=index, netns=netns, ifname=host_if, address=address)


def check_spec(nodes: int, link: LinkSpec) -> None:
    """ValueError naming the value unless `nodes` hosts with `link` can be built."""
    if not 1 <= nodes <= MAX_NODES:
        raise ValueError(f"nodes={nodes} must lie in [1, {MAX_NODES}] (one /24 subnet)")
    if not 68 <= link.mtu <= 65535:
        raise ValueError(f"mtu={link.mtu} must lie in [68, 65535]")
    if link.rate is not None and link.burst_bytes() < link.mtu:
        raise ValueError(f"burst={link.burst_bytes()} bytes is below the MTU ({link.mtu}); tbf could never send")
    if link.latency_ms <= 0:
        raise ValueError(f"latency={link.latency_ms}ms must be positive (it sets the tbf queue length)")


def reserve(link: LinkSpec) -> Cluster:
    """A new run id, locked; nothing exists on the network yet. Pair with `build` and, always, `teardown`."""
    check_spec(1, link)
    run_id, fd = new_run_id()
    return Cluster(run_id=run_id, link=link, lock_fd=fd)


def build(cluster: Cluster, nodes: int) -> None:
    """Make the switch and `nodes` hosts of a reserved cluster (recorded as they are made, for `teardown`)."""
    check_spec(nodes, cluster.link)
    _add_namespace(cluster, cluster.switch_ns)
    run_cmd(["ip", "-n", cluster.switch_ns, "link", "add", cluster.bridge, "type", "bridge"])
    run_cmd(["ip", "-n", cluster.switch_ns, "link", "set", cluster.bridge, "up"])
    for index in range(nodes):
        cluster.hosts.append(_add_host(cluster, index))
    _write_hosts_files(cluster)


def create_cluster(nodes: int, link: LinkSpec) -> Cluster:
    """`reserve` + `build`; on failure remove what was made and re-raise."""
    check_spec(nodes, link)
    cluster = reserve(link)
    try:
        build(cluster, nodes)
    except BaseException:
        teardown(cluster)
        raise
    return cluster


def teardown(cluster: Cluster) -> list[str]:
    """Remove everything of `cluster`; returns the problems met (empty when all went)."""
    problems = []
    ours = [n for n in list_namespaces() if (m := NS_PATTERN.match(n)) and m.group(1) == cluster.run_id]
    cluster.namespaces += [n for n in ours if n not in cluster.namespaces]  # made just before an interruption
    for netns in reversed(cluster.namespaces):
        survivors = kill_namespace_processes(netns)
        if survivors:
            problems.append(f"processes {survivors} in {netns} survived SIGKILL")
    sw = cluster.switch_ns
    if sw in cluster.namespaces:
        indices = sorted({int(m.group(2)[1:]) for m in map(NS_PATTERN.match, cluster.namespaces)
                          if m and m.group(2) != "sw"})
        for index in indices:  # deleting one end of a veth pair deletes both, and their qdiscs
            run_cmd(["ip", "-n", sw, "link", "del", _host_names(cluster.run_id, index)[2]], check=False)
        run_cmd(["ip", "-n", sw, "link", "del", cluster.bridge], check=False)
    for netns in reversed(cluster.namespaces):
        shutil.rmtree(ETC_NETNS / netns, ignore_errors=True)
        proc = run_cmd(["ip", "netns", "del", netns], check=False)
        if proc.returncode != 0 and netns in list_namespaces():
            problems.append(f"could not delete namespace {netns}: {proc.stderr.strip()}")
    cluster.namespaces = [ns for ns in cluster.namespaces if ns in list_namespaces()]
    release_lock(cluster.run_id, cluster.lock_fd)
    cluster.lock_fd = None
    return problems


def cleanup_leftovers() -> tuple[list[str], list[str]]:
    """Remove the namespaces (and their links and qdiscs) of dead runs; returns (removed, skipped as live)."""
    by_run: dict[str, list[str]] = {}
    for name in list_namespaces():
        match = NS_PATTERN.match(name)
        if match:
            by_run.setdefault(match.group(1), []).append(name)
    live = live_run_ids()
    removed, skipped = [], []
    for run_id, names in sorted(by_run.items()):
        if run_id in live:
            skipped.extend(names)
            continue
        fd = try_lock(run_id)
        if fd is None:  # its owner came back to life between the two checks
            skipped.extend(names)
            continue
        switch = [n for n in names if n.endswith("-sw")]
        cluster = Cluster(run_id=run_id, link=LinkSpec(rate=None), namespaces=switch + sorted(set(names) - set(switch)),
                          lock_fd=fd)
        problems = teardown(cluster)
        if problems:
            raise NetnsError("; ".join(problems))
        removed.extend(names)
    _remove_stale_locks()
    return removed, skipped


def _remove_stale_locks() -> None:
    folder = lock_path("0000").parent
    for path in folder.glob(f"{PREFIX}-*.lock"):
        match = re.fullmatch(rf"{PREFIX}-([0-9a-f]{{4}})\.lock", path.name)
        if match:
            fd = try_lock(match.group(1))
            if fd is not None:
                release_lock(match.group(1), fd)


def describe(cluster: Cluster) -> str:
    link = cluster.link
    shaping = (f"tbf rate {format_rate(link.rate)} burst {link.burst_bytes()}B latency {link.latency_ms:g}ms on both "
               "ends of each host link" if link.rate is not None else "no rate limit")
    hosts = ", ".join(f"{h.netns}={h.address}" for h in cluster.hosts)
    return f"cluster {cluster.run_id}: {len(cluster.hosts)} hosts on bridge {cluster.bridge} ({shaping}); {hosts}"

