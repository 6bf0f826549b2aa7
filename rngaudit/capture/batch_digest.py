"""A batch's content digest: what a loader returned, fingerprinted without a draw."""

from __future__ import annotations

import contextlib
import hashlib
import sys
from typing import Any

DIGEST_BYTES = 1 << 20  # bytes of one array leaf digested (its shape and dtype always)
DIGEST_LEAVES = 256  # leaves of a batch digested
_DEPTH = 6


def digest(batch: Any) -> str | None:
    """A digest of a batch's content: tensors and arrays (shape, dtype, up to ``DIGEST_BYTES``
    of their data), numbers, strings and bytes, in nested dicts, lists and tuples; None when
    any part is of another kind (unknown), on another device than the CPU, or too big."""
    h = hashlib.blake2b(digest_size=8)
    leaves = [0]
    try:
        if not _feed(h, batch, 0, leaves):
            return None
    except Exception:
        return None
    return h.hexdigest()


def _feed(h: Any, obj: Any, depth: int, leaves: list[int]) -> bool:
    leaves[0] += 1
    if depth > _DEPTH or leaves[0] > DIGEST_LEAVES:
        return False
    if obj is None or type(obj) in (bool, int, float, complex, str):
        h.update(f"{type(obj).__name__}:{obj!r};".encode())
        return True
    if type(obj) is bytes:
        h.update(b"bytes:" + obj + b";")
        return True
    if type(obj) in (list, tuple):
        h.update(f"{type(obj).__name__}[{len(obj)}](".encode())
        return all(_feed(h, v, depth + 1, leaves) for v in obj) and _close(h)
    if type(obj) is dict:
        h.update(f"dict[{len(obj)}](".encode())
        for k, v in obj.items():
            if type(k) not in (str, int) or not _feed(h, k, depth + 1, leaves):
                return False
            if not _feed(h, v, depth + 1, leaves):
                return False
        return _close(h)
    return _array(h, obj)


def _close(h: Any) -> bool:
    h.update(b")")
    return True


def _array(h: Any, obj: Any) -> bool:
    np = sys.modules.get("numpy")
    torch = sys.modules.get("torch")
    if torch is not None and type(obj) is torch.Tensor:
        if obj.device.type != "cpu" or obj.layout != torch.strided or obj.is_complex():
            return False
        flat = obj.detach().reshape(-1)
        count = max(1, DIGEST_BYTES // max(1, obj.element_size()))
        with contextlib.suppress(Exception):
            data = flat[:count].contiguous().numpy().tobytes()
            h.update(f"tensor{tuple(obj.shape)}{obj.dtype}:".encode() + data + b";")
            return True
        return False
    if np is not None and type(obj) is np.ndarray:
        if obj.dtype.kind not in "biufS":
            return False
        count = max(1, DIGEST_BYTES // max(1, obj.itemsize))
        data = np.ascontiguousarray(obj.reshape(-1)[:count]).tobytes()
        h.update(f"ndarray{obj.shape}{obj.dtype}:".encode() + data + b";")
        return True
    if np is not None and isinstance(obj, np.generic) and type(obj).__module__ == "numpy":
        h.update(f"{type(obj).__name__}:{obj!r};".encode())
        return True
    return False
