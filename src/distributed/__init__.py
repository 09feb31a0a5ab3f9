"""Process-group setup for data-parallel Lion / Lion Cub training (Section 7: torchrun + NCCL, or gloo on CPU)."""
from src.distributed.process_group import (DistContext, broadcast_object, describe, gather_objects,
                                           init_process_group, shutdown)

__all__ = ["DistContext", "broadcast_object", "describe", "gather_objects", "init_process_group", "shutdown"]
