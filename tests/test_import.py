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


def test_the_cli_loads_only_the_offline_half() -> None:
    code = (
        "import sys, rngaudit.cli; "
        "print(' '.join(sorted(m for m in sys.modules if m.startswith('rngaudit'))))"
    )
    result = run_python(["-c", code])
    assert result.returncode == 0, result.stderr
    loaded = result.stdout.split()
    assert "rngaudit.reports.reading" in loaded and "rngaudit.reports.html_page" in loaded
    engine = ("rngaudit.capture", "rngaudit.ranks", "rngaudit.epochs", "rngaudit.workers")
    assert [m for m in loaded if m.startswith(engine)] == []
    assert not {"rngaudit.with_block", "rngaudit.whole_run", "rngaudit.startup"} & set(loaded)


def test_import_rngaudit_loads_only_the_errors_until_a_name_is_used() -> None:
    code = (
        "import sys, rngaudit; "
        "before = sorted(m for m in sys.modules if m.startswith('rngaudit')); "
        "audit = rngaudit.audit; from rngaudit import AuditReport, Finding, wait_for_reports; "
        "print(before, callable(audit), AuditReport.__name__, Finding.__name__, "
        "wait_for_reports.__module__, 'audit' in dir(rngaudit))"
    )
    result = run_python(["-c", code])
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [
        "['rngaudit',",
        "'rngaudit.errors']",
        "True",
        "AuditReport",
        "Finding",
        "rngaudit.report_files",
        "True",
    ]


def test_an_unknown_attribute_is_an_attribute_error() -> None:
    import rngaudit

    assert not hasattr(rngaudit, "no_such_name")
