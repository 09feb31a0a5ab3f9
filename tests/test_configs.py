"""Every preset of conf/exp/ composes, names its figure/table, builds its model (meta device) and opens its data.

Section 7 and the appendix of the Lion Cub paper; hyperparameters of Appendix D. Models are built on the meta
device (no memory), data configs are opened on small stand-ins: the demo corpus for GPT presets, a synthetic
CIFAR100 folder for vision presets (only `data.dir` / `data.root` are overridden).
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException, MissingConfigException

from src.distributed.process_group import DistContext
from src.engine.compile import check_compile
from src.engine.schema import config_problems
from src.engine.tasks import make_task
from src.models import count_parameters
from src.optim.factory import validate_variant

CONF = Path(__file__).resolve().parents[1] / "conf"
PRESETS = sorted(p.stem for p in (CONF / "exp").glob("*.yaml"))
PAPER_WORKERS = 8  # Fig. 12: 8 workers on 2 nodes
# presets of the neighbouring papers (docs/baselines.md): their own hyperparameters, checked by test_baseline_presets_*
BASELINE_PRESETS = {"gpt350m_adamw32": "adamw32", "gpt350m_dlion_mavo": "dlion_mavo",
                    "gpt350m_dlion_avg": "dlion_avg", "gpt350m_bitdp2": "bitdp2", "gpt350m_bitdp_fp32": "adamw32",
                    "resnet18_onebit_adam": "onebit_adam", "resnet18_adamw32": "adamw32"}


def compose_cfg(overrides: list[str]):
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        return compose(config_name="config", overrides=overrides)


def ctx_for(world_size: int) -> DistContext:
    return DistContext(rank=0, local_rank=0, world_size=world_size, local_world_size=min(world_size, 4),
                       device=torch.device("cpu"), backend="gloo", network="test")


@pytest.fixture(scope="session")
def synthetic_cifar(tmp_path_factory):
    from src.data import make_synthetic_cifar

    root = tmp_path_factory.mktemp("cifar")
    return make_synthetic_cifar(root, num_classes=100, n_train=1100, n_test=100, seed=0)  # 1024 = 128 x 8


def test_there_is_a_preset_for_every_experiment():
    expected = {f"gpt{s}_{v}" for s in ("350m", "774m") for v in ("lion32", "lion16", "8bit", "4bit", "1bit")}
    expected |= {f"gpt1558m_{v}" for v in ("lion32", "8bit", "4bit")}
    expected |= {"gpt774m_4bit_synchead", "gpt774m_4bit_syncall", "gpt774m_4bit_syncmlp", "gpt774m_4bit_syncattn",
                 "gpt774m_4bit_syncembedhead", "resnet18_lion32", "resnet18_1bit", "deit_tiny_lion32",
                 "deit_tiny_1bit", "demo", "gpt1558m_ddp_lion32", *BASELINE_PRESETS}
    assert expected <= set(PRESETS), sorted(expected - set(PRESETS))


@pytest.mark.parametrize("name", PRESETS)
def test_preset_header_names_its_figure_or_table(name):
    text = (CONF / "exp" / f"{name}.yaml").read_text()
    assert text.startswith("# @package _global_\n")
    header = "".join(line for line in text.splitlines()[1:4] if line.startswith("#"))
    assert re.search(r"Fig\. \w|Table A\.1|Table \d|make demo", header), header


def _open_data(cfg, task, model, demo_tokens, synthetic_cifar):
    if cfg.data.kind == "tokens":
        cfg.data.dir = str(demo_tokens)
    else:
        cfg.data.root = str(synthetic_cifar)
        cfg.data.num_workers = 0
    task.open_data(model)
    batch = task.next_batch() if cfg.data.kind == "tokens" else None
    if batch is not None:
        assert tuple(batch[0].shape) == (cfg.data.batch_size, cfg.data.block_size)


@pytest.mark.parametrize("name", PRESETS)
def test_preset_builds_model_and_data(name, demo_tokens, synthetic_cifar):
    cfg = compose_cfg([f"+exp={name}"] + (["model.params.pretrained_path=null"] if "deit_tiny" in name else []))
    assert config_problems(cfg) == []  # the typed schema accepts every preset
    cpu = name in ("demo", "laptop")  # the CPU presets; the others are the paper's
    assert cfg.checkpoint.every == (0 if cpu else 500)  # paper presets checkpoint periodically
    ctx = ctx_for(PAPER_WORKERS if not cpu else 2)
    task = make_task(cfg, ctx)
    model = task.build_model("meta")
    task.check_model(model)
    validate_variant(cfg.variant, ctx.world_size, model)
    assert cfg.train.compile == "auto"  # compiled on the paper's GPUs, eager on a laptop (src/engine/compile.py)
    check_compile(cfg.train.compile, cfg.variant.get("overlap"))  # only Lion Cub variants have the key
    if name != "laptop":  # its compact-vocabulary corpus is opened by tests/test_laptop_corpus.py
        _open_data(cfg, task, model, demo_tokens, synthetic_cifar)
    size = re.match(r"gpt(\d+)m_", name)
    if size:  # the parameter count matches the name (GPT-2 sizes count the head tied to the embedding)
        head = 0 if cfg.model.params.tie_embeddings else model.lm_head.weight.numel()
        assert count_parameters(model) - head == pytest.approx(int(size.group(1)) * 1e6, rel=0.02)


@pytest.mark.parametrize("name", [p for p in PRESETS if p.startswith("gpt") and p not in BASELINE_PRESETS])
def test_gpt_presets_use_appendix_d1_hyperparameters(name):
    cfg = compose_cfg([f"+exp={name}"])
    big = name.startswith("gpt1558m")
    assert cfg.optim.lr == (1e-5 if big else 6e-5)
    assert (cfg.optim.beta1, cfg.optim.clip, cfg.optim.weight_decay) == (0.9, 1.0, 1.0)
    assert (cfg.data.batch_size, cfg.data.block_size) == ((8 if big else 12), 1024)
    assert cfg.data.kind == "tokens" and cfg.network.name in ("ethernet", "infiniband")
    assert cfg.optim.beta2 == (0.95 if ("b095" in name or ("sync" in name and "b099" not in name)) else 0.99)
    if "sync" in name:
        assert cfg.variant.momentum_sync.every == 10 and cfg.variant.momentum_sync.layers != "none"


@pytest.mark.parametrize("name", [p for p in PRESETS if p.startswith(("resnet", "deit")) and p not in BASELINE_PRESETS])
def test_vision_presets_use_appendix_d2_hyperparameters(name):
    cfg = compose_cfg([f"+exp={name}"])
    assert (cfg.optim.lr, cfg.optim.schedule, cfg.optim.weight_decay, cfg.optim.beta1) == (3e-4, "cosine", 1e-4, 0.9)
    assert cfg.train.epochs == (100 if name.startswith("resnet") else 20)
    assert cfg.data.img_size == (32 if name.startswith("resnet") else 224)


@pytest.mark.parametrize("name", sorted(BASELINE_PRESETS))
def test_baseline_presets_use_their_papers_hyperparameters(name):
    """Distributed Lion Sec. 5 (GPT2++ 350M), BitDP Sec. 4.1 (GPT 350M), 1-bit Adam Sec. 7.2 (ResNet-18)."""
    cfg = compose_cfg([f"+exp={name}"])
    o = cfg.optim
    assert cfg.variant.name == BASELINE_PRESETS[name]
    if "dlion" in name:
        assert (o.lr, o.beta1, o.beta2, o.weight_decay, cfg.data.batch_size, cfg.train.steps) == \
            (9e-5, 0.9, 0.99, 1.0, 15, 14000)
    elif name == "gpt350m_adamw32":
        assert (o.lr, o.beta1, o.beta2, o.weight_decay, cfg.data.batch_size, cfg.train.steps) == \
            (3e-4, 0.95, 0.99, 0.1, 15, 14000)
    elif "bitdp" in name:
        assert (o.lr, o.weight_decay, cfg.data.batch_size * cfg.data.block_size * PAPER_WORKERS) == (3e-4, 0.01, 65536)
    else:
        assert (o.lr, o.beta1, o.beta2, cfg.data.batch_size, cfg.train.epochs) == (1e-4, 0.9, 0.999, 128, 200)
        if "onebit" in name:  # 13 of 200 epochs at 48 steps per epoch (8 workers x 128 of 50,000 images)
            assert cfg.variant.adam_warmup_steps == 13 * (50_000 // (8 * 128))


def test_overrides_apply_on_top_of_a_preset():
    cfg = compose_cfg(["+exp=gpt774m_4bit_synchead", "model=gpt_tiny", "variant=cub8", "optim.beta2=0.9",
                       "data.batch_size=2", "network=local"])
    assert cfg.model.params.size == "tiny" and cfg.variant.name == "cub8"
    assert (cfg.optim.beta2, cfg.data.batch_size, cfg.network.name) == (0.9, 2, "local")
    assert cfg.variant.momentum_sync.layers == "head"  # the preset's own setting survives a group swap


def test_unknown_preset_lists_the_available_ones():
    with pytest.raises(MissingConfigException) as err:
        compose_cfg(["+exp=gpt774m_3bit"])
    msg = str(err.value)
    assert "Could not find 'exp/gpt774m_3bit'" in msg and "Available options in 'exp'" in msg
    assert "gpt774m_4bit" in msg


def test_unknown_group_option_lists_the_available_ones():
    with pytest.raises(MissingConfigException) as err:
        compose_cfg(["variant=cub3"])
    assert "Available options in 'variant'" in str(err.value) and "cub4" in str(err.value)


def test_preset_without_plus_is_explained():
    with pytest.raises(ConfigCompositionException, match=r"\+exp=gpt774m_4bit"):
        compose_cfg(["exp=gpt774m_4bit"])
