"""Optimizers: Lion, LionCub (distributed Lion with compressed updates), Lion with gradient allreduce, and the
baselines of the neighbouring papers (G-AdamW, 1-bit Adam, BitDP, the optimizers of the PyTorch DDP baseline)."""
from src.optim.adamw_allreduce import AdamW, GradAllreduceAdamW
from src.optim.bitdp import BitDP
from src.optim.ddp import DDPAdamW, DDPLion
from src.optim.grad_allreduce import GradAllreduceLion
from src.optim.lion import Lion
from src.optim.lion_cub import LionCub
from src.optim.momentum_sync import MomentumSync, named_parameters_with_aliases
from src.optim.onebit_adam import OneBitAdam

__all__ = ["Lion", "LionCub", "GradAllreduceLion", "MomentumSync", "named_parameters_with_aliases", "AdamW",
           "GradAllreduceAdamW", "OneBitAdam", "BitDP", "DDPLion", "DDPAdamW"]
