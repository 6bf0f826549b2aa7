"""Fingerprints of generator state: read the state, hash it, never draw."""

from __future__ import annotations

import ctypes
import struct
import zlib
from typing import Any

from rngaudit import forksafe

_MT_WORDS = 624
_PY_BYTES = 4 + 4 * _MT_WORDS  # CPython's _random.Random: int index, then uint32 state[624]
_NP_BYTES = 4 * _MT_WORDS + 4  # numpy's mt19937_state: uint32 key[624], then int pos
_string_at = ctypes.string_at
_lock = forksafe.lock()
# Where the state lives inside the objects, found once per process on private instances and
# checked against getstate()/get_state(); None: not found (the exact slow path is used).
_UNSET = -1  # not looked for yet
_py_offset: int | None = _UNSET
_np_aug_offset: int | None = _UNSET
_AUG = struct.Struct("<i4xd")  # aug_bitgen_t after its pointer: int has_gauss, double gauss
_np_addresses: dict[int, tuple[Any, int]] = {}  # id(bit generator) -> (it, state address)


def _hex(value: int) -> str:
    return f"{value & 0xFFFFFFFF:08x}"


def torch_generator(gen: Any) -> str:
    """Fingerprint of a ``torch.Generator`` (CPU or CUDA) from ``get_state()``."""
    return torch_state_hex(gen.get_state())


def torch_state_hex(state: Any) -> str:
    """The fingerprint of a state ``get_state()`` returned (a CPU byte tensor)."""
    return _hex(zlib.crc32(state.numpy()))


class TorchFingerprint:
    """A torch generator's fingerprint function whose state can be read now and hashed later
    (:meth:`read`: ``get_state()``, 0.5 µs; hashing it, :func:`torch_state_hex`, ~2 µs more)."""

    __slots__ = ("gen",)

    def __init__(self, gen: Any) -> None:
        self.gen = gen

    def __call__(self) -> str:
        return torch_generator(self.gen)

    def read(self) -> Any:
        """The state (a fresh copy: later draws do not change it)."""
        return self.gen.get_state()


# -- Python's random.Random ------------------------------------------------------------------
def _python_bytes(internal: tuple[int, ...]) -> bytes:
    return struct.pack(f"<i{_MT_WORDS}I", internal[-1], *internal[:_MT_WORDS])


def _find_python_offset() -> int | None:
    """Where ``_random.Random`` keeps index and state, checked on private instances through
    the C methods only (the module's and ``random.Random``'s may be rngaudit's wrappers)."""
    import _random
    import random

    base = _random.Random
    for offset in (16, 20, 24, 32):  # after PyObject_HEAD (16 bytes on 64-bit CPython 3.11)
        ok = True
        for seed in (1, 2):
            rng = random.Random.__new__(random.Random)
            base.seed(rng, seed)
            for _ in range(seed * 7):
                base.random(rng)
            if _string_at(id(rng) + offset, _PY_BYTES) != _python_bytes(base.getstate(rng)):
                ok = False
                break
        if ok and random.Random.__basicsize__ >= offset + _PY_BYTES:
            return offset
    return None


def python_random(rng: Any) -> str:
    """Fingerprint of a ``random.Random``: its Mersenne Twister words, index and Gaussian cache.

    Read from the object's memory (1 µs) when the layout was verified at first use, else from
    ``getstate()`` (13 µs); both hash the same bytes.
    """
    global _py_offset
    import random

    if _py_offset == _UNSET:
        with _lock:
            if _py_offset == _UNSET:
                _py_offset = None  # a re-entrant call meanwhile takes the exact slow path
                _py_offset = _find_python_offset()
    offset = _py_offset
    kind = type(rng)
    if (
        offset is not None
        and isinstance(rng, random.Random)
        and kind.getstate is random.Random.getstate
        and kind.__basicsize__ >= offset + _PY_BYTES
    ):
        raw = _string_at(id(rng) + offset, _PY_BYTES)
        gauss = getattr(rng, "gauss_next", None)
    else:
        _, internal, gauss = rng.getstate()
        raw = _python_bytes(internal)
    return _hex(zlib.crc32(repr(gauss).encode(), zlib.crc32(raw)))


# -- numpy -----------------------------------------------------------------------------------
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


def _np_state_address(bitgen: Any) -> int:
    found = _np_addresses.get(id(bitgen))
    if found is not None and found[0] is bitgen:
        return found[1]
    address = int(bitgen.ctypes.state_address)
    if len(_np_addresses) >= 64:
        _np_addresses.clear()
    _np_addresses[id(bitgen)] = (bitgen, address)  # kept alive: its id is not reused
    return address


def _np_legacy_bytes(state: dict[str, Any]) -> bytes:
    inner = state["state"]
    key: bytes = inner["key"].astype("<u4").tobytes()
    return key + struct.pack(
        "<iid", int(inner["pos"]), int(state["has_gauss"]), float(state["gauss"])
    )


def _np_fast_bytes(rs: Any, aug: int) -> bytes:
    address = _np_state_address(rs._bit_generator)
    has_gauss, gauss = _AUG.unpack(_string_at(id(rs) + aug + 8, 16))
    return _string_at(address, _NP_BYTES) + struct.pack("<id", has_gauss, gauss)


def _find_numpy_aug_offset() -> int | None:
    """Offset of ``aug_bitgen_t`` (bit generator pointer, has_gauss, gauss) in a RandomState."""
    import numpy as np

    rs = np.random.RandomState(3)
    base = id(rs)
    size = type(rs).__basicsize__
    address = int(rs._bit_generator.ctypes.state_address)
    word = struct.Struct("<Q")
    words = [word.unpack(_string_at(base + off, 8))[0] for off in range(0, size - 7, 8)]
    bitgen_fields = [i * 8 for i, w in enumerate(words) if w == address]  # bitgen_t.state
    for field in bitgen_fields:
        for i, w in enumerate(words):
            aug = i * 8
            if w != base + field or aug + 24 > size:
                continue
            ok = True
            for draws in (1, 2):  # has_gauss 1, then 0
                probe = np.random.RandomState(draws)
                for _ in range(draws):
                    probe.standard_normal()
                if _np_fast_bytes(probe, aug) != _np_legacy_bytes(probe.get_state(legacy=False)):
                    ok = False
                    break
            if ok:
                return aug
    return None


def numpy_random_state(rs: Any) -> str:
    """Fingerprint of a numpy ``RandomState``: MT19937 key and position and the Gaussian cache.

    Read from memory (~1 µs) when the layout was verified at first use, else from
    ``get_state(legacy=False)`` (28 µs); both hash the same bytes.
    """
    global _np_aug_offset
    bitgen = getattr(rs, "_bit_generator", None)
    if type(bitgen).__name__ != "MT19937":
        return _hex(_crc_obj(rs.get_state(legacy=False), 0))
    if _np_aug_offset == _UNSET:
        with _lock:
            if _np_aug_offset == _UNSET:
                _np_aug_offset = None  # a re-entrant call meanwhile takes the exact slow path
                try:
                    _np_aug_offset = _find_numpy_aug_offset()
                except Exception:
                    _np_aug_offset = None
    aug = _np_aug_offset
    if aug is not None and type(rs).__basicsize__ >= aug + 24:
        raw = _np_fast_bytes(rs, aug)
    else:
        raw = _np_legacy_bytes(rs.get_state(legacy=False))
    return _hex(zlib.crc32(raw))


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
