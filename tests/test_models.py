"""Tests of the model zoo (Section 7, Appendix D.1/D.2): sizes, wiring, names, loading."""

import math

import pytest
import torch
import torch.nn as nn
from timm.layers import resample_abs_pos_embed

from src.models import build_model, count_parameters
from src.models.deit import build_deit
from src.models.gpt import GPT_SIZES, GPTConfig, build_gpt
from src.models.resnet_cifar import resnet18_cifar

NOMINAL = {"124m": 124e6, "350m": 350e6, "774m": 774e6, "1558m": 1558e6}


# ---------------------------------------------------------------- GPT sizes

@pytest.mark.parametrize("size", sorted(NOMINAL))
def test_gpt_parameter_count_matches_appendix_d1(size):
    with torch.device("meta"):  # no real memory is allocated
        model = build_gpt(size)
    assert all(p.is_meta for p in model.parameters())
    n = count_parameters(model)
    assert abs(n - NOMINAL[size]) / NOMINAL[size] < 0.02, f"{size}: {n:,} params"


@pytest.mark.parametrize("n_embd, hidden", [(64, 192), (768, 2048), (1024, 2752), (1600, 4288)])
def test_mlp_hidden_matches_gpt2_mlp_rounded_up_to_64(n_embd, hidden):
    config = GPTConfig(n_embd=n_embd, n_head=1)
    assert config.hidden == hidden
    assert hidden % 64 == 0
    assert 3 * n_embd * hidden >= 8 * n_embd**2 > 3 * n_embd * (hidden - 64)
    assert GPTConfig(n_embd=n_embd, n_head=1, mlp_hidden=100).hidden == 100


def test_gpt_sizes_follow_appendix_d1():
    shape = {k: (v["n_layer"], v["n_head"], v["n_embd"]) for k, v in GPT_SIZES.items()}
    assert shape["124m"] == (12, 12, 768)
    assert shape["350m"] == (24, 16, 1024)
    assert shape["774m"] == (36, 20, 1280)
    assert shape["1558m"] == (48, 25, 1600)
    with torch.device("meta"):
        assert build_gpt("1558m").config.block_size == 1024


# ------------------------------------------------------------ GPT behaviour

@pytest.fixture(scope="module")
def tiny_gpt():
    torch.manual_seed(0)
    return build_gpt("tiny")


def test_tiny_gpt_loss_near_log_vocab_and_backward(tiny_gpt):
    V = tiny_gpt.config.vocab_size
    idx = torch.randint(0, V, (2, 16))
    targets = torch.randint(0, V, (2, 16))
    logits, loss = tiny_gpt(idx, targets)
    assert logits.shape == (2, 16, V)
    assert torch.isfinite(loss) and abs(loss.item() - math.log(V)) < 0.3
    tiny_gpt.zero_grad()
    loss.backward()
    for name, p in tiny_gpt.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name
    assert tiny_gpt(idx)[1] is None


def test_gpt_is_causal(tiny_gpt):
    idx = torch.randint(0, 1000, (1, 12))
    changed = idx.clone()
    changed[0, 8:] = (changed[0, 8:] + 1) % 1000
    with torch.no_grad():
        a, _ = tiny_gpt(idx)
        b, _ = tiny_gpt(changed)
    torch.testing.assert_close(a[:, :8], b[:, :8])
    assert not torch.allclose(a[:, 8:], b[:, 8:])


def test_gpt_rejects_too_long_sequence_and_bad_token_ids():
    model = build_gpt("tiny", block_size=8, vocab_size=100)
    assert model.transformer.wpe.weight.shape == (8, 64)
    with pytest.raises(ValueError, match=r"sequence length 9 exceeds block_size 8"):
        model(torch.zeros(1, 9, dtype=torch.long))
    bad = torch.zeros(1, 4, dtype=torch.long)
    bad[0, 2] = 100
    with pytest.raises(ValueError, match=r"vocab_size=100.*max 100"):
        model(bad)
    bad[0, 2] = -1
    with pytest.raises(ValueError, match=r"min -1"):
        model(bad)
    model(torch.full((1, 8), 99, dtype=torch.long))  # boundary values are fine


def test_lm_head_is_tied_to_wte(tiny_gpt):
    wte, head = tiny_gpt.transformer.wte.weight, tiny_gpt.lm_head.weight
    assert wte is head and wte.data_ptr() == head.data_ptr()
    names = [n for n, _ in tiny_gpt.named_parameters()]
    assert "transformer.wte.weight" in names and "lm_head.weight" not in names
    all_elems = sum(p.numel() for _, p in tiny_gpt.named_parameters(remove_duplicate=False))
    assert count_parameters(tiny_gpt) == all_elems - wte.numel()
    with torch.no_grad():
        head[0, 0] += 1.0
    assert tiny_gpt.transformer.wte.weight[0, 0] == head[0, 0]


