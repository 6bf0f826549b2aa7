"""A script that draws but never builds a DataLoader."""

from __future__ import annotations

import random

import torch

torch.rand(3)  # only-draw
random.random()
print("done")
