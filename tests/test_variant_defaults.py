"""The variant keys that have a default keep it in one file, conf/variant_defaults.yaml (src/optim/variant.py).

- A variant written before a key existed (no `overlap`, no `kernels`) composes, validates and builds its optimizer
  with the defaults, and a real `python -m src.train` run of such a user variant file trains and records them in its
  config.yaml (the fill happens in the composed config, before anything is checked or recorded).
- A key with no default (`reducer`, `comm_dtype`, ...) is still refused by name when left out, and a key the
  optimizer does not take is still refused, also one that has a default for other optimizers.
"""
from __future__ import annotations

import json

import pytest
import torch
import yaml
from harness_util import REPO, cfg_with, train_tiny
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from src.engine.schema import parse_config
from src.errors import SetupError
from src.optim import variant as variant_module
from src.optim.momentum_sync import MomentumSync
from src.optim.variant import ALWAYS, KEYS, Variant

CUB4 = yaml.safe_load((REPO / "conf/variant/cub4.yaml").read_text())
# user variants as written before `overlap` and `kernels` existed
OLD_CUB = {"name": "old_cub4", "optimizer": "lion_cub", "reducer": CUB4["reducer"],
           "momentum_sync": {"every": 0, "layers": "none"}}
OLD_LION32 = {"name": "old_lion32", "optimizer": "lion_grad_allreduce", "comm_dtype": "fp32"}
DEFAULTS = {"overlap": False, "kernels": "auto", "momentum_sync": {"every": 0, "layers": "none"},
            "hierarchy": "flat"}


def user_conf(tmp_path, **variants) -> str:
    """A config folder of the user's own variants (conf/variant/ layout), for Hydra's search path."""
    (tmp_path / "variant").mkdir(parents=True, exist_ok=True)
    for name, body in variants.items():
        (tmp_path / "variant" / f"{name}.yaml").write_text(yaml.safe_dump(body, sort_keys=False))
    return str(tmp_path)


def compose_user(conf: str, *overrides: str):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        return compose(config_name="config", overrides=[f"hydra.searchpath=[file://{conf}]", *overrides])


def test_the_defaults_have_one_home():
    found = OmegaConf.to_container(OmegaConf.load(REPO / "conf/variant_defaults.yaml"))
    assert found == DEFAULTS
    assert not set(found) & {*ALWAYS, "reducer", "comm_dtype"}  # the keys with no sensible default stay required
    assert variant_module.defaults("lion_cub") == DEFAULTS
    assert variant_module.defaults("lion_grad_allreduce") == {"kernels": "auto", "hierarchy": "flat"}
    assert variant_module.defaults("ddp") == {} and variant_module.defaults("nope") == {}
    assert all(set(variant_module.defaults(kind)) <= KEYS[kind] for kind in KEYS)


@pytest.mark.parametrize("shipped, keys", [("cub4", ("overlap", "kernels", "momentum_sync")), ("lion32", ("kernels",))])
def test_a_shipped_variant_without_the_keys_gets_the_same_values(shipped, keys):
    full = parse_config(cfg_with(f"variant={shipped}")).variant
    assert parse_config(cfg_with(f"variant={shipped}", *(f"~variant.{k}" for k in keys))).variant == full


def test_an_old_variant_file_composes_and_validates_with_the_defaults(tmp_path):
    conf = user_conf(tmp_path, old_cub4=OLD_CUB, old_lion32=OLD_LION32)
    cfg = compose_user(conf, "variant=old_cub4")
    assert "kernels" not in cfg.variant and "overlap" not in cfg.variant
    job = parse_config(cfg)
    assert (job.variant.overlap, job.variant.kernels) == (False, "auto")
    assert job.variant.momentum_sync == MomentumSync(every=0, layers="none")
    record = OmegaConf.to_container(cfg.variant, resolve=True)  # what config.yaml is written from
    assert record == {**OLD_CUB, "overlap": False, "kernels": "auto", "hierarchy": "flat"}
    assert Variant.parse(OLD_CUB) == job.variant  # a library caller's mapping: the same object
    assert OLD_CUB.keys() == {"name", "optimizer", "reducer", "momentum_sync"}  # the caller's mapping is left as is

    lion = parse_config(compose_user(conf, "variant=old_lion32")).variant
    assert (lion.kernels, lion.overlap, lion.momentum_sync) == ("auto", None, None)  # only the keys it takes
    # a value the variant gives is kept; null counts as left out
    assert parse_config(compose_user(conf, "variant=old_cub4", "+variant.kernels=torch")).variant.kernels == "torch"
    assert parse_config(cfg_with("variant=cub4", "variant.kernels=null")).variant.kernels == "auto"


