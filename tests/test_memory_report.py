"""Peak memory: the `mem/*` keys of a step row, Fig. A.1 from run folders, and the optimizer-memory benchmark
(Lion Cub, Appendix A.1)."""
from __future__ import annotations

import csv
import json

import pytest
import torch
import yaml

from analysis.figA1 import main as figA1
from src.bench.memory import StorageTracker, gpt, measure
from src.engine.step_stats import PeakMemory


def test_step_rows_carry_rss_on_cpu_and_allocated_and_reserved_on_cuda(monkeypatch):
    assert set(PeakMemory(torch.device("cpu")).row()) == {"mem/peak_bytes"}
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 3 * 2**30)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device=None: 4 * 2**30)
    row = PeakMemory(torch.device("cuda", 0)).row()
    assert row == {"mem/peak_bytes": 3 * 2**30, "mem/peak_allocated_bytes": 3 * 2**30,
                   "mem/peak_reserved_bytes": 4 * 2**30}


def make_run(root, name: str, variant: str, params: int, rows: list[dict]):
    path = root / name
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(yaml.safe_dump({"variant": {"name": variant}}))
    (path / "summary.json").write_text(json.dumps({"model_parameters": params, "world_size": 4}))
    (path / "metrics.jsonl").write_text("\n".join(json.dumps({"step": i, **r}) for i, r in enumerate(rows)) + "\n")
    return path


def test_figA1_draws_allocated_reserved_and_rss_per_variant_and_size(tmp_path):
    runs = tmp_path / "runs"
    gib = 2**30
    for variant, extra in (("lion32", 0), ("cub4", 1)):
        for params, base in ((350_000_000, 10), (774_000_000, 20)):
            make_run(runs, f"{variant}-{params}", variant, params,
                     [{"mem/peak_bytes": (base + extra) * gib, "mem/peak_allocated_bytes": (base + extra) * gib,
                       "mem/peak_reserved_bytes": (base + extra + 2) * gib}, {"mem/peak_allocated_bytes": 1}])
    cpu = make_run(tmp_path, "cpu-run", "cub1", 3_340_000, [{"mem/peak_bytes": 900 * 2**20}])
    assert figA1([str(runs), str(cpu), "--out", str(tmp_path / "out")]) == 0
    checks = json.loads((tmp_path / "out" / "findings.json").read_text())["checks"]
    assert [c["holds"] for c in checks if "nearly the same" in c["claim"]] == [True, True]  # 350M: 10 vs 11, 12 vs 13 GiB
    assert {c["claim"] for c in checks if "1-bit" in c["claim"]} == set()  # no 1-bit run at the largest size
    assert (tmp_path / "out" / "figA1.png").stat().st_size > 0 and (tmp_path / "out" / "figA1.pdf").is_file()
    rows = {(r["label"], r["params"]): r for r in csv.DictReader(open(tmp_path / "out" / "figA1.csv"))}
    assert rows[("cub4", "774000000")]["allocated"] == str(21 * gib)  # the largest row, not the last
    assert rows[("cub4", "774000000")]["reserved"] == str(23 * gib)
    assert rows[("cub1", "3340000")]["rss"] == str(900 * 2**20) and rows[("cub1", "3340000")]["device"] == "cpu"


def test_figA1_exits_2_naming_what_is_missing(tmp_path, capsys):
    old = make_run(tmp_path, "old", "lion32", 1000, [{"loss": 3.0}])
    assert figA1([str(old), "--out", str(tmp_path / "out")]) == 2
    assert "logged peak memory" in capsys.readouterr().err
    assert figA1([str(tmp_path / "empty"), "--out", str(tmp_path / "out")]) == 2
    assert "cannot draw Fig. A.1" in (err := capsys.readouterr().err) and "empty: no such folder" in err


def test_storage_tracker_follows_allocations_until_their_last_tensor_dies():
    tracker = StorageTracker()
    base = torch.zeros(1000)
    with tracker:
        a = base + 1  # 4000 bytes
        view = a[:10]
        del a
        assert tracker.current == 4000  # the view keeps the storage
        b = torch.empty(500, dtype=torch.float64)
        assert tracker.current == 8000
        del view
        base.add_(1)  # in place: no allocation
    assert tracker.current == 4000 and tracker.peak == 8000
    del b
    assert tracker.current == 0


@pytest.mark.parametrize("variant, kept, peak", [("lion32", 4.0, 8.0), ("lion16", 2.0, 6.0)])
def test_lion_keeps_its_flat_gradient_buffer(dist, variant, kept, peak):
    """Lion 32/16-bit keeps one flat gradient buffer in the communication dtype; the update vector comes and goes."""
    row = dist(1, measure, variant, gpt(1, 64, torch.device("cpu")))[0]
    assert (row["kept_bytes_per_param"], row["peak_bytes_per_param"]) == (kept, peak)


def test_the_fused_step_counts_its_workspace_not_the_momentum_it_was_built_with(dist):
    """The fused step's momentum is a flat buffer made when the optimizer is built, outside the tracked steps: it is
    not subtracted (it was, giving -3.9 B/param on the H200's 774M GPT); what remains is the sent words and tables."""
    row = dist(1, measure, "cub4", gpt(1, 64, torch.device("cpu")), False, "triton")[0]
    assert 0 < row["kept_bytes_per_param"] <= row["peak_bytes_per_param"] < 1.0, row


def _overlap_rows() -> list[dict]:
    model = gpt(2, 256, torch.device("cpu"))  # 13.9M parameters: 7 chunks
    return [measure("cub4", model, overlap) for overlap in (False, "forward", "backward", "both")]


@pytest.mark.slow  # 8 s on 2 cores: in make test-all
def test_overlapped_steps_keep_the_wire_words_of_every_chunk(dist):
    """With overlap (forward, backward: launched from gradient hooks during a real backward pass, or both) every
    chunk's 4-bit wire words stay allocated (1 MiB per chunk of 2^21 elements) where the synchronous step keeps two
    slots; the speculation keeps nothing else."""
    sync, *overlapped = dist(1, _overlap_rows)[0]
    extra = (sync["chunks"] - 2) * 2**21 // 2
    assert sync["chunks"] >= 4
    for row in overlapped:
        assert row["kept_bytes"] - sync["kept_bytes"] == extra, (row, sync)