def _layer_class(name: str) -> list[str]:
    """How the optimizer classifies GPT parameters by name."""
    classes = {
        "embedding": "wte" in name or "wpe" in name,
        "head": "lm_head" in name,
        "attention": ".attn." in name,
        "mlp": ".mlp." in name,
        "norm": any(f".{ln}." in f".{name}" for ln in ("ln_1", "ln_2", "ln_f")),
    }
    return [c for c, hit in classes.items() if hit]


def test_gpt_module_names_and_every_parameter_has_one_class(tiny_gpt):
    modules = dict(tiny_gpt.named_modules())
    for name in ["transformer.wte", "transformer.wpe", "transformer.ln_f", "lm_head"]:
        assert name in modules, name
    for i in range(tiny_gpt.config.n_layer):
        for sub in ["ln_1", "attn.c_attn", "attn.c_proj", "ln_2", "mlp.gate_proj",
                    "mlp.up_proj", "mlp.down_proj"]:
            assert f"transformer.h.{i}.{sub}" in modules, (i, sub)
    assert isinstance(modules["transformer.ln_f"], nn.RMSNorm)
    assert not any(isinstance(m, (nn.Dropout, nn.LayerNorm)) for m in modules.values())
    for name, p in tiny_gpt.named_parameters():
        assert len(_layer_class(name)) == 1, (name, _layer_class(name))
        assert not name.endswith("bias"), name


def test_gpt_init_is_gpt2_style():
    torch.manual_seed(0)
    model = build_gpt("mini")  # 4 layers: residual std = 0.02 / sqrt(8)
    params = dict(model.named_parameters())
    std = lambda n: params[n].std().item()  # noqa: E731
    assert std("transformer.h.0.attn.c_attn.weight") == pytest.approx(0.02, rel=0.05)
    assert std("transformer.wte.weight") == pytest.approx(0.02, rel=0.05)
    for n in ["transformer.h.3.attn.c_proj.weight", "transformer.h.3.mlp.down_proj.weight"]:
        assert std(n) == pytest.approx(0.02 / math.sqrt(8), rel=0.05), n
    assert torch.all(params["transformer.ln_f.weight"] == 1)


# ----------------------------------------------------------------- registry

def test_build_model_registry_and_errors():
    assert isinstance(build_model("gpt", size="tiny", block_size=16), nn.Module)
    with pytest.raises(ValueError, match=r"deit.*gpt.*resnet18_cifar"):
        build_model("vgg")
    with pytest.raises(ValueError, match=r"unknown parameter.*dropout.*n_layer"):
        build_model("gpt", size="tiny", dropout=0.1)
    with pytest.raises(ValueError, match=r"124m"):
        build_model("gpt", size="7b")
    with pytest.raises(ValueError, match=r"n_embd=65.*n_head=2"):
        build_model("gpt", size="tiny", n_embd=65)
    with pytest.raises(ValueError, match=r"num_classes"):
        build_model("resnet18_cifar", num_classes=0)
    with pytest.raises(ValueError, match=r"tiny"):
        build_model("deit", size="huge")


# ------------------------------------------------------------------- ResNet

def test_resnet18_cifar_shape_size_and_stem():
    model = build_model("resnet18_cifar")
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 100)
    assert abs(count_parameters(model) - 11.2e6) / 11.2e6 < 0.02
    assert model.conv1.kernel_size == (3, 3) and model.conv1.stride == (1, 1)
    assert isinstance(model.bn1, nn.BatchNorm2d) and model.fc.out_features == 100
    assert not any(isinstance(m, nn.MaxPool2d) for m in model.modules())
    widths = [getattr(model, f"layer{i}")[-1].conv2.out_channels for i in range(1, 5)]
    assert widths == [64, 128, 256, 512]
    assert resnet18_cifar(num_classes=10).fc.out_features == 10


# --------------------------------------------------------------------- DeiT

def test_deit_tiny_forward_at_32px():
    model = build_model("deit", size="tiny", num_classes=100, img_size=32)
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 100)


@pytest.mark.parametrize("wrap", [None, "model", "state_dict"])
def test_deit_pretrained_restores_non_head_weights(tmp_path, wrap):
    torch.manual_seed(0)
    source = build_deit("tiny", num_classes=10, img_size=64).state_dict()
    path = tmp_path / "deit_tiny.pth"
    torch.save(source if wrap is None else {wrap: source, "epoch": 3}, path)
    torch.manual_seed(1)
    model = build_deit("tiny", num_classes=100, img_size=32, pretrained_path=str(path))
    loaded = model.state_dict()
    assert loaded["head.weight"].shape == (100, 192)
    for key, value in source.items():
        if key.startswith("head.") or key == "pos_embed":
            continue
        assert torch.equal(loaded[key], value), key
    expected_pos = resample_abs_pos_embed(source["pos_embed"], [2, 2], num_prefix_tokens=1)
    assert loaded["pos_embed"].shape == (1, 5, 192)
    assert torch.equal(loaded["pos_embed"], expected_pos)
    assert torch.equal(loaded["pos_embed"][:, 0], source["pos_embed"][:, 0])  # cls token


