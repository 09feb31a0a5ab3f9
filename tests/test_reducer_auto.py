"""`reducer: auto` (Lion Cub, Section 6: the datatype from p and the world size): the choice follows Table 1's
model, the fit file is read or the network config's alpha/beta are used (saying so), bad files and keys stop the run
before it starts, and the chosen reducer trains bitwise like its explicit variant on real gloo ranks."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as tdist
import yaml
from harness_util import REPO, TORCHRUN_VARS, cfg_with, one_process  # noqa: F401 (fixture)

from device_double import HostMonitor, watch_collectives
from src.comm import make_reducer
from src.comm.reducers.auto import CANDIDATES, choose_reducer
from src.comm.cost.model import cost
from src.comm.cost.network import Network
from src.comm.cost.network_fit import NetworkCosts, network_costs, read_network_fit, write_network_fit
from src.engine.run import preflight
from src.engine.schema import config_problems
from src.errors import SetupError
from src.optim import LionCub
from src.optim.factory import build_optimizer, parameter_groups, validate_variant

N = 48_700_000
AUTO = yaml.safe_load((REPO / "conf/variant/cub_auto.yaml").read_text())



def net(**keys) -> Network:
    """A network section: conf/network/local.yaml's required keys with `keys` replacing or adding to them."""
    local = yaml.safe_load((REPO / "conf/network/local.yaml").read_text())
    return Network.parse({k: local[k] for k in ("name", "backend", "loopback", "timeout_s", "env")} | keys)

def terms(choice, name):
    """(latency coefficient, bandwidth bits) of a candidate at the choice's world size and numel."""
    bits = choice.widths[name]
    args = {"bits": bits} if name == "pbit" else {"word_size": bits} if name.startswith("ps_") else {}
    return (cost(name, choice.world_size, choice.numel, 1.0, 0.0, **args).latency,
            cost(name, choice.world_size, choice.numel, 0.0, 1.0, **args).bandwidth)


@pytest.mark.parametrize("world_size", [2, 3, 4, 8, 16, 64])
def test_bandwidth_bound_network_picks_the_fewest_bytes(world_size):
    choice = choose_reducer(AUTO["reducer"], world_size, N, NetworkCosts(1e-12, 1e-6, "test"))
    fewest = min(CANDIDATES, key=lambda n: terms(choice, n)[1])
    assert choice.name == fewest == "onebit"
    assert choice.predicted_s[choice.name] == min(choice.predicted_s.values())


@pytest.mark.parametrize("world_size", [4, 8, 16, 64])
def test_latency_bound_network_picks_the_fewest_rounds(world_size):
    choice = choose_reducer(AUTO["reducer"], world_size, N, NetworkCosts(10.0, 1e-15, "test"))
    rounds = {n: terms(choice, n)[0] for n in CANDIDATES}
    assert rounds[choice.name] == min(rounds.values())
    assert choice.name == "pbit"  # as few rounds as ps_tree, fewer bits on the wire


@pytest.mark.parametrize("world_size,bits", [(1, 1), (2, 2), (3, 2), (4, 4), (15, 4), (16, 8), (255, 8), (256, 16),
                                             (32767, 16)])
