"""The configuration is parsed once into typed sections (src.engine.schema.parse_config), and every value of those
sections has one home: the YAML under conf/ (docs/architecture.md, "Configuration").

- The typed objects hold exactly the values of the composed YAML (Hydra's compose API, as `python -m src.train`):
  every variant and network option, the reliability, logger, train and optim sections.
- The sections' dataclasses have no defaults for the keys a YAML gives, and the code has no literal fallback
  (`.get("bucket_cap_mb", 25)`, `getattr(x, "timeout_s", 1800)`) for any of their keys.
- The parse refuses a bad or missing value in one line naming the key and what is allowed.
"""
from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
from harness_util import REPO, cfg_with
from omegaconf import OmegaConf

from src.comm.cost.network import Network
from src.engine.schema import Config, Optim, Train, parse_config
from src.errors import SetupError
from src.optim.variant import Variant
from src.reliability.config import Checkpoint, Fault, Guard, NonFinite
from src.runlog.sinks import Logger
from src.stats.config import StatsConfig

VARIANTS = sorted(p.stem for p in (REPO / "conf/variant").glob("*.yaml"))
NETWORKS = sorted(p.stem for p in (REPO / "conf/network").glob("*.yaml"))
SECTIONS = {"variant": Variant, "network": Network, "checkpoint": Checkpoint, "guard": Guard,
            "nonfinite": NonFinite, "fault": Fault, "logger": Logger, "train": Train, "optim": Optim}


def _as_record(value):
    """A typed value as the resolved YAML writes it (nested dataclasses as mappings)."""
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value


def _check_section(cfg, key: str) -> None:
    typed, given = getattr(parse_config(cfg), key), OmegaConf.to_container(cfg[key], resolve=True)
    assert isinstance(typed, SECTIONS[key])
    for field in dataclasses.fields(typed):  # every key the YAML gives, and None for one it leaves out
        assert _as_record(getattr(typed, field.name)) == given.get(field.name), (key, field.name)

@pytest.mark.parametrize("variant", VARIANTS)
def test_each_variant_is_typed_with_its_yamls_values(variant):
    _check_section(cfg_with(f"variant={variant}"), "variant")


@pytest.mark.parametrize("network", NETWORKS)
def test_each_network_is_typed_with_its_yamls_values(network, monkeypatch):
    monkeypatch.setenv("LIONCUB_LINK_RATE", "123000000")  # the paper-equivalent links read their rate from it
    _check_section(cfg_with(f"network={network}"), "network")


@pytest.mark.parametrize("key", ["checkpoint", "guard", "nonfinite", "fault", "logger", "train", "optim"])
def test_the_other_sections_are_typed_with_the_yamls_values(key):
    _check_section(cfg_with("+exp=gpt774m_4bit"), key)  # a paper preset: W&B logger, conf/reliability/paper.yaml


def test_the_named_values_come_from_the_yaml_alone():
    assert parse_config(cfg_with("variant=ddp_lion")).variant.bucket_cap_mb == 25.0
    assert parse_config(cfg_with("variant=ddp_lion", "variant.bucket_cap_mb=50")).variant.bucket_cap_mb == 50.0
    assert parse_config(cfg_with("variant=lion16")).variant.comm_dtype == "bf16"
    assert parse_config(cfg_with("network=local")).network.timeout_s == 600
    assert parse_config(cfg_with("network=ethernet")).network.timeout_s == 1800
    assert parse_config(cfg_with()).train.compile == "auto"
    assert parse_config(cfg_with("train.compile=false")).train.compile is False


def _no_defaults(schema) -> list[str]:
    """The fields of `schema` (and of its nested sections) that carry a default: none may."""
    found = []
    for field in dataclasses.fields(schema):
        if field.default is not dataclasses.MISSING or field.default_factory is not dataclasses.MISSING:
            found.append(f"{schema.__name__}.{field.name}")
    return found


def test_the_sections_have_no_defaults_of_their_own():
    assert [f for schema in (*SECTIONS.values(), Config, StatsConfig) for f in _no_defaults(schema)] == []


