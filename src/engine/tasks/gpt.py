"""GPT language modelling on token windows (Lion Cub, Section 7 and Appendix D.1: GPT-2++ on OpenWebText).

Each rank draws its own random windows (`src.data.TokenWindows`, seeded by rank); the loss is the model's
next-token cross entropy. Evaluation is the validation loss over `train.eval_batches` windows per rank, the same
windows at every evaluation (the val stream is rewound), averaged over ranks. A step consumes
batch_size * block_size * world_size tokens, each costing 6 N + 12 L H Q T training FLOPs (src/models/flops.py).
Resumed at another world size, every rank draws from a new stream of its own (the seed src.reliability.resize
derives for it): no rank replays another rank's windows.
"""
from __future__ import annotations

import torch

from src.data import TokenWindows
from src.errors import SetupError
from src.engine.tasks.base import Task, sum_over_ranks
from src.models.flops import model_flops_per_token
from src.models.gpt import check_stated


class GPTTask(Task):
    name = "gpt"
    unit = "tokens"
    model_kinds = ("gpt",)
    data_kinds = ("tokens",)

    def check_model(self, model: torch.nn.Module) -> None:
        block = self.cfg.data.block_size  # a positive integer, as the schema typed data.block_size
        try:
            check_stated(self.model_params(), model.config)
        except ValueError as exc:
            raise SetupError(str(exc)) from exc
        model_block = model.config.block_size
        if block > model_block:
            raise SetupError(f"data.block_size={block} (the training sequence length) exceeds the model's "
                             f"block_size={model_block} (model={self.cfg.model.params}); lower data.block_size to "
                             f"{model_block} or less, or raise model.params.block_size to {block}")

    def _windows(self, split: str, vocab_size: int) -> TokenWindows:
        d = self.cfg.data
        return TokenWindows(d.dir, split, block_size=d.block_size, batch_size=d.batch_size, rank=self.ctx.rank,
                            world_size=self.ctx.world_size, seed=int(self.cfg.seed), device=self.ctx.device,
                            vocab_size=vocab_size)

    def open_data(self, model: torch.nn.Module) -> None:
        vocab = model.config.vocab_size
        self.train = self._windows("train", vocab)
        self.val = self._windows("val", vocab)
        self._val_start = self.val.state_dict()

    def units_per_step(self) -> int:
        return self.cfg.data.batch_size * self.cfg.data.block_size * self.ctx.world_size

    def flops_per_unit(self, model: torch.nn.Module) -> int:
        return model_flops_per_token(model, self.cfg.data.block_size)

    def next_batch(self):
        return self.train.next_batch()

    def loss(self, model: torch.nn.Module, batch) -> torch.Tensor:
        x, y = batch
        _, loss = model(x, y)
        return loss

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module) -> dict[str, float]:
        was_training = model.training
        model.eval()
        self.val.load_state_dict(self._val_start)
        n = self.cfg.train.eval_batches
        total = torch.zeros((), dtype=torch.float64, device=self.ctx.device)
        for _ in range(n):
            total += self.loss(model, self.val.next_batch()).double()
        mean = sum_over_ranks(total / n).item() / self.ctx.world_size
        model.train(was_training)
        return {"val/loss": mean}

    def data_state(self) -> dict:
        return {"train": self.train.state_dict()}

    def load_data_state(self, state: dict) -> None:
        self.train.load_state_dict(state["train"])

    def position(self, state: dict | None = None) -> dict:
        return {"batches_drawn": int((state or self.data_state())["train"]["batches_drawn"])}

    def load_resized_data_state(self, state: dict, old_world_size: int, seed: int) -> str:
        self.train.continue_stream(seed, int(state["train"]["batches_drawn"]))
        return "token windows: a new stream for every rank (seed derived from seed, step, world size, rank)"
