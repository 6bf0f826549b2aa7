"""GPU check of the torch interception (one short run on a CUDA machine); prints one JSON object.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/gpu_check.py

For each case: the draw events rngaudit recorded (op, generator, count) and whether the values
and the CUDA generator state were bit-identical with and without the audit. Cases: fused
dropout, SDPA with and without dropout, `cuda:N` default-generator naming, cuDNN LSTM dropout,
and a draw captured in a CUDA graph (capture must work inside the window).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

import rngaudit
from rngaudit.capture.instrument import torch_ops as instrument_torch


def draws(a: rngaudit.Audit) -> list[tuple[str, str, int]]:
    assert a.report is not None
    events = a.report.ranks[0]["events"]
    return [(e["op"], e["generator"], e["count"]) for e in events if e["kind"] == "draw"]


def case(fn: Callable[[], Any]) -> dict[str, Any]:
    """Run ``fn`` unaudited and audited from the same seed; compare outputs and CUDA state."""
    out: dict[str, Any] = {}
    try:
        torch.cuda.manual_seed_all(0)
        plain = fn()
        plain_state = torch.cuda.get_rng_state()
        torch.cuda.manual_seed_all(0)
        with rngaudit.audit(mode="report", report_dir=tempfile.mkdtemp()) as a:
            audited = fn()
        out["draws"] = draws(a)
        same = [torch.equal(p, q) for p, q in zip(_flat(plain), _flat(audited), strict=True)]
        out["bit_identical"] = all(same) and torch.equal(plain_state, torch.cuda.get_rng_state())
    except Exception as exc:  # report, do not stop the other cases
        out["error"] = repr(exc)
    return out


def _flat(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, tuple | list):
        return [t for v in value for t in _flat(v)]
    return []


def main() -> None:
    assert torch.cuda.is_available(), "needs a GPU"
    dev = torch.device("cuda", torch.cuda.device_count() - 1)
    torch.cuda.set_device(dev)
    x = torch.ones(4096, device=dev)
    q = torch.randn(2, 4, 128, 64, device=dev, dtype=torch.float16)
    lstm = torch.nn.LSTM(16, 16, num_layers=2, dropout=0.5).to(dev)
    inp = torch.randn(5, 3, 16, device=dev)
    static = torch.zeros(64, device=dev)

    def graph() -> torch.Tensor:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            static.uniform_()  # warm-up outside the capture
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            static.uniform_()
        g.replay()
        torch.cuda.synchronize()
        return static.clone()

    result = {
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(dev),
        "mechanism": "key" if instrument_torch.keyed_kernels() is not None else "mode",
        "dropout": case(lambda: F.dropout(x, 0.5, training=True)),
        "sdpa_dropout": case(lambda: F.scaled_dot_product_attention(q, q, q, dropout_p=0.1)),
        "sdpa_no_dropout": case(lambda: F.scaled_dot_product_attention(q, q, q, dropout_p=0.0)),
        "rand_cuda_n": case(lambda: torch.rand(8, device=dev)),
        "lstm_dropout": case(lambda: lstm(inp)[0]),
        "cuda_graph": case(graph),
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
