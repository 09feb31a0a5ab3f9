"""Buckets launched during backward, speculating that no rank clips (src/optim/speculation.py), equal the
synchronous step bitwise.

On 2 and 3 real gloo ranks a small GPT-2++ trains with per-rank data, a learning rate that changes every step and
weight decay, under Lion Cub 4-bit, 8-bit L1 (per-layer scales: a chunk waits for the chunks its layers span) and
1-bit (two collectives per chunk), with chunks small enough that the model spans many of them. Each step goes
through the loop's own clip (`clip_gradients`: the coefficient torch applied) and the step's agreement as the loop
reaches it (`BackwardOverlap.propose`, then the non-finite `vote`: one collective, fields read by name):
- a constructed gradient scale makes clipping trigger on chosen steps and ranks (`clip: some`), or never (`never`);
- a NaN on one rank at one step makes every rank skip that step (the speculation is dropped);
- for `overlap: backward` and `both`, the losses, final parameters and every momentum are bitwise those of the
  synchronous step; chunks were launched before backward ended (all of them here: every parameter has a
  gradient); and the collectives counted per step are one reduction where no rank clipped,
  the chunks launched during backward and a whole reduction again where one did, and one reduction (no
  speculation) on the step the backoff after a miss leaves out.
Also: across a checkpoint and resume, on the fused step under Triton's interpreter, and the configurations that
cannot speculate are refused with the fix.
"""
from __future__ import annotations

import json
import math
import warnings

import pytest
import torch
import torch.distributed as tdist
from test_overlap import CHUNK, REDUCERS, _batch, _model  # the same small GPT, batches and reducers
from test_train_reliability import VARIANTS, assert_same_run, interrupt_and_resume, reference, rows

from src.comm.agreement import Agreement
from src.engine.loop import clip_gradients
from src.optim.factory import build_optimizer, validate_variant
from src.optim.lion_cub import LionCub
from src.utils.run_label import label_suffix, overlap_mode
from src.optim.speculation import BACKWARD_OVERLAPPED, MAX_WAIT, Backoff
from src.reliability import nonfinite
from src.reliability.nonfinite import vote

CLIP = 50.0
STEPS = 7
SCALED = {(2, 0), (6, 1)}  # (step, rank): the loss times 1e4, so this rank clips at this step
NAN_AT = (4, 1)  # (step, rank): a NaN loss, so every rank skips this step
# clip "some", per step: whether the speculation held (None: the backoff after a miss did not speculate; "skipped":
# the non-finite vote skipped the step) and the chunk collectives started: "n" one reduction, "k" the chunks the
# speculation launched during backward before it was dropped, "k+n" those and the redo
SOME = {1: (True, "n"), 2: (False, "k+n"), 3: (None, "n"), 4: ("skipped", "k"), 5: (True, "n"), 6: (False, "k+n"),
        7: (None, "n")}
NEVER = {step: (True, "n") for step in range(1, STEPS + 1)} | {NAN_AT[0]: ("skipped", "k")}
VARIANTS["cub4_backward"] = [*VARIANTS["cub4_chunked"], "variant.overlap=backward"]


def _build(model, name: str, overlap, kernels: str) -> LionCub:
    synced = name.endswith("_msync")  # momentum sync of every layer every 2 steps (Section 5)
    variant = {"name": name, "optimizer": "lion_cub", "reducer": {**REDUCERS[name.removesuffix("_msync")],
                                                                  "chunk": CHUNK},
               "momentum_sync": {"every": 2, "layers": "all"} if synced else {"every": 0, "layers": "none"},
               "overlap": overlap, "kernels": kernels}
    optimizer = build_optimizer(model, variant, lr=3e-2, betas=(0.9, 0.99), weight_decay=0.1)
    assert optimizer.fused == (kernels == "triton"), optimizer.kernel_choice
    return optimizer


def _count_exchanges(optimizer: LionCub) -> list[int]:
    """A counter of the chunk collectives the optimizer's reducer starts (one per chunk per reduction)."""
    counter, exchange = [0], optimizer.reducer.exchange

    def counted(*args, **kwargs):
        counter[0] += 1
        return exchange(*args, **kwargs)

    optimizer.reducer.exchange = counted
    return counter


def _agreement(opt: LionCub, group) -> Agreement:
    """The step's agreement as the loop builds it (src/engine/run.py): `nonfinite` and the overlap's fields."""
    agreement = Agreement(group)
    nonfinite.register(agreement)
    if opt.backward_overlap is not None:
        opt.backward_overlap.register(agreement)
    return agreement


def _agree(opt: LionCub, agreement: Agreement, loss, norm, coefficient):
    """The loop's agreement on the step (src/engine/loop.py train_step): the verdict, the speculation resolved."""
    overlap = opt.backward_overlap
    if overlap is not None:
        overlap.propose(agreement, coefficient)
    verdict = vote(agreement, loss, norm)
    if overlap is not None:
        overlap.resolve(verdict.agreed)
    return verdict


