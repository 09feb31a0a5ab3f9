"""The emulated Ethernet cluster (src/launch; Lion Cub Section 7's "Ethernet" setting): a gloo allreduce crosses
it with the right result, and teardown removes exactly what a run created, after success, a failed job or a
signal; `--cleanup` removes dead runs' leftovers only; without root or iproute2 it refuses in one line.

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

from src.launch import cluster as topo
from src.launch import emulate
from src.launch.netns import (EmulatorUnavailable, LinkSpec, check_prerequisites, format_rate, list_namespaces,
                              lock_path, parse_rate, release_lock, root_links, run_cmd)

REPO = Path(__file__).resolve().parents[1]
BYSTANDER = f"lcubtest-bystander-{os.getpid()}"   # an unrelated namespace that looks a bit like ours


def _unavailable() -> str | None:
    try:
        check_prerequisites()
    except EmulatorUnavailable as exc:
        return str(exc)
    return None


needs_netns = pytest.mark.skipif(_unavailable() is not None, reason=f"emulated cluster unavailable: {_unavailable()}")


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
