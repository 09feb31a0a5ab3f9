"""Slurm for lioncub (Lion Cub, Section 7: multi-node runs): submission of experiments and sweeps
(`python -m slurm.submit`), their status (`python -m slurm.status`), cluster profiles, and a real local Slurm on
the emulated Ethernet cluster (`python -m slurm.local`, `make slurm-up`). See docs/slurm.md."""
