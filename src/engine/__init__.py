"""The training engine of lioncub: one loop for every task of Section 7 (GPT, ResNet/DeiT on CIFAR100)."""
