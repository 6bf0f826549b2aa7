"""What the launcher told this process: rank, world size, restart attempt, the store, node, fork."""

from __future__ import annotations

import os
from collections.abc import Mapping

# Every launcher variable rngaudit reads (torchrun, accelerate launch, mp.spawn scripts and
# notebook_launcher all set the first three). A new launcher's variables go here, read below.
ENV_RANK = "RANK"  # this process's global rank
ENV_WORLD_SIZE = "WORLD_SIZE"  # how many ranks the launcher started
ENV_LOCAL_RANK = "LOCAL_RANK"  # this process's rank on its node
ENV_RESTART = "TORCHELASTIC_RESTART_COUNT"  # torchrun's restart attempt (0 the first)
ENV_AGENT_STORE = "TORCHELASTIC_USE_AGENT_STORE"  # "True": torchrun's agent hosts the store
ENV_MASTER_ADDR = "MASTER_ADDR"  # where the process group's store listens
ENV_MASTER_PORT = "MASTER_PORT"


def _number(name: str, default: int, environ: Mapping[str, str] | None) -> int:
    """``name``'s value as an integer, at least ``default``; ``default`` when unreadable."""
    value = (os.environ if environ is None else environ).get(name, "")
    try:
        return max(default, int(value or default))
    except ValueError:
        return default


def rank(environ: Mapping[str, str] | None = None) -> int:
    """The rank the launcher announced (``RANK``), 0 when absent or unreadable."""
    return _number(ENV_RANK, 0, environ)


def world_size(environ: Mapping[str, str] | None = None) -> int:
    """The world size the launcher announced (``WORLD_SIZE``), 1 when absent or unreadable."""
    return _number(ENV_WORLD_SIZE, 1, environ)


def local_rank(environ: Mapping[str, str] | None = None) -> int:
    """This process's rank on its node (``LOCAL_RANK``), 0 when absent or unreadable."""
    return _number(ENV_LOCAL_RANK, 0, environ)


def restart_attempt(environ: Mapping[str, str] | None = None) -> int:
    """The torchelastic restart attempt of this process (``--max-restarts``): 0 when the
    variable is absent or unreadable."""
    return _number(ENV_RESTART, 0, environ)


def store_host(environ: Mapping[str, str] | None = None) -> int | None:
    """The rank that hosts the process group's store: 0, unless the launcher hosts it
    (torchrun's agent: ``TORCHELASTIC_USE_AGENT_STORE``), then None."""
    env = os.environ if environ is None else environ
    return None if env.get(ENV_AGENT_STORE) == "True" else 0


def store_address(environ: Mapping[str, str] | None = None) -> str:
    """``MASTER_ADDR:MASTER_PORT``, each ``?`` when not set."""
    env = os.environ if environ is None else environ
    return f"{env.get(ENV_MASTER_ADDR, '?')}:{env.get(ENV_MASTER_PORT, '?')}"


def node() -> str:
    """The name of the machine this process runs on."""
    import socket  # here: ``import rngaudit`` stays cheap

    return socket.gethostname()


def forked_since(pid: int) -> bool:
    """Whether this process is not the process ``pid`` any more: a child forked since that
    pid was noted (it inherited the parent's state, hooks and ``atexit`` callbacks)."""
    return os.getpid() != pid
