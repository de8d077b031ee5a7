"""Loading the package: backend registration, ABI check, and clear ImportErrors
when GOSYM_LIBRARY points at something that is not a matching libgosym.so.
Every case runs in a fresh interpreter, since loading is once per process."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
from conftest import PYDIR, REPO, run_python

HEADER = REPO / "cabi" / "gosym.h"


def import_error_of(env: dict) -> str:
    """Imports gosym under env; returns the ImportError text (fails on anything else)."""
    p = run_python(
        "import sys\n"
        "try:\n"
        "    import gosym\n"
        "except ImportError as e:\n"
        "    print('IMPORT_ERROR:', e)\n"
        "    sys.exit(3)\n",
        env=env,
    )
    assert p.returncode == 3, f"expected an ImportError, got rc {p.returncode}\n{p.stdout}\n{p.stderr[-3000:]}"
    return p.stdout


def test_import_registers_backend():
    p = run_python(
        "import json, torch.distributed as dist, gosym\n"
        "print(json.dumps({'listed': 'gosym' in dist.Backend.backend_list,\n"
        "                  'available': dist.is_backend_available('gosym'),\n"
        "                  'stats': gosym.process_stats()}))\n"
    )
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["listed"] and out["available"], out
    assert isinstance(out["stats"], dict) and out["stats"], out


def test_library_abi_matches_header():
    want = int(re.search(r"#define GOSYM_ABI_VERSION (\d+)u?", HEADER.read_text()).group(1))
    p = run_python(
        "import ctypes\n"
        f"lib = ctypes.CDLL({str(PYDIR / 'gosym' / 'libgosym.so')!r})\n"
        "lib.gosym_abi_version.restype = ctypes.c_uint32\n"
        "print(lib.gosym_abi_version())\n"
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert int(p.stdout.strip()) == want


@pytest.mark.without_library
def test_missing_library_is_import_error(tmp_path):
    missing = tmp_path / "nowhere" / "libgosym.so"
    out = import_error_of({"GOSYM_LIBRARY": str(missing)})
    assert str(missing) in out


@pytest.mark.without_library
def test_non_library_file_is_import_error(tmp_path):
    bogus = tmp_path / "libgosym.so"
    bogus.write_text("this is not an ELF file\n")
    out = import_error_of({"GOSYM_LIBRARY": str(bogus)})
    assert str(bogus) in out


def build_stub(tmp_path, source: str):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build a stub library")
    src = tmp_path / "stub.c"
    src.write_text(source)
    lib = tmp_path / "libstub.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(src)], check=True, capture_output=True)
    return lib


@pytest.mark.without_library
def test_library_without_gosym_symbols_is_import_error(tmp_path):
    lib = build_stub(tmp_path, "int not_gosym(void) { return 0; }\n")
    out = import_error_of({"GOSYM_LIBRARY": str(lib)})
    assert "gosym_" in out, out


@pytest.mark.without_library
def test_wrong_abi_version_is_import_error(tmp_path):
    """A library exporting every function of the header, but the wrong ABI version."""
    text = HEADER.read_text()
    want = int(re.search(r"#define GOSYM_ABI_VERSION (\d+)u?", text).group(1))
    names = sorted(set(re.findall(r"^\S.*?\b(gosym_[a-z_]+)\(", text, re.M)) - {"gosym_abi_version"})
    stubs = "".join(f"int {n}(void) {{ return 0; }}\n" for n in names)
    lib = build_stub(tmp_path, stubs + f"unsigned gosym_abi_version(void) {{ return {want + 41}u; }}\n")
    out = import_error_of({"GOSYM_LIBRARY": str(lib)})
    assert "ABI" in out and str(want + 41) in out, out


WORLD_ONE = """
import datetime, json, torch, torch.distributed as dist, gosym
dist.init_process_group("gosym", store=dist.HashStore(), rank=0, world_size=1,
                        timeout=datetime.timedelta(seconds=30))
t = torch.arange(10, dtype=torch.float32)
dist.all_reduce(t)
out = torch.empty(10)
dist.all_gather_into_tensor(out, t)
dist.broadcast(t, src=0)
dist.barrier()
ok = bool((t == torch.arange(10)).all() and (out == t).all())
# no CUDA op ran: no device error, and asking for one is a clean no-op
pg = gosym.group()  # the Python group behind torch's
ok = ok and gosym.stats()["gpu_device_error"] == 0
ok = ok and gosym._lib.endpoint_device_error(pg._h) == 0 and pg._device_error() is None
dist.destroy_process_group()
print(json.dumps({"ok": ok}))
"""


def test_world_size_one_without_torchrun():
    p = run_python(WORLD_ONE)
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads(p.stdout.strip().splitlines()[-1])["ok"]


def test_debug_logging_goes_to_stderr():
    quiet = run_python(WORLD_ONE)
    loud = run_python(WORLD_ONE, env={"GOSYM_DEBUG": "1"})
    assert quiet.returncode == 0 and loud.returncode == 0, loud.stderr[-3000:]
    extra = len(loud.stderr) - len(quiet.stderr)
    assert extra > 0 and "gosym" in loud.stderr.lower(), f"GOSYM_DEBUG=1 added no log output:\n{loud.stderr[-2000:]}"
