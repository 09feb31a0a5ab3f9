"""DeiT-Tiny/-Small/-Base through timm (Section 7, Appendix D.2).

Section 7 trains DeiT-Tiny, -Small and -Base (Touvron et al., 2021) on
CIFAR-100, and (Section 7.2) fine-tunes "a DeiT-Tiny model, pretrained on
ImageNet, on CIFAR100 for 20 epochs". The architectures are timm's
`deit_{tiny,small,base}_patch16_224`.

Deliberate differences / choices:
- Pretrained weights are never downloaded (`pretrained=False` is always
  passed to timm); they are read from a LOCAL file given as
  `pretrained_path`, e.g. made on a machine with internet by
      torch.save(timm.create_model("deit_tiny_patch16_224",
                 pretrained=True).state_dict(), "deit_tiny_patch16_224.pth")
  The official DeiT release files ({"model": state_dict}) work too.
- The ImageNet head is dropped when its shape differs from `num_classes`
  (it is then freshly initialised); `pos_embed` is resampled (bicubic, timm's
  `resample_abs_pos_embed`) when `img_size` differs from the file's.
- `img_size` defaults to 224 (the data pipeline resizes CIFAR images); smaller
  sizes, e.g. 32 (a 2x2 patch grid), are allowed for tests.
"""

import os

import torch
import torch.nn as nn

DEIT_VARIANTS = {
    "tiny": "deit_tiny_patch16_224",
    "small": "deit_small_patch16_224",
    "base": "deit_base_patch16_224",
}
HEAD_KEYS = ("head.weight", "head.bias")


def _how_to_get(arch: str) -> str:
    return (
        f"expected a local torch.save file holding the ImageNet state dict of {arch} "
        f"(a raw state dict, or a dict with a 'model' or 'state_dict' key). Make one on a "
        f"machine with internet: torch.save(timm.create_model('{arch}', "
        f"pretrained=True).state_dict(), '{arch}.pth')"
    )


def read_state_dict(path: str, arch: str) -> dict[str, torch.Tensor]:
    """Read a state dict from a local checkpoint file, with errors that say what to provide."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"pretrained file {path!r} not found; {_how_to_get(arch)}")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # unreadable, truncated, or not a torch file
        reason = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        raise ValueError(f"cannot read pretrained file {path!r} ({reason}); {_how_to_get(arch)}") from err
    if isinstance(ckpt, dict):
        for key in ("model", "state_dict"):
            if isinstance(ckpt.get(key), dict):
                ckpt = ckpt[key]
                break
    if not isinstance(ckpt, dict) or not all(isinstance(v, torch.Tensor) for v in ckpt.values()):
        raise ValueError(f"pretrained file {path!r} holds no state dict; {_how_to_get(arch)}")
    return ckpt


def adapt_state_dict(state: dict, model: nn.Module) -> dict:
    """Drop a head of the wrong shape and resample pos_embed to the model's grid."""
    state = dict(state)
    target = model.state_dict()
    for key in HEAD_KEYS:
        if key in state and key in target and state[key].shape != target[key].shape:
            del state[key]
    if "pos_embed" in state and state["pos_embed"].shape != target["pos_embed"].shape:
        from timm.layers import resample_abs_pos_embed

        state["pos_embed"] = resample_abs_pos_embed(
            state["pos_embed"],
            new_size=list(model.patch_embed.grid_size),
            num_prefix_tokens=model.num_prefix_tokens,
        )
    return state


def load_pretrained(model: nn.Module, path: str, arch: str) -> None:
    state = adapt_state_dict(read_state_dict(path, arch), model)
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as err:  # shape mismatch outside head/pos_embed
        raise ValueError(f"pretrained file {path!r} does not fit {arch}: {err}") from err
    missing = [k for k in missing if k not in HEAD_KEYS]
    if missing or unexpected:
        raise ValueError(
            f"pretrained file {path!r} does not match {arch}: "
            f"missing keys {missing}, unexpected keys {list(unexpected)}"
        )


def build_deit(
    size: str = "tiny",
    num_classes: int = 100,
    img_size: int = 224,
    pretrained_path: str | None = None,
) -> nn.Module:
    if size not in DEIT_VARIANTS:
        raise ValueError(f"unknown DeiT size {size!r}; valid sizes: {sorted(DEIT_VARIANTS)}")
    for name, value in (("num_classes", num_classes), ("img_size", img_size)):
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if img_size % 16 != 0:
        raise ValueError(f"img_size must be a multiple of the patch size 16, got {img_size}")
    arch = DEIT_VARIANTS[size]
    import timm  # here, not at the top: a GPT or ResNet run never pays timm's import (seconds per process)

    model = timm.create_model(arch, pretrained=False, num_classes=num_classes, img_size=img_size)
    if pretrained_path is not None:
        load_pretrained(model, os.fspath(pretrained_path), arch)
    return model
