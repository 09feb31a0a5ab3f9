"""Optimizers: Lion, LionCub (distributed Lion with compressed updates) and Lion with gradient allreduce."""
from src.optim.grad_allreduce import GradAllreduceLion
from src.optim.lion import Lion
from src.optim.lion_cub import LionCub
from src.optim.momentum_sync import MomentumSync, named_parameters_with_aliases

__all__ = ["Lion", "LionCub", "GradAllreduceLion", "MomentumSync", "named_parameters_with_aliases"]
