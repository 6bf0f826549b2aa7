"""Fingerprints of generator state: read the state, hash it, never draw."""

from __future__ import annotations

import zlib
from array import array
from typing import Any


def _hex(value: int) -> str:
    return f"{value & 0xFFFFFFFF:08x}"


def torch_generator(gen: Any) -> str:
    """Fingerprint of a ``torch.Generator`` (CPU or CUDA) from ``get_state()``."""
    state = gen.get_state()
    return _hex(zlib.crc32(state.numpy()))


def python_random(rng: Any) -> str:
    """Fingerprint of a ``random.Random`` from ``getstate()``."""
    version, internal, gauss = rng.getstate()
    crc = zlib.crc32(array("L", internal).tobytes())
    return _hex(zlib.crc32(repr((version, gauss)).encode(), crc))


def _crc_obj(obj: Any, crc: int) -> int:
    if isinstance(obj, dict):
        for key in sorted(obj):
            crc = zlib.crc32(str(key).encode(), crc)
            crc = _crc_obj(obj[key], crc)
        return crc
    if hasattr(obj, "tobytes") and hasattr(obj, "dtype"):
        return zlib.crc32(obj.tobytes(), crc)
    return zlib.crc32(repr(obj).encode(), crc)


def numpy_generator(gen: Any) -> str:
    """Fingerprint of a numpy ``Generator`` (its bit generator's state)."""
    return _hex(_crc_obj(gen.bit_generator.state, 0))


def numpy_random_state(rs: Any) -> str:
    """Fingerprint of a numpy ``RandomState`` (``get_state(legacy=False)``)."""
    return _hex(_crc_obj(rs.get_state(legacy=False), 0))


def of(obj: Any) -> str | None:
    """Fingerprint any supported generator object; None for anything else."""
    name = type(obj).__name__
    module = type(obj).__module__ or ""
    try:
        if module.startswith("torch") and name == "Generator":
            return torch_generator(obj)
        if module.startswith("numpy") and name == "Generator":
            return numpy_generator(obj)
        if module.startswith("numpy") and name == "RandomState":
            return numpy_random_state(obj)
        if hasattr(obj, "getstate") and hasattr(obj, "getrandbits"):
            return python_random(obj)
    except Exception:  # a state that cannot be read is reported as unknown
        return None
    return None


def digest_bytes(data: Any) -> str:
    """A short digest of a buffer (used for sampler outputs)."""
    return _hex(zlib.crc32(data))
