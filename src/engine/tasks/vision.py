"""Image classification on CIFAR100 (Lion Cub, Section 7, Fig. 11 and 13; Appendix D.2: ResNet-18 and DeiT).

Each rank sees a disjoint shard of every epoch (a `DistributedSampler` with an explicit rank and world size, so it
needs no process group; `drop_last` keeps every rank at the same number of steps). Evaluation is top-1 accuracy and
mean cross entropy over the whole test set, split across ranks without padding (rank r takes images r, r+W, ...)
and summed over ranks, so every image counts exactly once. A step consumes batch_size * world_size images.

The data position (epoch and batches drawn in it) is saved in checkpoints; a resumed run skips the epoch's first
batches by index (`_ResumableSampler`, no image is loaded for them). Resume is bitwise with `data.num_workers=0`
(augmentations draw from the restored global RNG); with workers the order of images is exact but the workers'
augmentation seeds come from a new base seed, so augmentations differ from the interrupted run (documented in
docs/reliability.md).

At another world size: after b batches of B images on P ranks, an epoch has used exactly the first P * B * b
positions of its permutation (rank r took positions r, r + P, ...). A run resumed on P' ranks splits the rest of
that permutation, from that position (`offset`) on, the same way over its ranks, so the epoch neither repeats nor
skips an image (as in any epoch, fewer than P' * B images at its end that do not fill a step are left out); the next
epochs are ordinary P'-rank epochs. `resized_steps` counts the steps left accordingly.
"""
from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Sampler, Subset
from torch.utils.data.distributed import DistributedSampler

from src.data import CIFAR100Folder, eval_transform, train_transform
from src.errors import SetupError
from src.engine.tasks.base import Task, sum_over_ranks


class _ResumableSampler(Sampler):
    """A DistributedSampler's indices for the current epoch, from position `start` on; in an epoch taken over from
    another world size, the rest of its permutation from `offset` on, split over the ranks as the sampler splits."""

    def __init__(self, base: DistributedSampler):
        self.base, self.start, self.offset = base, 0, 0

    def set_epoch(self, epoch: int) -> None:
        self.base.set_epoch(epoch)

    def _rest(self) -> list[int]:
        """This rank's indices of the permutation's positions offset, offset + 1, ... (every rank the same count)."""
        base = self.base
        g = torch.Generator().manual_seed(base.seed + base.epoch)  # DistributedSampler's permutation of the epoch
        rest = torch.randperm(len(base.dataset), generator=g)[self.offset:].tolist()
        each = len(rest) // base.num_replicas
        return rest[base.rank: each * base.num_replicas: base.num_replicas]

    def __iter__(self):
        return itertools.islice(iter(self.base) if self.offset == 0 else iter(self._rest()), self.start, None)

    def __len__(self) -> int:
        total = len(self.base) if self.offset == 0 else (len(self.base.dataset) - self.offset) // self.base.num_replicas
        return max(0, total - self.start)


