"""Loading what someone else wrote runs none of it, and checkpoints move across devices (docs/reliability.md).

A pickle may name any importable function and call it while it loads. Each malicious file below would create a
marker file when unpickled unsafely; the tests show the marker never appears, and the message names the file:
a checkpoint given to `resume=` (exit 2 before training), the safe loader itself, a CIFAR-100 pickle. Cross-device:
a checkpoint whose tensors were saved on CUDA loads on this CPU-only machine, and generator states sized for
another device type are left out by the rule of src/reliability/rng.py instead of failing in `set_state`.
"""
from __future__ import annotations

import pickle
import subprocess
import sys

import pytest
import torch
from harness_util import REPO, TORCHRUN_VARS

from src.data.errors import DataError
from src.reliability.checkpoint import CheckpointError, CheckpointManager, load_safe, rank_file
from src.reliability.rng import capture_rng_state, generator_state_size, restore_rng_state
from src.reliability.train_state import portable_optimizer_state


class Evil:
    """Unpickled unsafely, this creates the file `marker` (what an attacker's payload would do)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


def malicious_checkpoint(run_dir, marker):
    """A checkpoint folder of a one-rank run whose manifest verifies but whose rank file carries `Evil`."""
    manager = CheckpointManager(run_dir / "checkpoints", 0, 1)
    return manager.save(1, {"optimizer": {"state": Evil(marker)}}, {"w": torch.ones(2)}, {"step": 1})


def test_a_malicious_checkpoint_is_refused_before_anything_of_it_runs(tmp_path):
    marker = tmp_path / "pwned"
    folder = malicious_checkpoint(tmp_path / "run", marker)
    manager = CheckpointManager(folder.parent, 0, 1)
    with pytest.raises(CheckpointError, match=rf"{folder / rank_file(0)} was refused: .*io\.open"):
        manager.open(folder)
    with pytest.raises(CheckpointError, match=rf"{folder / rank_file(0)} was refused by the safe loader"):
        load_safe(folder / rank_file(0))
    assert not marker.exists()
    torch.load(folder / rank_file(0), weights_only=False)  # the unsafe load it replaces would have run it
    assert marker.exists()


def test_resume_from_a_malicious_checkpoint_exits_2_naming_the_file(demo_tokens, tmp_path):
    marker = tmp_path / "pwned"
    folder = malicious_checkpoint(tmp_path / "run", marker)
    env = {k: v for k, v in __import__("os").environ.items() if k not in TORCHRUN_VARS}
    proc = subprocess.run([sys.executable, "-m", "src.train", "variant=lion", f"data.dir={demo_tokens}",
                           f"resume={folder}", "train.progress=false"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "lioncub: cannot start training" in proc.stderr and str(folder / rank_file(0)) in proc.stderr
    assert "Traceback" not in proc.stderr and not marker.exists()


def test_a_malicious_cifar_file_is_refused_naming_the_file(tmp_path):
    from src.data import make_synthetic_cifar
    from src.data.cifar_pickle import dump_cifar_pickle, load_cifar_pickle

    make_synthetic_cifar(tmp_path, num_classes=4, n_train=8, n_test=4, seed=0)
    train = tmp_path / "cifar-100-python" / "train"
    assert load_cifar_pickle(train, required=("data",))["data"].shape == (8, 3072)  # the real format still loads
    marker = tmp_path / "pwned"
    dump_cifar_pickle({"data": Evil(marker), "fine_labels": [0]}, train)
    with pytest.raises(DataError, match=rf"{train} was refused: its pickle calls io\.open"):
        load_cifar_pickle(train, required=("data",))
    assert not marker.exists()
    with open(train, "rb") as f:  # what the reader did before: pickle.load runs the payload
        pickle.load(f, encoding="bytes")
    assert marker.exists()


def _saved_on_cuda(path, obj, monkeypatch):
    """torch.save `obj` as a GPU run would: every storage tagged with location cuda:0."""
    with monkeypatch.context() as m:
        m.setattr(torch.serialization, "location_tag", lambda storage: "cuda:0")
        torch.save(obj, path)


def test_a_checkpoint_written_on_cuda_loads_on_cpu(tmp_path, monkeypatch):
    path = tmp_path / "gpu.pt"
    _saved_on_cuda(path, {"exp_avg": torch.arange(4.0), "step": torch.tensor(3.0)}, monkeypatch)
    if not torch.cuda.is_available():  # the file really says cuda: without map_location it cannot load here
        with pytest.raises(RuntimeError, match="CUDA"):
            torch.load(path, weights_only=True)
    state = load_safe(path)
    assert state["exp_avg"].device.type == "cpu" and torch.equal(state["exp_avg"], torch.arange(4.0))


def test_generator_states_of_another_device_type_are_left_at_their_seed():
    cpu_state = torch.Generator().manual_seed(5).get_state()
    philox_like = torch.zeros(16, dtype=torch.uint8)  # the size of a CUDA generator's state
    assert generator_state_size("cpu") == cpu_state.numel() != philox_like.numel()
    state = {"state": {}, "param_groups": [], "reducer": {"generator": philox_like}}
    kept, notes = portable_optimizer_state(state, torch.device("cpu"))
    assert kept["reducer"] == {} and len(notes) == 1 and "16 bytes" in notes[0] and "cpu" in notes[0]
    same, none = portable_optimizer_state({**state, "reducer": {"generator": cpu_state}}, torch.device("cpu"))
    assert torch.equal(same["reducer"]["generator"], cpu_state) and none == []
    rng = capture_rng_state()
    rng["cuda"] = philox_like
    notes = restore_rng_state(rng)  # a GPU run's RNG states on a machine without CUDA: the CPU ones are restored
    if not torch.cuda.is_available():
        assert len(notes) == 1 and "CUDA generator" in notes[0]
