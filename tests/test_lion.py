"""Lion against an independent implementation of the published update, written here from the formula."""
from __future__ import annotations

import pytest
import torch

from src.optim import Lion


def reference_lion(params, grads_per_step, lr, beta1, beta2, wd, lrs=None):
    """Element-by-element Lion in float64 from Chen et al. (2023), Algorithm 2 (decoupled weight decay)."""
    theta = [p.detach().double().clone() for p in params]
    m = [torch.zeros_like(t) for t in theta]
    for step, grads in enumerate(grads_per_step):
        eta = lrs[step] if lrs is not None else lr
        for t, mi, g in zip(theta, m, grads):
            flat_t, flat_m, flat_g = t.view(-1), mi.view(-1), g.double().reshape(-1)
            for j in range(flat_t.numel()):
                c = beta1 * flat_m[j].item() + (1 - beta1) * flat_g[j].item()
                update = (c > 0) - (c < 0)
                flat_t[j] = flat_t[j].item() * (1 - eta * wd) - eta * update
                flat_m[j] = beta2 * flat_m[j].item() + (1 - beta2) * flat_g[j].item()
    return theta


def _params(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(4, 3, generator=g)), torch.nn.Parameter(torch.randn(5, generator=g))]


def _grads(steps, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [[torch.randn(4, 3, generator=g), torch.randn(5, generator=g)] for _ in range(steps)]


def _run(opt, params, grads_per_step, scheduler=None):
    for grads in grads_per_step:
        for p, g in zip(params, grads):
            p.grad = g.clone()
        opt.step()
        if scheduler is not None:
            scheduler.step()


@pytest.mark.parametrize("beta1,beta2,wd", [(0.9, 0.99, 0.0), (0.95, 0.98, 0.1), (0.5, 0.5, 1.0)])
def test_lion_matches_published_update(beta1, beta2, wd):
    params, grads = _params(), _grads(12)
    expected = reference_lion(params, grads, 1e-2, beta1, beta2, wd)
    opt = Lion(params, lr=1e-2, betas=(beta1, beta2), weight_decay=wd)
    _run(opt, params, grads)
    for p, e in zip(params, expected):
        torch.testing.assert_close(p.detach().double(), e, rtol=1e-6, atol=1e-6)


def test_lion_follows_lr_scheduler_and_per_group_settings():
    params, grads = _params(), _grads(6)
    lrs = [1e-2 * 0.5 ** (s // 2) for s in range(6)]
    expected_w = reference_lion([params[0]], [[g[0]] for g in grads], None, 0.9, 0.99, 0.3, lrs=lrs)[0]
    expected_b = reference_lion([params[1]], [[g[1]] for g in grads], 3e-3, 0.9, 0.99, 0.0)[0]
    opt = Lion([{"params": [params[0]], "weight_decay": 0.3}, {"params": [params[1]], "lr": 3e-3}],
               lr=1e-2, betas=(0.9, 0.99))
    scheduler = torch.optim.lr_scheduler.LambdaLR(opt, [lambda s: 0.5 ** (s // 2), lambda s: 1.0])
    _run(opt, params, grads, scheduler)
    torch.testing.assert_close(params[0].detach().double(), expected_w, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(params[1].detach().double(), expected_b, rtol=1e-6, atol=1e-6)


def test_state_dict_round_trip_continues_bitwise():
    grads = _grads(10)
    full = _params()
    opt = Lion(full, lr=1e-2, weight_decay=0.1)
    _run(opt, full, grads)

    half = _params()
    opt_a = Lion(half, lr=1e-2, weight_decay=0.1)
    _run(opt_a, half, grads[:5])
    saved = opt_a.state_dict()
    resumed = [torch.nn.Parameter(p.detach().clone()) for p in half]
    opt_b = Lion(resumed, lr=1e-2, weight_decay=0.1)
    opt_b.load_state_dict(saved)
    _run(opt_b, resumed, grads[5:])
    for a, b in zip(full, resumed):
        assert torch.equal(a, b)


def test_parameters_without_grad_are_skipped():
    params = _params()
    before = params[1].detach().clone()
    params[0].grad = torch.ones(4, 3)
    Lion(params, lr=0.1, weight_decay=0.5).step()
    assert torch.equal(params[1], before)


@pytest.mark.parametrize("kwargs,match", [(dict(lr=-1.0), "learning rate"), (dict(betas=(1.0, 0.9)), "betas"),
                                          (dict(weight_decay=-0.1), "weight_decay")])
def test_bad_hyperparameters_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Lion(_params(), **kwargs)


def test_empty_parameter_list_is_an_error():
    with pytest.raises(ValueError, match="empty parameter list"):
        Lion([], lr=1e-3)


def test_optimizer_methods_leave_torch_dynamo_unimported():
    """Every rank skips torch._dynamo's import (seconds of CPU): building a Lion, stepping, zeroing, saving and
    loading its state leave it unimported, with torch's results (the round trip above checks those); the emulated
    cluster's launcher does not import torch at all."""
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    probe = ("import sys, torch\n"
             "from src.optim import Lion\n"
             "w = torch.nn.Parameter(torch.ones(3))\n"
             "opt = Lion([w], lr=0.1)\n"
             "w.grad = torch.ones(3); opt.step(); opt.zero_grad()\n"
             "opt.load_state_dict(opt.state_dict())\n"
             "import src.launch.emulate\n"
             "print('torch._dynamo' in sys.modules, round(float(w[0]), 4))\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                         cwd=repo).stdout.split()
    assert out == ["False", "0.9"]
    launcher = subprocess.run([sys.executable, "-c", "import sys, src.launch.emulate; print('torch' in sys.modules)"],
                              capture_output=True, text=True, check=True, cwd=repo).stdout.strip()
    assert launcher == "False"