# every key of the typed sections: no code reads one of them with a fallback value
KEYS = {f.name for schema in (*SECTIONS.values(), Config) for f in dataclasses.fields(schema)}
GENERIC = {"name"}  # the label of a variant in the message that refuses it ("variant '?'" when it has none)
READERS = ("src/optim", "src/comm", "src/distributed", "src/engine", "src/reliability", "src/runlog/sinks.py",
           "src/runlog/wandb_logger.py", "src/runlog/run_dir.py", "src/train.py")


def _fallbacks(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if not isinstance(node, ast.Call):
            continue
        getter = isinstance(node.func, ast.Attribute) and node.func.attr == "get" and len(node.args) == 2
        attr = isinstance(node.func, ast.Name) and node.func.id == "getattr" and len(node.args) == 3
        key = node.args[1 if attr else 0] if getter or attr else None
        if isinstance(key, ast.Constant) and key.value in KEYS - GENERIC:
            found.append(f"{path}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_code_falls_back_to_a_value_of_its_own():
    files = [p for reader in READERS for p in ((REPO / reader).rglob("*.py") if (REPO / reader).is_dir()
                                                else [REPO / reader])]
    assert len(files) > 50
    assert [f for path in files for f in _fallbacks(path)] == []


def test_the_fallback_scan_finds_one(tmp_path):  # the scan above can fail
    probe = tmp_path / "probe.py"
    probe.write_text('timeout = network.get("timeout_s", 1800)\nx = getattr(v, "bucket_cap_mb", 25)\n'
                     'y = network.get("timeout_s")\n')
    assert len(_fallbacks(probe)) == 2


# --- the parse's errors: one line naming the key and what is allowed -----------------------------------------------

@pytest.mark.parametrize("overrides, line", [
    (["variant=lion32", "variant.comm_dtype=fp8"], "variant.comm_dtype='fp8': must be one of fp32, bf16, fp16"),
    (["variant=ddp_lion", "variant.comm_hook=int8"], "variant.comm_hook='int8': must be one of none, bf16, fp16"),
    (["variant=ddp_lion", "variant.bucket_cap_mb=0"], "variant.bucket_cap_mb=0: must be a number > 0 (MiB)"),
    (["variant=ddp_lion", "~variant.bucket_cap_mb"], "variant 'ddp_lion': missing key(s) bucket_cap_mb; optimizer "
                                                     "'ddp' takes bucket_cap_mb, comm_hook, inner, name, optimizer"),
    (["variant=cub4", "+variant.comm_dtype=bf16"], "variant 'cub4': key(s) comm_dtype do not apply to optimizer "
                                                   "'lion_cub'"),
    (["variant=cub4", "variant.momentum_sync.every=5"], "momentum_sync every=5 with layers='none' is inconsistent"),
    (["network.timeout_s=0"], "network.timeout_s=0: must be an integer >= 1"),
    (["~network.timeout_s"], "network.timeout_s: missing (must be an integer >= 1)"),
    (["network.backend=mpi"], "network.backend='mpi': must be one of auto, gloo, nccl"),
    (["checkpoint.keep=0"], "checkpoint.keep=0: must be an integer >= 1"),
    (["nonfinite.policy=ignore"], "nonfinite.policy='ignore': must be one of skip, stop"),
    (["train.steps=0"], "train.steps=0: must be an integer >= 1"),
    (["train.compile=yes"], "train.compile='yes': must be auto, true or false"),
    (["train.compile=1"], "train.compile=1: must be auto, true or false"),
    (["logger.name=tensorboard"], "logger.name='tensorboard': must be one of local, none, wandb"),
])
def test_a_bad_or_missing_value_is_one_named_line(overrides, line):
    with pytest.raises(SetupError) as err:
        parse_config(cfg_with(*overrides))
    assert str(err.value).startswith(line) and "\n" not in str(err.value), str(err.value)


def test_a_mapping_given_to_the_library_is_parsed_the_same_way():
    local = OmegaConf.to_container(cfg_with("network=local").network, resolve=True)
    assert Network.parse(local) == parse_config(cfg_with("network=local")).network
    with pytest.raises(ValueError, match="network.timeout_s: missing"):
        Network.parse({k: v for k, v in local.items() if k != "timeout_s"})
    cub4 = OmegaConf.to_container(cfg_with("variant=cub4").variant, resolve=True)
    assert Variant.parse(cub4) == parse_config(cfg_with("variant=cub4")).variant