def test_deit_pretrained_keeps_head_of_matching_shape(tmp_path):
    source = build_deit("tiny", num_classes=10, img_size=32).state_dict()
    torch.save(source, tmp_path / "w.pth")
    model = build_deit("tiny", num_classes=10, img_size=32, pretrained_path=tmp_path / "w.pth")
    for key, value in model.state_dict().items():
        assert torch.equal(value, source[key]), key


def test_deit_pretrained_file_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nope\.pth.*timm\.create_model.*pretrained=True"):
        build_deit("tiny", img_size=32, pretrained_path=str(tmp_path / "nope.pth"))
    (tmp_path / "junk.pth").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match=r"cannot read.*torch\.save"):
        build_deit("tiny", img_size=32, pretrained_path=str(tmp_path / "junk.pth"))
    state = build_deit("tiny", img_size=32).state_dict()
    state["extra.weight"] = torch.zeros(1)
    del state["blocks.0.norm1.weight"]
    torch.save(state, tmp_path / "odd.pth")
    with pytest.raises(ValueError, match=r"blocks\.0\.norm1\.weight.*extra\.weight"):
        build_deit("tiny", img_size=32, pretrained_path=str(tmp_path / "odd.pth"))


# ------------------------------------------------------ tied / untied head (Lion Cub, Fig. 4 and 8)

def test_untied_head_is_its_own_tensor_and_momentum_sync_tells_them_apart():
    from src.optim.momentum_sync import MomentumSync, named_parameters_with_aliases

    torch.manual_seed(0)
    tied, untied = build_gpt("tiny"), build_gpt("tiny", tie_embeddings=False)
    assert untied.lm_head.weight is not untied.transformer.wte.weight
    names = [n for n, _ in untied.named_parameters()]
    assert "transformer.wte.weight" in names and "lm_head.weight" in names
    V, C = untied.config.vocab_size, untied.config.n_embd
    assert count_parameters(untied) == count_parameters(tied) + V * C
    assert untied.lm_head.weight.std().item() == pytest.approx(0.02, rel=0.05)
    for model, embed, head in [(tied, {"transformer.wte.weight,lm_head.weight", "transformer.wpe.weight"},
                                {"transformer.wte.weight,lm_head.weight"}),
                               (untied, {"transformer.wte.weight", "transformer.wpe.weight"}, {"lm_head.weight"})]:
        named = [n for n, _ in named_parameters_with_aliases(model)]
        chosen = {cls: {n for n, keep in zip(named, MomentumSync(1, cls).select(named)) if keep}
                  for cls in ("embed", "head")}
        assert chosen == {"embed": embed, "head": head}
    idx = torch.randint(0, V, (2, 8))
    _, loss = untied(idx, idx)
    loss.backward()
    assert untied.lm_head.weight.grad.abs().sum() > 0 and untied.transformer.wte.weight.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="tie_embeddings"):
        build_gpt("tiny", tie_embeddings="no")


@pytest.mark.parametrize("size", sorted(NOMINAL))
def test_paper_size_keeps_its_shape(size):
    other = {"n_layer": GPT_SIZES[size]["n_layer"] + 1}
    with pytest.raises(ValueError, match=rf"size={size}.*n_layer={other['n_layer']}.*null"):
        build_gpt(size, **other)
    with torch.device("meta"):
        assert build_gpt(None, **{**GPT_SIZES[size], **other}).config.n_layer == other["n_layer"]
        assert build_gpt(size, **GPT_SIZES[size], vocab_size=128, block_size=64).config.vocab_size == 128
    assert build_gpt("mini", n_embd=96, n_head=4).config.n_embd == 96  # our CPU shapes resize freely


def test_a_run_config_must_state_the_architecture():
    from src.models.gpt import check_stated

    config = GPTConfig(n_layer=2, n_head=2, n_embd=64, block_size=256)
    check_stated({"n_layer": 2, "n_head": 2, "n_embd": 64, "block_size": 256, "vocab_size": 50257}, config)
    with pytest.raises(ValueError, match=r"must state n_head, vocab_size.*n_head=2, vocab_size=50257"):
        check_stated({"n_layer": 2, "n_head": None, "n_embd": 64, "block_size": 256}, config)
