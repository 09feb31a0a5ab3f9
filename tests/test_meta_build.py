"""Shape-only model copies (src.models.meta): the same shapes as the real model, no initializer run on meta
tensors, real tensors still initialized, and no torch._dynamo import for GPT or ResNet checks."""
import subprocess
import sys

import torch

from src.models import build_model
from src.models.meta import initializers_skipped

GPT = dict(n_layer=2, n_embd=64, n_head=4, vocab_size=512, block_size=32)


def _shapes(model):
    return {name: (tuple(p.shape), p.dtype) for name, p in model.named_parameters()}


def test_a_meta_copy_has_the_real_models_shapes():
    for kind, params in (("gpt", GPT), ("resnet18_cifar", dict(num_classes=10))):
        real = build_model(kind, **params)
        with torch.device("meta"), initializers_skipped():
            meta = build_model(kind, **params)
        assert _shapes(meta) == _shapes(real)
        assert all(p.is_meta for p in meta.parameters())


def test_initializers_still_run_on_real_tensors_inside_the_mode():
    x = torch.zeros(1000)
    with initializers_skipped():
        torch.nn.init.normal_(x)
        y = torch.empty(1000).uniform_(2.0, 3.0)
    assert x.std() > 0.5
    assert 2.0 <= y.min() and y.max() <= 3.0


def test_a_meta_check_of_gpt_and_resnet_does_not_import_dynamo():
    code = (
        "import sys, torch\n"
        "from src.models import build_model\n"
        "from src.models.meta import initializers_skipped\n"
        "with torch.device('meta'), initializers_skipped():\n"
        f"    build_model('gpt', **{GPT!r}); build_model('resnet18_cifar', num_classes=10)\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr
