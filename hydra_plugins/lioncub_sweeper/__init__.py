"""lioncub's Hydra sweeper (`hydra/sweeper: lioncub`, the default in conf/config.yaml): see lioncub_sweeper.py."""
