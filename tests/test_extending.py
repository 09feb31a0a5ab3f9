"""docs/extending.md followed as a newcomer would, outside the repository: a packed reducer in a package of one's own
(a temporary folder, not `src/`), registered with `@register` and named in a variant YAML of one's own config folder
(`reducer: {name: ..., module: ...}`, `hydra.searchpath`). It trains (2 ranks under torchrun, the tiny GPT), passes
the conformance suite (`--reducer-module`), and nothing of the repository was edited for it (git's view of the
working tree is the same before and after).

The reducer, `sign2s`: ternary codes (the L1 quantizer with one level per side), in 2-bit fields widened where the
world's sums need it, one SUM allreduce, the sign of the sum (`vote: majority`). A new quantization method of one's
own (a stochastic one, named by the same `module:`) is not part of this test.

The newcomer's run is slow (`make test-all`): a training run and a conformance run, each its own process (about
a minute and a half on 2 idle cores); `make test` keeps the one-line refusal of a module that cannot be imported.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
REDUCER = '''"""sign2s: ternary codes in 2-bit fields, one SUM allreduce, the sign of the sum (docs/extending.md, section 2)."""
import torch.distributed as dist

from src.comm.codecs.packing import field_max, packed_bytes
from src.comm.cost.wire_bytes import ring_allreduce_bytes
from src.comm.reducers.base import VOTES, check_choice
from src.comm.reducers.packed import PackedReducer
from src.comm.reducers.registry import register
from src.comm.reducers.wire import WireFormat


@register("sign2s")
class Sign2s(PackedReducer):
    name = "sign2s"

    def __init__(self, group=None, *, bits=2, vote="majority", chunk="auto", kernels="auto", world_size=None,
                 rank=None, segments=None, check_finite=False, timer=None):
        super().__init__(group, chunk=chunk, kernels=kernels, world_size=world_size, rank=rank, segments=segments,
                         check_finite=check_finite, timer=timer)
        check_choice("vote", vote, VOTES)
        self.vote = vote
        self.bits = self.fit_fields(bits, 2, "codes 0..2", f"sign2s: the sums of {self.world_size} ranks' codes "
                                                            "overflow even 16-bit fields")
        world = self.world_size
        self.wire = WireFormat(codes="levels", bits=self.bits, method="l1", levels=1, offset=float(world),
                               divisor=float(world), majority=vote == "majority")

    def exchange(self, reduction, chunk, wire, slot):
        yield dist.all_reduce(wire, op=dist.ReduceOp.SUM, group=self.group, async_op=True)
        return wire

    def padded_wire_bytes(self, padded_numel):
        return ring_allreduce_bytes(packed_bytes(padded_numel, self.bits), self.world_size)

    def largest_world_size(self):
        return field_max(16) // 2
'''
VARIANT = """name: sign2s
optimizer: lion_cub
reducer: {name: sign2s, module: newcomer.sign2s, bits: 2, vote: majority, chunk: auto}
momentum_sync: {every: 0, layers: none}
"""
STEPS = 6


def _package(root: Path) -> None:
    (root / "newcomer").mkdir()
    (root / "newcomer" / "__init__.py").write_text("")
    (root / "newcomer" / "sign2s.py").write_text(REDUCER)
    (root / "my_conf" / "variant").mkdir(parents=True)
    (root / "my_conf" / "variant" / "sign2s.yaml").write_text(VARIANT)


def _run(cmd: list[str], root: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(
        filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def _tree() -> str:
    return subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=REPO, capture_output=True,
                          text=True, check=True).stdout


@pytest.mark.slow
def test_a_reducer_of_ones_own_package_trains_and_conforms(demo_tokens, tmp_path):
    before = _tree()
    _package(tmp_path)
    run_dir = tmp_path / "run"
    train = _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m",
                  "src.train", f"hydra.searchpath=[file://{tmp_path / 'my_conf'}]", "variant=sign2s",
                  f"data.dir={demo_tokens}", f"run.dir={run_dir}", "model=gpt_tiny", "data.block_size=32",
                  "data.batch_size=4", f"train.steps={STEPS}", "train.eval_every=0", "train.progress=false"], tmp_path)
    assert train.returncode == 0, train.stdout[-3000:] + train.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == STEPS and summary["ranks_in_sync"] is True
    assert summary["wire_bytes_per_step"]["step"] > 0
    assert summary["config_adjusted"]["variant.reducer.bits"]["used"] == 4  # 2-bit fields hold 1 rank's codes
    conform = _run([sys.executable, "-m", "pytest", "tests/test_conformance.py", "--reducer-module",
                    "newcomer.sign2s", "-k", "sign2s", "-m", "not slow", "-q", "-p", "no:cacheprovider"], tmp_path)
    assert conform.returncode == 0, conform.stdout[-3000:]
    assert " passed" in conform.stdout.splitlines()[-1] and "sign2s" in conform.stdout
    assert _tree() == before, "a file of the repository changed"


def test_a_missing_module_is_one_line_and_exit_2(demo_tokens, tmp_path):
    (tmp_path / "my_conf" / "variant").mkdir(parents=True)
    (tmp_path / "my_conf" / "variant" / "gone.yaml").write_text(VARIANT.replace("newcomer.sign2s", "nowhere.sign2s"))
    proc = _run([sys.executable, "-m", "src.train", f"hydra.searchpath=[file://{tmp_path / 'my_conf'}]",
                 "variant=gone", f"data.dir={demo_tokens}", f"run.dir={tmp_path / 'run'}", "model=gpt_tiny"],
                tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "lioncub: cannot start training: variant=sign2s with 1 process(es): reducer 'sign2s': module "
        "'nowhere.sign2s' cannot be imported (No module named 'nowhere'); put its folder on PYTHONPATH on every "
        "node"], proc.stderr


@pytest.mark.slow  # make test's time: a training start of its own (10 s)
def test_a_reducer_option_the_yaml_leaves_out_is_set_on_the_command_line(demo_tokens, tmp_path):
    """`variant.reducer.<key>=...` needs no `+` (make_reducer checks the keys by name): a typo is one lioncub line
    listing the reducer's options, exit 2."""
    proc = _run([sys.executable, "-m", "src.train", "variant=cub4", "variant.reducer.levles=3",
                 f"data.dir={demo_tokens}", f"run.dir={tmp_path / 'run'}", "model=gpt_tiny"], tmp_path)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "lioncub: cannot start training: variant=cub4 with 1 process(es): reducer 'pbit' does not take option(s) "
        "levles; its options are quant, levels, bits, vote, zeros, seed, chunk"], proc.stderr