def _hit(opt: LionCub):
    return None if opt.backward_overlap is None else opt.backward_overlap.hit


def _launched_so_far(opt: LionCub) -> int:
    """The chunks this step's speculation has launched so far (0: none in flight)."""
    speculation = None if opt.backward_overlap is None else opt.backward_overlap.speculation
    return 0 if speculation is None else speculation.launched


def _resumed(model, opt: LionCub, name: str, overlap, kernels: str):
    """A new model and optimizer from the state dicts of these (a checkpoint and resume)."""
    saved_model, saved_opt = model.state_dict(), opt.state_dict()
    model = _model(tie=True)
    model.load_state_dict(saved_model)
    opt = _build(model, name, overlap, kernels)
    opt.load_state_dict(saved_opt)
    return model, opt


def _train(name: str, overlap, clip: str, resume_at: int | None, kernels: str) -> dict:
    """Per-step losses, exchanges and hits, the final parameters and momenta (settled), and whether a chunk was
    launched before backward ended."""
    rank = tdist.get_rank()
    model = _model(tie=True)
    opt = _build(model, name, overlap, kernels)
    counter = _count_exchanges(opt)
    vote_group = tdist.new_group()  # as the loop's (src/comm/agreement.py own_group)
    agreement = _agreement(opt, vote_group)
    out = {"losses": [], "exchanges": [], "hits": [], "launched": [], "launched_in_backward": False,
           "timed_in_backward": False}
    for step in range(1, STEPS + 1):
        if resume_at is not None and step == resume_at:
            model, opt = _resumed(model, opt, name, overlap, kernels)
            counter, agreement = _count_exchanges(opt), _agreement(opt, vote_group)
        for group in opt.param_groups:
            group["lr"] = 3e-2 / step
        idx, targets = _batch(rank, step)
        _, loss = model(idx, targets)
        out["losses"].append(loss.detach().clone())
        if clip == "some" and (step, rank) in SCALED:
            loss = loss * 1e4
        if (step, rank) == NAN_AT:
            loss = loss * math.nan
        last = model.transformer.h[0].ln_1.weight  # among the last gradients backward produces
        probe = last.register_post_accumulate_grad_hook(lambda p: out.__setitem__(
            "launched_in_backward", out["launched_in_backward"] or _launched_so_far(opt) > 0))
        before = counter[0]
        loss.backward()
        probe.remove()
        norm, coefficient = clip_gradients(model, CLIP)
        verdict = _agree(opt, agreement, loss, norm, coefficient)
        out["launched"].append(verdict.agreed["launched"] if "launched" in verdict.agreed else 0)
        if verdict:
            opt.step()
            out["hits"].append(_hit(opt))
        else:
            out["hits"].append("skipped")
        opt.zero_grad(set_to_none=True)
        out["exchanges"].append(counter[0] - before)
        out["timed_in_backward"] |= BACKWARD_OVERLAPPED in opt.timer.peek()
    opt.settle()
    out["exchanges"][-1] = counter[0] - before  # the last step's chunks, finished by settle (forward overlap)
    out.update(params=[p.detach().clone() for p in model.parameters()],
               momenta=[opt.state[p]["exp_avg"].clone() for p in model.parameters()], chunks=len(opt.plan.chunks))
    return out


def _train_all(jobs: list[tuple]) -> list[dict]:
    return [_train(*job) for job in jobs]


def _check(sync: dict, spec: dict, rank: int, what: str, clip: str, resumed_at: int | None = None,
           in_backward: bool = True) -> None:
    """`spec` (a speculative run) against `sync`; `in_backward`: its chunks are launched during backward (not where
    per-layer scales read every gradient first: the fused step with l1)."""
    assert spec["chunks"] >= 8, "the model must span many chunks for the hooks to matter"
    for step, (x, y) in enumerate(zip(sync["losses"], spec["losses"]), 1):
        assert torch.equal(x, y), f"{what} rank {rank}: loss of step {step} differs ({x.item()} vs {y.item()})"
    for i, (x, y) in enumerate(zip(sync["params"] + sync["momenta"], spec["params"] + spec["momenta"])):
        assert torch.equal(x, y), f"{what} rank {rank}: tensor {i} differs"
    n = spec["chunks"]
    expected = dict(SOME if clip == "some" else NEVER)
    if resumed_at is not None and expected[resumed_at][0] is None:
        expected[resumed_at] = (True, "n")  # a resumed optimizer starts without the backoff's wait
    for step, (hit, started) in expected.items():
        k = spec["launched"][step - 1]
        assert spec["hits"][step - 1] == hit, f"{what}: step {step}: {spec['hits']}"
        assert spec["exchanges"][step - 1] == {"n": n, "k": k, "k+n": k + n}[started], \
            f"{what}: step {step}: {spec['exchanges']} ({n} chunks, {spec['launched']} launched in backward)"
        assert k == (n if spec["launched_in_backward"] and hit is not None else 0), (what, spec["launched"])
        assert sync["exchanges"][step - 1] == (0 if step == NAN_AT[0] else sync["chunks"])
    assert spec["launched_in_backward"] == in_backward, f"{what}: chunks launched before backward ended?"
    assert spec["timed_in_backward"] == in_backward, f"{what}: timed under {BACKWARD_OVERLAPPED}?"