class VisionTask(Task):
    name = "vision"
    unit = "samples"
    model_kinds = ("resnet18_cifar", "deit")
    data_kinds = ("cifar100",)

    def check_model(self, model: torch.nn.Module) -> None:
        """Run a 2-image batch of the data's shape through (a meta copy of) the model and check its classes."""
        d = self.cfg.data
        img, classes = d.img_size, d.num_classes  # positive integers, as the schema typed them
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                out = model(torch.zeros(2, 3, img, img, device=next(model.parameters()).device))
        except (RuntimeError, AssertionError, ValueError) as exc:
            raise SetupError(f"model {self.cfg.model.kind} ({self.cfg.model.params}) cannot take {img}x{img} images "
                             f"(data.img_size={img}): {exc}") from exc
        finally:
            model.train(was_training)
        if out.shape[-1] != classes:
            raise SetupError(f"model {self.cfg.model.kind} outputs {out.shape[-1]} classes but data.num_classes="
                             f"{classes}; set model.params.num_classes={classes}")

    def open_data(self, model: torch.nn.Module) -> None:
        d, ctx = self.cfg.data, self.ctx
        self.train_set = CIFAR100Folder(d.root, train=True, transform=train_transform(d.img_size))
        self.test_set = CIFAR100Folder(d.root, train=False, transform=eval_transform(d.img_size))
        found = getattr(self.train_set, "num_classes", d.num_classes)
        if found > d.num_classes:
            raise SetupError(f"{d.root} holds {found} classes but data.num_classes={d.num_classes} (the model's "
                             f"output size); set data.num_classes={found}")
        need = d.batch_size * ctx.world_size
        if len(self.train_set) < need:
            raise SetupError(f"{d.root}: {len(self.train_set)} training images cannot fill one step of "
                             f"data.batch_size={d.batch_size} x world size {ctx.world_size} = {need}; lower "
                             "data.batch_size or use fewer processes")
        self.sampler = _ResumableSampler(DistributedSampler(self.train_set, num_replicas=ctx.world_size,
                                                            rank=ctx.rank, shuffle=True, seed=int(self.cfg.seed),
                                                            drop_last=True))
        self.loader = DataLoader(self.train_set, batch_size=d.batch_size, sampler=self.sampler, drop_last=True,
                                 num_workers=d.num_workers, pin_memory=ctx.device.type == "cuda",
                                 persistent_workers=d.num_workers > 0)
        self.epoch, self.batch, self._it = 0, 0, None

    def units_per_step(self) -> int:
        return self.cfg.data.batch_size * self.ctx.world_size

    def steps_per_epoch(self) -> int:
        return len(self.sampler.base) // self.cfg.data.batch_size

    def next_batch(self):
        while True:
            if self._it is None:
                self.sampler.set_epoch(self.epoch)
                self._it = iter(self.loader)
            try:
                x, y = next(self._it)
                self.batch += 1
                break
            except StopIteration:
                self.epoch, self.batch, self._it, self.sampler.start = self.epoch + 1, 0, None, 0
                self.sampler.offset = 0
        dev = self.ctx.device
        return x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)

    def loss(self, model: torch.nn.Module, batch) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(model(x), y)

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module) -> dict[str, float]:
        was_training = model.training
        model.eval()
        ctx, d = self.ctx, self.cfg.data
        shard = Subset(self.test_set, range(ctx.rank, len(self.test_set), ctx.world_size))
        loader = DataLoader(shard, batch_size=d.eval_batch_size, num_workers=d.num_workers)
        sums = torch.zeros(3, dtype=torch.float64, device=ctx.device)  # correct, loss sum, count
        for x, y in loader:
            x, y = x.to(ctx.device), y.to(ctx.device)
            logits = model(x)
            sums += torch.stack([(logits.argmax(-1) == y).sum().double(),
                                 F.cross_entropy(logits.float(), y, reduction="sum").double(),
                                 torch.tensor(float(len(y)), dtype=torch.float64, device=ctx.device)])
        correct, loss, count = sum_over_ranks(sums).tolist()
        model.train(was_training)
        return {"val/acc": correct / count, "val/loss": loss / count}

    def data_state(self) -> dict:
        """Epoch, batches drawn in it, where this world size took the epoch over (`offset`, 0 unless resized) and
        the permutation positions used so far (`samples`)."""
        used = self.sampler.offset + self.ctx.world_size * self.cfg.data.batch_size * self.batch
        return {"epoch": self.epoch, "batch": self.batch, "offset": self.sampler.offset, "samples": used}

    def position(self, state: dict | None = None) -> dict:
        return dict(state or self.data_state())

    def load_data_state(self, state: dict) -> None:
        """Continue at batch `batch` of epoch `epoch`; the iterator is built now, before the RNGs are restored,
        exactly as the interrupted run built it at the start of the epoch (it draws a seed from the global RNG)."""
        self.epoch, self.batch, self._it = int(state["epoch"]), int(state["batch"]), None
        self.sampler.offset = int(state.get("offset", 0))  # absent in checkpoints of runs never resized
        if self.batch > 0 or self.sampler.offset > 0:
            self.sampler.start = self.batch * self.cfg.data.batch_size
            self.sampler.set_epoch(self.epoch)
            self._it = iter(self.loader)

    def _used(self, state: dict, old_world_size: int) -> int:
        """Permutation positions of epoch `state["epoch"]` that `state`'s run had used."""
        if "samples" in state:
            return int(state["samples"])
        return int(state.get("offset", 0)) + old_world_size * self.cfg.data.batch_size * int(state["batch"])

    def load_resized_data_state(self, state: dict, old_world_size: int, seed: int) -> str:
        """Take over epoch `state["epoch"]` after the positions the old ranks used (see the module docstring)."""
        used = self._used(state, old_world_size)
        self.load_data_state({"epoch": state["epoch"], "batch": 0, "offset": used})
        return (f"epoch {self.epoch} continues from position {used} of its permutation, split over "
                f"{self.ctx.world_size} ranks (no image repeated or skipped)")

    def resized_steps(self, position: dict, step: int, epochs: int) -> int | None:
        """`step`, plus the steps left in the current epoch from `position`, plus the later epochs' steps."""
        if "samples" not in position:
            return None
        left = (len(self.train_set) - int(position["samples"])) // self.ctx.world_size // self.cfg.data.batch_size
        later = max(0, epochs - int(position["epoch"]) - 1) * self.steps_per_epoch()
        return step + max(0, left) + later
