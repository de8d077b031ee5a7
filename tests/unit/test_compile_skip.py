"""torch.compile keeps out of gosym's frames (gosym._compile): Dynamo's trace rules skip
every file of the package, whether Dynamo was imported before gosym or after."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PYTHON = str(Path(__file__).resolve().parents[2] / "python")


def _run(code: str) -> str:
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                       text=True, timeout=240, env={"PYTHONPATH": PYTHON, "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


CHECK = """
    import gosym.backend, gosym.work.cuda
    from torch._dynamo import trace_rules
    for m in (gosym.backend, gosym.work.cuda):
        res = trace_rules.check_file(m.__file__)
        print(m.__name__, res.skipped, res.reason)
"""


@pytest.mark.parametrize("order", ["gosym first", "dynamo first"])
def test_gosym_is_on_dynamos_skip_list(order):
    first = "import gosym\nimport torch._dynamo" if order == "gosym first" else "import torch._dynamo\nimport gosym"
    out = _run(first + "\n" + textwrap.dedent(CHECK))
    assert "gosym.backend True SKIP_DIRS" in out, out
    assert "gosym.work.cuda True SKIP_DIRS" in out, out


def test_import_hook_leaves_once_used():
    out = _run("""
        import sys, gosym
        from gosym._compile import _OnRulesImport
        print("before", sum(isinstance(f, _OnRulesImport) for f in sys.meta_path))
        import torch._dynamo
        print("after", sum(isinstance(f, _OnRulesImport) for f in sys.meta_path))
    """)
    assert "before 1" in out and "after 0" in out, out

