"""A batch's content digest tells content apart; a part of an unknown kind makes it unknown."""

from __future__ import annotations

import numpy as np
import torch

from rngaudit.capture import batch_digest


def test_the_content_digest_tells_content_apart_and_unknown_is_none() -> None:
    batch = {"x": torch.arange(6).view(2, 3), "y": [1, "a", b"b", None], "z": np.ones(2)}
    same = {"x": torch.arange(6).view(2, 3), "y": [1, "a", b"b", None], "z": np.ones(2)}
    assert batch_digest.digest(batch) is not None and batch_digest.digest(
        batch
    ) == batch_digest.digest(same)
    assert batch_digest.digest(torch.arange(4)) != batch_digest.digest(torch.arange(4) + 1)
    assert batch_digest.digest(torch.arange(4)) != batch_digest.digest(torch.arange(4).view(2, 2))
    assert batch_digest.digest([torch.zeros(1), object()]) is None  # an unknown part: unknown
    assert batch_digest.digest(np.array([object()])) is None