def test_field_width_is_the_narrowest_that_holds_the_votes(world_size, bits):
    choice = choose_reducer(AUTO["reducer"], world_size, N, NetworkCosts(10.0, 0.0, "test"))  # ties: pbit first
    assert (choice.name, choice.bits) == ("pbit", bits)
    built = make_reducer(**choice.options, world_size=world_size, rank=0)
    assert built.bits == bits  # the reducer neither widens it further nor refuses it
    if bits > 1:  # one width narrower would overflow
        assert world_size > (1 << (bits // 2)) - 1


def test_the_choice_is_logged_with_every_prediction():
    choice = choose_reducer(AUTO["reducer"], 2, N, NetworkCosts(2.02e-3, 9.45e-10, "fit.json"))
    line = choice.log_line()
    assert line.startswith(f"lioncub: reducer auto -> {choice.name}")
    assert all(name in line for name in CANDIDATES) and "world_size=2, 48.7M parameters" in line
    assert "alpha=0.00202 s, beta=9.45e-10 s/bit from fit.json" in line
    record = choice.record()
    assert record["chosen"] == choice.name and set(record["predicted_s"]) == set(CANDIDATES)
    assert record["reducer"]["bits"] == choice.bits and record["source"] == "fit.json"


@pytest.mark.parametrize("options,match", [({"bits": 4}, "auto picks the field width"),
                                           ({"quant": "l1"}, "needs quant in"), ({"vote": "average"}, "needs vote"),
                                           ({"zeros": "keep"}, "needs zeros"), ({"levles": 2}, "does not take")])
def test_bad_auto_options_are_refused(options, match):
    variant = {**AUTO, "reducer": {**AUTO["reducer"], **options}}
    with pytest.raises(ValueError, match=match):
        validate_variant(variant, 2, network=net(name="x", fit=None, alpha=1e-3, beta=1e-9))


# --- the network's alpha and beta ----------------------------------------------------------------------------------

def test_fit_file_is_read_and_a_missing_one_falls_back_saying_so(tmp_path):
    path = tmp_path / "network_fit_1gbit.json"
    network = net(name="emulated", fit=str(path), alpha=2.02e-3, beta=9.45e-10)
    fallback = network_costs(network)
    assert (fallback.alpha, fallback.beta) == (2.02e-3, 9.45e-10)
    assert "network config 'emulated'" in fallback.source and f"{path} not found" in fallback.source
    write_network_fit(path, 1.5e-3, 1e-9, rate="1gbit")
    assert network_costs(network) == NetworkCosts(1.5e-3, 1e-9, str(path)) == read_network_fit(path)
    with pytest.raises(ValueError, match="no usable network.alpha"):
        network_costs(net(name="x", fit=None, alpha=None, beta=None))


@pytest.mark.parametrize("text,match", [("{not json", "not valid JSON"), ("[1, 2]", "JSON list, not an object"),
                                        ('{"alpha": 1e-3}', "has no beta"),
                                        ('{"alpha": "fast", "beta": 1e-9}', "alpha='fast'"),
                                        ('{"alpha": -1, "beta": 1e-9}', "alpha=-1"),
                                        ('{"alpha": 0, "beta": 0}', "both 0")])
def test_malformed_fit_file_is_named_with_what_is_wrong(tmp_path, text, match):
    path = tmp_path / "fit.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=match) as info:
        network_costs(net(name="x", fit=str(path), alpha=1e-3, beta=1e-9))
    assert str(path) in str(info.value)


def test_schema_accepts_the_new_keys_and_refuses_bad_ones():
    assert config_problems(cfg_with("variant=cub_auto", "network=emulated")) == []
    assert config_problems(cfg_with("variant=cub_auto", "network=infiniband", "network.fit=/x/fit.json")) == []
    found = config_problems(cfg_with("variant=cub_auto", "network.alpha=-1", "network.beta=fast",
                                     "+network.fitt=x"))
    assert any(p.startswith("network.alpha=-1") for p in found)
    assert any(p.startswith("network.beta='fast'") or p.startswith("network.beta=fast") for p in found)
    assert any("network.fitt" in p and "unknown key" in p for p in found)


def test_preflight_refuses_a_malformed_file_and_bad_options(demo_tokens, tmp_path, one_process):  # noqa: F811
    bad = tmp_path / "bad.json"
    bad.write_text('{"alpha": 1e-3}')
    with pytest.raises(SetupError, match=f"variant=cub_auto with 1 process.*{bad}.*has no beta"):
        preflight(cfg_with(f"data.dir={demo_tokens}", "variant=cub_auto", f"network.fit={bad}"))
    with pytest.raises(SetupError, match="auto picks the field width"):
        preflight(cfg_with(f"data.dir={demo_tokens}", "variant=cub_auto", "+variant.reducer.bits=4"))


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**{k: v for k, v in os.environ.items() if k not in TORCHRUN_VARS}, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "src.train", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=240, check=False)


def test_cli_malformed_fit_file_exits_2_before_training(demo_tokens, tmp_path):
    bad = tmp_path / "network_fit_1gbit.json"
    bad.write_text("{alpha: 1e-3")
    proc = _cli("variant=cub_auto", f"network.fit={bad}", f"data.dir={demo_tokens}", f"run.root={tmp_path / 'runs'}")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "lioncub: cannot start training:" in proc.stderr and str(bad) in proc.stderr
    assert "not valid JSON" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "runs").exists()


