"""``import rngaudit`` stays cheap: no torch, numpy or accelerate until an audit starts."""

from __future__ import annotations

from conftest import run_python


def test_import_rngaudit_does_not_import_heavy_libraries() -> None:
    code = (
        "import sys, rngaudit, rngaudit.cli, rngaudit.startup; "
        "heavy = [m for m in ('torch', 'numpy', 'accelerate', 'torchdata') if m in sys.modules]; "
        "print(heavy)"
    )
    result = run_python(["-c", code])
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_startup_hook_is_installed_and_inert_when_unset() -> None:
    code = (
        "import sys, sysconfig, pathlib; "
        "p = pathlib.Path(sysconfig.get_paths()['purelib']) / 'rngaudit_startup.pth'; "
        "print(p.exists(), 'rngaudit' in sys.modules, 'rngaudit.startup' in sys.modules)"
    )
    result = run_python(["-c", code])
    assert result.stdout.split() == ["True", "False", "False"], result.stderr