def _build(variant: dict):
    from src.optim.factory import build_optimizer, validate_variant

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 4))
    validate_variant(variant, world_size=1, model=model)
    opt = build_optimizer(model, variant, lr=1e-3, betas=(0.9, 0.99), weight_decay=0.0)
    return opt.kernel_choice.requested, getattr(opt, "overlap_mode", None), getattr(opt, "momentum_sync", None)


def test_the_built_optimizers_get_the_defaults(dist):
    cub, = dist(1, _build, OLD_CUB)
    assert cub == ("auto", "false", MomentumSync(every=0, layers="none"))
    lion, = dist(1, _build, OLD_LION32)
    assert lion[0] == "auto"


def test_a_user_variant_file_trains(demo_tokens, tmp_path):
    """`python -m src.train` with a variant file of the user's own (outside conf/, through --config-dir and a
    primary config that picks it) that has no `overlap` and no `kernels`."""
    conf = user_conf(tmp_path / "conf", old_cub4=OLD_CUB)
    (tmp_path / "conf" / "mine.yaml").write_text("defaults:\n  - config\n  - override variant: old_cub4\n  - _self_\n")
    run_dir = tmp_path / "run"
    args = ["--config-dir", conf, "--config-name", "mine", f"data.dir={demo_tokens}", "model=gpt_tiny",
            "data.block_size=16", "data.batch_size=2", "train.steps=1", "train.eval_batches=1", "train.progress=false",
            "train.compile=false", f"run.dir={run_dir}"]
    proc = train_tiny(args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    recorded = yaml.safe_load((run_dir / "config.yaml").read_text())["variant"]
    assert recorded == {**OLD_CUB, "overlap": False, "kernels": "auto", "hierarchy": "flat"}
    assert json.loads((run_dir / "summary.json").read_text())["kernels"]["requested"] == "auto"


@pytest.mark.parametrize("body, line", [
    ({k: v for k, v in OLD_CUB.items() if k != "reducer"},
     "variant 'old_cub4': missing key(s) reducer; optimizer 'lion_cub' takes hierarchy, kernels, momentum_sync, name, "
     "optimizer, overlap, reducer (conf/variant/ holds an example of each; hierarchy, kernels, momentum_sync, overlap "
     "may be left out: conf/variant_defaults.yaml holds their defaults)"),
    ({k: v for k, v in OLD_LION32.items() if k != "comm_dtype"},
     "variant 'old_lion32': missing key(s) comm_dtype; optimizer 'lion_grad_allreduce' takes comm_dtype, hierarchy, "
     "kernels, name, optimizer (conf/variant/ holds an example of each; hierarchy, kernels may be left out: "
     "conf/variant_defaults.yaml holds their defaults)"),
])
def test_a_required_key_left_out_is_refused_by_name(tmp_path, body, line):
    conf = user_conf(tmp_path, user=body)
    with pytest.raises(SetupError) as err:
        parse_config(compose_user(conf, "variant=user"))
    assert str(err.value) == line
    with pytest.raises(ValueError) as err:
        Variant.parse(body)
    assert str(err.value) == line


@pytest.mark.parametrize("body, engine, library", [
    ({**OLD_CUB, "kernel": "auto"}, "variant.kernel='auto': unknown key; did you mean variant.kernels?",
     "variant 'old_cub4': key(s) kernel do not apply to optimizer 'lion_cub'"),
    ({**OLD_LION32, "overlap": False}, *["variant 'old_lion32': key(s) overlap do not apply to optimizer "
                                         "'lion_grad_allreduce'"] * 2),  # a default of lion_cub's, not of this one
])
def test_an_unknown_key_is_refused(tmp_path, body, engine, library):
    conf = user_conf(tmp_path, user=body)
    with pytest.raises(SetupError) as err:
        parse_config(compose_user(conf, "variant=user"))
    assert str(err.value).startswith(engine) and "\n" not in str(err.value), str(err.value)
    with pytest.raises(ValueError) as err:
        Variant.parse(body)
    assert str(err.value).startswith(library), str(err.value)
    ddp = parse_config(cfg_with("variant=ddp_lion")).variant  # an optimizer with no defaults gets none
    assert (ddp.overlap, ddp.kernels, ddp.momentum_sync) == (None, None, None)


def test_a_typo_in_the_defaults_file_is_refused(tmp_path, monkeypatch):
    bad = tmp_path / "variant_defaults.yaml"
    bad.write_text("kernel: auto\n")
    monkeypatch.setattr(variant_module, "DEFAULTS_FILE", bad)
    variant_module._defaults_file.cache_clear()
    try:
        with pytest.raises(ValueError, match="key.s. kernel are no optimizer's variant keys"):
            Variant.parse(OLD_CUB)
    finally:
        monkeypatch.undo()
        variant_module._defaults_file.cache_clear()