@pytest.mark.parametrize("world_size", [2, 3])
def test_speculative_steps_equal_synchronous_bitwise(dist, world_size):
    clips = ("some", "never") if world_size == 2 else ("some",)  # 3 ranks: the clipped case (make test's time)
    jobs = [(name, overlap, clip, None, "torch") for name in REDUCERS for clip in clips
            for overlap in (False, "backward", "both")]
    results = dist(world_size, _train_all, jobs)
    for rank, per_rank in enumerate(results):
        by_job = dict(zip(jobs, per_rank))
        for name, overlap, clip, _, _ in jobs:
            if overlap:
                _check(by_job[(name, False, clip, None, "torch")], by_job[(name, overlap, clip, None, "torch")],
                       rank, f"{name} {overlap} clip={clip}", clip)
    assert not torch.equal(results[0][0]["params"][0], _model(tie=True).transformer.wte.weight)  # it trained


def test_speculative_steps_equal_synchronous_across_checkpoint_and_resume(dist):
    jobs = [("cub4", False, "some", None, "torch"), ("cub4", "both", "some", 3, "torch"),
            ("cub1", "backward", "some", 4, "torch")]
    results = dist(2, _train_all, jobs)
    for rank, (sync, both, _) in enumerate(results):
        _check(sync, both, rank, "cub4 both, resumed at step 3", "some", resumed_at=3)
    sync1 = dist(2, _train_all, [("cub1", False, "some", None, "torch")])
    for rank, (per_rank, ref) in enumerate(zip(results, sync1)):
        _check(ref[0], per_rank[2], rank, "cub1 backward, resumed at step 4", "some", resumed_at=4)


def test_speculative_steps_with_momentum_sync_equal_synchronous_bitwise(dist):
    jobs = [("cub4_msync", overlap, "some", None, "torch") for overlap in (False, "backward", "both")]
    for rank, (sync, backward, both) in enumerate(dist(2, _train_all, jobs)):
        _check(sync, backward, rank, "cub4 momentum sync, backward", "some")
        _check(sync, both, rank, "cub4 momentum sync, both", "some")


def _two_backward_passes(overlap) -> dict:
    """Two backward passes before one step (gradient accumulation): the speculation is dropped, with a warning."""
    model = _model(tie=True)
    opt = _build(model, "cub4", overlap, "torch")
    vote_group, hits = tdist.new_group(), []
    agreement = _agreement(opt, vote_group)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(1, 3):
            for micro in range(2):
                idx, targets = _batch(tdist.get_rank(), 10 * step + micro)
                model(idx, targets)[1].backward()
            _agree(opt, agreement, torch.zeros(()), None, None)
            opt.step()
            hits.append(_hit(opt))
            opt.zero_grad()
    opt.settle()
    return {"params": [p.detach().clone() for p in model.parameters()], "hits": hits,
            "warnings": [str(w.message) for w in caught if "arrived twice" in str(w.message)]}


def test_two_backward_passes_per_step_reduce_again_with_a_warning(dist):
    speculated = dist(2, _two_backward_passes, "backward")
    sync = dist(2, _two_backward_passes, False)
    for rank, (got, want) in enumerate(zip(speculated, sync)):
        assert len(got["warnings"]) == 1, got["warnings"]  # warned once
        assert got["hits"] == [False, None], got["hits"]  # reduced again; the backoff's wait after the miss
        for x, y in zip(got["params"], want["params"]):
            assert torch.equal(x, y), rank


# cub8 and cub1 under the interpreter take 7-12 s each on 2 cores: in make test-all
@pytest.mark.parametrize("name", ["cub4", pytest.param("cub8", marks=pytest.mark.slow),
                                  pytest.param("cub1", marks=pytest.mark.slow)])
def test_speculative_fused_step_equals_synchronous_bitwise(dist, name):
    """The fused step under Triton's interpreter (cub8's per-layer scales read every gradient: its buckets launch
    when backward ends, so only the bitwise result is checked for it)."""
    jobs = [(name, False, "some", None, "torch"), (name, "both", "some", None, "triton")]
    for rank, (sync, spec) in enumerate(dist(2, _train_all, jobs)):
        _check(sync, spec, rank, f"{name} fused both", "some", in_backward=name != "cub8")


