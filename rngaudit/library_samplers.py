"""The library samplers rngaudit knows by name: which shuffle, which are library code."""

from __future__ import annotations

# Samplers whose order is random by design (a repeated order across epochs is suspicious).
SHUFFLING = (
    "RandomSampler",
    "SeedableRandomSampler",
    "SubsetRandomSampler",
    "WeightedRandomSampler",
)

# Every library sampler (torch, torchdata, accelerate): a chain ending in one is not the user's.
LIBRARY = (
    *SHUFFLING,
    "SequentialSampler",
    "BatchSampler",
    "DistributedSampler",
    "BatchSamplerShard",
    "SkipBatchSampler",
    "IterableDatasetShard",
    "StatefulDistributedSampler",
)
