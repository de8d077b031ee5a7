"""Builds gosym._c10d (_c10d.cpp beside this file), the group's C++ backend, against the torch
and Python that run it: _c10d<EXT_SUFFIX> and, beside it, _c10d.torch, the torch version it was
built for (gosym.c10d loads the module only under that torch).

Usage: python -m gosym.build_c10d [--out DIR]    (`make lib` runs it in a checkout; after
`pip install gosym`, run it once, and again after changing torch: the wheel carries the
source and the engine's header, not a module tied to one torch's C++ ABI)
Needs a C++17 compiler (CXX, default g++), torch's headers (every torch wheel has them) and
the CUDA runtime library torch's CUDA wheels bring (no CUDA headers: CUDA is reached through
c10's device interface). Without them it says so and exits 1; gosym then runs its Python group.
"""

from __future__ import annotations

import argparse
import glob
import os
import pathlib
import shlex
import subprocess
import sys
import sysconfig
import time

HERE = pathlib.Path(__file__).resolve().parent
SRC = HERE / "_c10d.cpp"


def _header_dir() -> pathlib.Path:
    """Where gosym.h is: the checkout's cabi/, else the copy the wheel carries (include/)."""
    cabi = HERE.parent.parent / "cabi"
    return cabi if (cabi / "gosym.h").is_file() else HERE / "include"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(SRC.parent))
    args = ap.parse_args()
    try:
        import torch
        import torch.utils.cpp_extension as ext
    except ImportError as e:
        print(f"build_c10d: torch is not importable ({e}): not built", file=sys.stderr)
        return 1
    site = pathlib.Path(torch.__file__).parent.parent
    cudart = sorted(glob.glob(str(site / "nvidia" / "cu*" / "lib" / "libcudart.so*")))
    cudart += sorted(glob.glob("/usr/local/cuda/lib64/libcudart.so*"))
    if not cudart:
        print("build_c10d: no CUDA runtime library next to torch: not built",
              file=sys.stderr)
        return 1
    out = pathlib.Path(args.out) / ("_c10d" + sysconfig.get_config_var("EXT_SUFFIX"))
    torch_lib = pathlib.Path(torch.__file__).parent / "lib"
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    cmd = [os.environ.get("CXX", "g++"), "-O2", "-std=c++17", "-shared", "-fPIC",
           "-fvisibility=hidden", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
           "-DTORCH_EXTENSION_NAME=_c10d", "-DTORCH_API_INCLUDE_EXTENSION_H",
           "-DUSE_C10D_GLOO", "-DUSE_DISTRIBUTED", "-DUSE_RPC",
           *[f"-I{p}" for p in ext.include_paths()],
           f"-I{sysconfig.get_paths()['include']}", f"-I{_header_dir()}",
           str(SRC), "-o", str(out) + ".tmp",
           f"-L{torch_lib}", "-lc10", "-ltorch_cpu", "-ltorch_python",
           cudart[0], f"-Wl,-rpath,{torch_lib}", f"-Wl,-rpath,{pathlib.Path(cudart[0]).parent}"]
    t0 = time.monotonic()
    r = subprocess.run(cmd)
    if r.returncode:
        print("build_c10d: failed: " + shlex.join(cmd), file=sys.stderr)
        return 1
    os.replace(str(out) + ".tmp", out)
    (out.parent / "_c10d.torch").write_text(torch.__version__ + "\n")
    print(f"build_c10d: {out} for torch {torch.__version__} in {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