def test_cli_run_logs_and_records_the_choice(demo_tokens, tmp_path):
    missing = tmp_path / "network_fit_none.json"
    run_dir = tmp_path / "run"
    proc = _cli("variant=cub_auto", "variant.kernels=torch", f"network.fit={missing}", f"run.dir={run_dir}",
                f"data.dir={demo_tokens}", "model=gpt_tiny", "data.block_size=16", "data.batch_size=2",
                "train.steps=1", "train.eval_batches=1", "train.progress=false")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("lioncub: reducer auto -> "))
    assert "world_size=1" in line and "network config 'local'" in line and f"{missing} not found" in line
    record = json.loads((run_dir / "summary.json").read_text())["reducer_auto"]
    assert record["chosen"] in CANDIDATES and record["world_size"] == 1 and record["alpha"] == 1.56e-3
    assert record["numel"] == json.loads((run_dir / "summary.json").read_text())["model_parameters"]


# --- 2 gloo ranks: auto trains bitwise like the chosen reducer's explicit variant ---------------------------------

def _train(variant: dict, network, steps: int = 4):
    rank = tdist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(7, 13), torch.nn.Tanh(), torch.nn.Linear(13, 3))
    if network is None:  # the explicit reducer, built directly (not through the factory under test)
        opt = LionCub(parameter_groups(model, 0.1), lr=1e-2, betas=(0.9, 0.99), weight_decay=0.1,
                      reducer=variant["reducer"])
    else:
        opt = build_optimizer(model, variant, lr=1e-2, betas=(0.9, 0.99), weight_decay=0.1, network=network)
    monitor = HostMonitor()
    for step in range(1, steps + 1):
        g = torch.Generator().manual_seed(100 * step + rank)
        x, y = torch.randn(5, 7, generator=g), torch.randn(5, 3, generator=g)
        opt.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        with watch_collectives(monitor):
            opt.step()
    choice = getattr(opt, "reducer_choice", None)
    built = (opt.reducer.name, opt.reducer.bits)
    return [p.detach().clone() for p in model.parameters()], choice and choice.record(), monitor.violations, built


@pytest.mark.parametrize("alpha,beta,expected", [(1e-6, 1e-6, ("onebit", 1)), (1e-3, 0.0, ("pbit", 2))])
def test_auto_trains_bitwise_like_the_chosen_variant(dist, tmp_path, alpha, beta, expected):
    path = tmp_path / "fit.json"
    write_network_fit(path, alpha, beta)
    network = net(name="test", fit=str(path), alpha=None, beta=None)
    auto = {**AUTO, "reducer": {**AUTO["reducer"], "chunk": 32}, "kernels": "torch"}
    outs = dist(2, _train, auto, network)
    record = outs[0][1]
    assert (record["chosen"], record["bits"]) == expected and record["source"] == str(path)
    assert outs[1][1] == record and outs[0][2] == outs[1][2] == []
    assert outs[0][3] == outs[1][3] == expected  # the reducer built is the one recorded
    explicit = {"reducer": record["reducer"]}
    for (auto_params, _, _, _), (explicit_params, none, _, built) in zip(outs, dist(2, _train, explicit, None)):
        assert none is None and built == expected
        assert all(torch.equal(a, b) for a, b in zip(auto_params, explicit_params))
    assert not all(torch.equal(a, b) for a, b in zip(outs[0][0], _initial()))  # it did train


def _initial():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(7, 13), torch.nn.Tanh(), torch.nn.Linear(13, 3))
    return [p.detach() for p in model.parameters()]
