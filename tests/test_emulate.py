"""The emulated Ethernet cluster (src/launch; Lion Cub Section 7's "Ethernet" setting): a gloo allreduce crosses
it with the right result, and teardown removes exactly what a run created, after success, a failed job or a
signal; `--cleanup` removes dead runs' leftovers only; without root or iproute2 it refuses in one line. Each host
gets a disjoint, equal share of the cores and each rank the share's thread count, as the ranks themselves report
them (their affinity and torch's thread count); ranks left with default threads on a shared machine warn once.

Tests that build namespaces need root and `ip`/`tc`, and are skipped with the reason otherwise. They find their
own run's objects by the run id the launcher prints, so clusters of other runs on the machine do not disturb them.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from src.distributed import threads as rank_threads
from src.launch import cluster as topo
from src.launch import cores, emulate
from harness_util import needs_netns
from src.launch.netns import (EmulatorUnavailable, LinkSpec, check_prerequisites, format_rate, list_namespaces,
                              lock_path, parse_rate, release_lock, root_links, run_cmd)

REPO = Path(__file__).resolve().parents[1]
BYSTANDER = f"lcubtest-bystander-{os.getpid()}"   # an unrelated namespace that looks a bit like ours




def launch(*args: str, timeout: float = 150) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "src.launch.emulate", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)


def run_id_of(output: str) -> str:
    match = re.search(r"lcub: cluster ([0-9a-f]{4}):", output)
    assert match, f"the launcher did not announce its cluster:\n{output}"
    return match.group(1)


def assert_gone(run_id: str) -> None:
    assert not [n for n in list_namespaces() if n.startswith(f"lcub-{run_id}-")]
    assert not [link for link in root_links() if link.startswith(f"lcub{run_id}")]
    assert not lock_path(run_id).exists()
    assert not list(Path("/etc/netns").glob(f"lcub-{run_id}-*"))  # the hosts files went with the namespaces


@pytest.fixture()
def bystander():
    """An unrelated namespace with a veth pair and a tbf qdisc, which no run may touch."""
    run_cmd(["ip", "netns", "add", BYSTANDER])
    try:
        run_cmd(["ip", "-n", BYSTANDER, "link", "add", "lcubother0", "type", "veth", "peer", "name", "lcubother1"])
        run_cmd(["tc", "-n", BYSTANDER, "qdisc", "add", "dev", "lcubother0", "root", "tbf", "rate", "1mbit",
                 "burst", "10kb", "latency", "10ms"])
        yield BYSTANDER
        assert BYSTANDER in list_namespaces(), "the unrelated namespace was deleted"
        qdiscs = run_cmd(["tc", "-n", BYSTANDER, "qdisc", "show", "dev", "lcubother0"]).stdout
        assert "tbf" in qdiscs, "the unrelated namespace's qdisc was removed"
    finally:
        run_cmd(["ip", "netns", "del", BYSTANDER], check=False)


def _must_not_be_called(*_args, **_kwargs):
    raise AssertionError("the emulator started building a cluster")


# --- without namespaces -------------------------------------------------------------------------------------------
def test_rates_parse_in_tc_units():
    assert parse_rate("1gbit") == 10**9 and parse_rate("100Mbit") == 10**8 and parse_rate("125mbps") == 10**9
    assert parse_rate("none") is None and format_rate(10**9) == "1gbit" and format_rate(None) == "none"
    for bad in ("fast", "1gbyte", "10"):
        with pytest.raises(ValueError, match="rate"):
            parse_rate(bad)


@pytest.mark.parametrize("args, message", [
    (["nodes=0"], "must be >= 1"),
    (["speed=1gbit"], "unknown option speed="),
    (["rate=1gigabit"], "not a rate"),
    (["mtu=20"], "mtu=20"),
    (["rate=1gbit", "burst=100"], "below the MTU"),
    (["--module"], "needs a value"),
    (["--", "network.nodes=4"], "give nodes="),
])
def test_usage_errors_are_one_line_before_anything_exists(args, message, capsys, monkeypatch):
    monkeypatch.setattr(topo, "reserve", _must_not_be_called)
    assert emulate.main(args) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_refuses_without_root_or_iproute2(monkeypatch, capsys):
    monkeypatch.setattr(topo, "reserve", _must_not_be_called)
    monkeypatch.setattr("src.launch.netns.os.geteuid", lambda: 1000)
    assert emulate.main(["nodes=2", "--module", "src.launch.smoke"]) == 2
    err = capsys.readouterr().err
    assert "needs root" in err and err.count("\n") == 1
    monkeypatch.setattr("src.launch.netns.os.geteuid", lambda: 0)
    monkeypatch.setattr("src.launch.netns.shutil.which", lambda tool: None if tool == "tc" else "/usr/sbin/ip")
    with pytest.raises(EmulatorUnavailable, match="needs tc"):
        check_prerequisites()


def test_train_gets_the_emulated_network_config():
    opts = emulate.parse_args(["nodes=3", "nproc_per_node=1", "rate=100mbit", "--", "+exp=demo"])
    assert emulate.job_args(opts) == ["+exp=demo", "network=emulated", "network.nodes=3",
                                      "network.nproc_per_node=1", "network.rate=100mbit"]
    assert emulate.job_args(emulate.parse_args(["--", "network=local"])) == ["network=local"]
    assert emulate.job_args(emulate.parse_args(["--module", "src.launch.smoke", "--", "--numel", "8"])) == [
        "--numel", "8"]


@pytest.mark.parametrize("nodes, nproc, cpus, per_host, threads, shared", [
    (2, 1, [0, 1], 1, 1, False),           # this project's 2-core machine: one core per host
    (2, 2, [0, 1], 1, 1, True),            # 4 ranks on 2 cores: the ranks of a host share its core
    (2, 4, list(range(16)), 8, 2, False),
    (3, 1, list(range(8)), 2, 2, False),   # 2 cores left idle so the shares are equal
    (1, 3, [4, 5, 6, 7], 4, 1, False),
])
def test_hosts_get_disjoint_equal_shares_of_the_cores(nodes, nproc, cpus, per_host, threads, shared):
    share = cores.plan(nodes, nproc, cpus)
    assert len(share.hosts) == nodes and all(len(h) == per_host for h in share.hosts)
    flat = [c for h in share.hosts for c in h]
    assert len(set(flat)) == len(flat) and set(flat) <= set(cpus)
    assert share.threads_per_rank == threads and share.shared == shared
    assert (share.note() is not None) == shared
    if shared:
        assert "will share cores" in share.note() and "\n" not in share.note()


def test_more_hosts_than_cores_take_cores_in_turn():
    share = cores.plan(3, 1, [0, 1])
    assert share.hosts == ((0,), (1,), (0,)) and share.threads_per_rank == 1 and "3 ranks on 2" in share.note()
    assert cores.cpu_list([0, 1, 2, 3, 8, 10, 11]) == "0-3,8,10-11"


def test_default_threads_on_a_shared_machine_warn_once(monkeypatch, capsys):
    crowded = {"LOCAL_WORLD_SIZE": "2", "LOCAL_RANK": "0"}
    assert "OMP_NUM_THREADS=1" in rank_threads.oversubscription(crowded, threads=2, cores=2)
    assert rank_threads.oversubscription({**crowded, "OMP_NUM_THREADS": "2"}, threads=2, cores=2) is None
    assert rank_threads.oversubscription({**crowded, "LOCAL_WORLD_SIZE": "1"}, threads=2, cores=2) is None
    assert rank_threads.oversubscription(crowded, threads=1, cores=2) is None
    monkeypatch.setattr(rank_threads, "_warned", False)
    monkeypatch.setattr(rank_threads, "usable_cpus", lambda: [0])
    before = rank_threads.torch.get_num_threads()
    try:
        rank_threads.torch.set_num_threads(2)
        for _ in range(3):
            rank_threads.apply_thread_share(crowded)
        assert capsys.readouterr().err.count("compete for cores") == 1
        assert rank_threads.apply_thread_share({rank_threads.SHARE_VAR: "1", **crowded}) == 1
    finally:
        rank_threads.torch.set_num_threads(before)


def test_cores_option_is_checked():
    assert emulate.parse_args(["cores=all"]).cores == "all" and emulate.parse_args([]).cores == "share"
    with pytest.raises(emulate.UsageError, match="cores='some'"):
        emulate.parse_args(["cores=some"])


# --- with namespaces ----------------------------------------------------------------------------------------------
@needs_netns
def test_gloo_allreduce_crosses_the_cluster_and_teardown_is_complete(bystander):
    numel = 1 << 18
    proc = launch("nodes=2", "nproc_per_node=1", "rate=1gbit", "--module", "src.launch.smoke", "--",
                  "--numel", str(numel))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    lines = re.findall(r"\[h(\d)\] smoke: rank (\d)/2 allreduce ok .* sent (\d+) bytes", out)
    assert sorted((h, r) for h, r, _ in lines) == [("0", "0"), ("1", "1")], out
    for _, _, sent in lines:  # a 2-rank ring allreduce sends the whole buffer once over each host's link
        assert int(sent) >= 4 * numel, out
    assert "cannot be retrieved" not in out  # every host resolves the others' names (c10d's peer lookups)
    assert_gone(run_id_of(out))


@needs_netns
def test_a_failed_job_is_stopped_and_torn_down(bystander):
    proc = launch("nodes=2", "nproc_per_node=1", "rate=none", "--module", "src.launch.smoke", "--",
                  "--numel", "1024", "--fail-rank", "1")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "fails on purpose" in out and re.search(r"lcub: job exit code [1-9]", out), out
    assert_gone(run_id_of(out))


@needs_netns
@pytest.mark.slow  # 60-90 s on 2 cores; a failed job's teardown stays in make test
def test_sigint_stops_the_job_and_tears_down(bystander):
    popen = subprocess.Popen([sys.executable, "-m", "src.launch.emulate", "nodes=2", "nproc_per_node=1",
                              "rate=8mbit", "--module", "src.launch.smoke", "--", "--numel", str(1 << 24)],
                             cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen, deadline = [], time.monotonic() + 90
    while time.monotonic() < deadline:
        line = popen.stdout.readline()
        seen.append(line)
        if line.startswith("[h1]"):  # the cluster exists and torchrun runs on the last host
            break
    time.sleep(1.0)
    popen.send_signal(signal.SIGINT)
    rest, _ = popen.communicate(timeout=60)
    out = "".join(seen) + rest
    assert popen.returncode == 130, out
    assert "SIGINT received" in out
    assert_gone(run_id_of(out))


@needs_netns
def test_cleanup_removes_dead_runs_only(bystander):
    dead = topo.create_cluster(2, LinkSpec(rate=10**9))
    release_lock(dead.run_id, dead.lock_fd)  # its owner "crashed": the lock is free, the namespaces remain
    live = topo.create_cluster(1, LinkSpec(rate=None))
    try:
        proc = launch("--cleanup", timeout=60)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert_gone(dead.run_id)
        assert live.switch_ns in list_namespaces() and live.hosts[0].netns in list_namespaces()
        assert "live runs alone" in proc.stdout
    finally:
        assert topo.teardown(live) == []
    assert_gone(live.run_id)


@needs_netns
@pytest.mark.parametrize("nodes, nproc", [(2, 1), pytest.param(2, 2, marks=pytest.mark.slow)])
def test_each_host_owns_its_share_of_the_cores_as_the_ranks_see_it(nodes, nproc):
    proc = launch(f"nodes={nodes}", f"nproc_per_node={nproc}", "rate=none", "--module", "src.launch.smoke", "--",
                  "--numel", "1024")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    world = nodes * nproc
    seen = re.findall(rf"\[h(\d)\] smoke: rank (\d)/{world} allreduce ok .* cpus ([0-9,-]+) threads (\d+)", out)
    assert len(seen) == world, out
    expected = cores.plan(nodes, nproc)   # the launcher's own affinity is this process's
    per_host: dict[int, set[int]] = {}
    for host, _, cpus, threads in seen:   # what each rank read from os.sched_getaffinity and torch
        mine = {c for part in cpus.split(",") for c in _expand(part)}
        assert mine == set(expected.hosts[int(host)]), out
        assert int(threads) == expected.threads_per_rank, out
        per_host.setdefault(int(host), set()).update(mine)
    if nodes <= len(expected.usable):
        assert not set.intersection(*per_host.values()), out
    assert ("will share cores" in out) == expected.shared, out
    assert_gone(run_id_of(out))


def _expand(part: str) -> range:
    low, _, high = part.partition("-")
    return range(int(low), int(high or low) + 1)
