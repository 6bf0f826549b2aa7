"""A seeded generator of distributed loader configurations (issue 33): what one config draws."""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass

DEFAULT_SEEDS = (33, 7)  # RNGAUDIT_GEN_SEED: others, comma-separated
DEFAULT_COUNT = 16  # configs per seed and world size (RNGAUDIT_GEN_COUNT draws more)

SHARDS = ("dist", "dist_sub", "accel", "self", "subset_rank")
LOOPS = ("ddp", "accel", "bare")
WRAPPERS = ("plain", "subset", "concat", "user")
# corruption -> the shard kinds it applies to
CORRUPTIONS: dict[str, tuple[str, ...]] = {
    "none": SHARDS,
    "seed_per_rank": SHARDS,  # the order's seed (or the global state it is drawn from) per rank
    "rank0_draw": SHARDS,  # rank 0 alone draws from the global generator before the order
    "dataset_order_per_rank": SHARDS,  # the dataset itself reordered per rank (a Subset)
    "set_epoch_differs": ("dist", "dist_sub", "self"),  # the last rank one epoch behind
    "set_epoch_forgotten": ("dist", "dist_sub", "self"),  # the same order twice: no error
    "rank_seed_unused": SHARDS,  # per-rank global seeds; the order comes from a shared seed
    "seed_after_order": SHARDS,  # per-rank global seeds once the order is fixed
    "noshuffle_rank_seed": SHARDS,  # shuffle=False with per-rank seeds
    "augment_rank_seed": SHARDS,  # per-rank augmentation seeds (numpy, in __getitem__)
}


def claimed_harmful(corruption: str, shard: str) -> bool:
    """What the generator means a corruption to do: checked against the truth measured."""
    if corruption in ("seed_per_rank", "set_epoch_differs", "dataset_order_per_rank"):
        return True
    # rank 0's draw moves the global generator: harmful where the order comes from it
    return corruption == "rank0_draw" and shard not in ("dist", "dist_sub")


@dataclass(frozen=True)
class Config:
    id: str
    world: int
    n: int
    batch: int
    drop_last: bool
    workers: int
    wrapper: str
    shard: str
    loop: str
    corruption: str
    epochs: int = 2

    def as_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    def twin(self) -> Config:
        """The same layout, intact, in one epoch: what the sharding kind promises."""
        return Config(
            id=self.id + "-twin", world=self.world, n=self.n, batch=self.batch,
            drop_last=self.drop_last, workers=0, wrapper=self.wrapper, shard=self.shard,
            loop="bare", corruption="none", epochs=1,
        )  # fmt: skip


def draw(seed: int, count: int, world: int) -> list[Config]:
    """``count`` configs for ``world`` ranks: the same list for the same arguments."""
    rng = random.Random(f"{seed}-{world}")
    out = []
    for k in range(count):
        shard = rng.choice(SHARDS)
        harmful = rng.random() < 0.45
        corruption = rng.choice(
            [
                c
                for c, on in CORRUPTIONS.items()
                if shard in on and claimed_harmful(c, shard) == harmful
            ]
        )
        batch = rng.choice((1, 2, 3, 4))
        # sizes not divisible by world * batch are the common case
        n = rng.choice((world * batch * rng.randint(2, 4), rng.randint(10, 41)))
        out.append(
            Config(
                id=f"w{world}-s{seed}-{k:02d}",
                world=world,
                n=n,
                batch=batch,
                drop_last=rng.random() < 0.4,
                workers=2 if rng.random() < 0.1 else 0,
                wrapper=rng.choice(WRAPPERS),
                shard=shard,
                loop=rng.choice(LOOPS),
                corruption=corruption,
            )
        )
    return out


def from_json(text: str) -> Config:
    fields = json.loads(text)
    assert isinstance(fields, dict)
    return Config(**fields)