@pytest.mark.parametrize("overlap", ["backward", "both"])
def test_speculation_refuses_a_reducer_that_reduces_in_one_call(overlap):
    variant = {"name": "x", "optimizer": "lion_cub", "reducer": {"name": "compressed_allreduce"},
               "momentum_sync": {"every": 0, "layers": "none"}, "overlap": overlap, "kernels": "auto"}
    with pytest.raises(ValueError, match=f"overlap={overlap} needs a pipelined reducer.*overlap=false"):
        validate_variant(variant, world_size=2)


def test_speculation_refuses_check_finite_and_unknown_modes():
    model = _model(tie=True)
    with pytest.raises(ValueError, match="check_finite=true needs overlap false or forward"):
        LionCub(model.parameters(), reducer={"name": "pbit", "check_finite": True, "world_size": 1},
                overlap="backward")
    variant = {"name": "x", "optimizer": "lion_cub", "reducer": REDUCERS["cub4"],
               "momentum_sync": {"every": 0, "layers": "none"}, "overlap": "sideways", "kernels": "auto"}
    with pytest.raises(ValueError, match="overlap"):
        validate_variant(variant, world_size=2)


@pytest.mark.slow  # three training runs (reference, killed, resumed): about 30 s on 2 cores
def test_speculative_run_resumed_equals_uninterrupted_synchronous_run(demo_tokens, tmp_path, tmp_path_factory):
    """End to end (torchrun, 2 ranks, the loop's own clip of 1.0, which the tiny GPT's early gradients exceed): the
    run killed mid-way and resumed equals the uninterrupted synchronous run bitwise, every step row says whether its
    speculation held, and summary.json has the hit rate."""
    ref = reference("cub4_chunked", demo_tokens, tmp_path_factory)
    interrupt_and_resume("cub4_backward", demo_tokens, tmp_path / "run")
    assert_same_run(tmp_path / "run", ref)
    steps = [r for r in rows(tmp_path / "run") if r["step"] > 0]
    assert {r.get("overlap_hit") for r in steps} <= {0, 1, None} and any("overlap_hit" in r for r in steps)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["overlap"]["mode"] == "backward" and 0.0 <= summary["overlap_hit_rate"] <= 1.0


@pytest.mark.parametrize("value, mode, label", [(False, (False, False), ""), (True, (True, False), "+overlap"),
                                                ("forward", (True, False), "+overlap"),
                                                ("backward", (False, True), "+overlap_backward"),
                                                ("both", (True, True), "+overlap_both")])
def test_every_overlap_value_names_its_mode(value, mode, label):
    assert overlap_mode(value) == mode and label_suffix(value) == label


@pytest.mark.parametrize("value", ["sideways", 1, "true"])
def test_an_unknown_overlap_value_is_refused_naming_the_choices(value):
    with pytest.raises(ValueError, match="choose one of false, true .*forward, backward, both"):
        overlap_mode(value)


def test_backoff_waits_longer_after_each_miss_and_resets_on_a_hit():
    backoff, taken = Backoff(), []
    verdicts = {1: False, 3: False, 6: False, 11: True, 12: True}  # the steps that speculate, and their verdict
    for step in range(1, 13):
        if backoff.speculates(step):
            taken.append(step)
            backoff.record(step, verdicts.get(step, True))
    assert taken == [1, 3, 6, 11, 12]  # waits of 1, 2, 4 steps after the misses, none after a hit
    for step in range(13, 13 + 20):
        backoff.record(step, False)
    assert backoff.wait == MAX_WAIT


def _subclasses(cls) -> set:
    return {cls} | {c for sub in cls.__subclasses__() for c in _subclasses(sub)}


def test_no_optimizer_carries_speculation_methods():
    """The loop asks `backward_overlap` (None but for LionCub with overlap backward or both); no other optimizer
    has a speculation or overlap member, and LionCub has none beside its backward overlap's."""
    import src.optim.factory  # noqa: F401 - every optimizer of src/optim, so the subclasses are known
    from src.optim.interface import LoopOptimizer
    overlap_names = {n for n in dir(LoopOptimizer) if "speculat" in n or "overlap" in n}
    assert overlap_names == {"backward_overlap"} and LoopOptimizer.backward_overlap is None
    for cls in _subclasses(LoopOptimizer) - {LionCub}:
        own = {n for n in dir(cls) if ("speculat" in n or "overlap" in n)} - overlap_names
        assert not own, (cls.__name__, own)
    for overlap, speculates in ((False, False), ("forward", False), ("backward", True), ("both", True)):
        optimizer = LionCub(_model(tie=True).parameters(), reducer={**REDUCERS["cub4"], "world_size": 1},
                            overlap=overlap)
        assert (optimizer.backward_overlap is not None) == speculates, overlap
