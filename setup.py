"""Builds libgosym.so with the Go toolchain and ships it inside the gosym package.

The library is loaded with ctypes, not imported as a CPython extension, so it
carries no Python ABI: one py3-none-<platform> wheel serves every Python 3.
The metadata lives in pyproject.toml; this file only adds the Go build.
"""

import os
import shlex
import shutil
import subprocess
from glob import glob

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CompileError

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70.1
    try:
        from wheel.bdist_wheel import bdist_wheel
    except ImportError:
        bdist_wheel = None

ROOT = os.path.dirname(os.path.abspath(__file__))
GO_SOURCE_DIRS = ("cabi", "gobackend", "kernels")
GO_SOURCE_EXTS = ("*.go", "*.c", "*.h", "*.cu", "*.cuh")


class GoExtension(Extension):
    """A c-shared library built by `go build` from the main package in ./cabi."""

    def __init__(self, name):
        # Listing the sources puts them in the sdist and documents the inputs.
        sources = sorted(
            path
            for d in GO_SOURCE_DIRS
            for ext in GO_SOURCE_EXTS
            for path in glob(os.path.join(d, "**", ext), recursive=True, root_dir=ROOT)
        )
        super().__init__(name, sources=sources)


class build_go(build_ext):
    def get_ext_filename(self, fullname):
        # libgosym.so, not libgosym.cpython-311-x86_64-linux-gnu.so.
        if isinstance(self.ext_map.get(fullname), GoExtension):
            return os.path.join(*fullname.split(".")) + ".so"
        return super().get_ext_filename(fullname)

    def build_extension(self, ext):
        if not isinstance(ext, GoExtension):
            return super().build_extension(ext)
        go = shutil.which(os.environ.get("GO", "go"))
        if go is None:
            raise CompileError(
                "gosym: building libgosym.so needs the Go toolchain (Go 1.26 or "
                "newer) and a C compiler for cgo; install Go from https://go.dev/dl/ "
                "and put `go` on PATH (or set GO=/path/to/go)"
            )
        out = os.path.abspath(self.get_ext_fullpath(ext.name))
        os.makedirs(os.path.dirname(out), exist_ok=True)
        cmd = [
            go, "build", "-trimpath", "-buildvcs=false", "-buildmode=c-shared",
            *shlex.split(os.environ.get("GOSYM_GO_FLAGS", "")),
            "-o", out, "./cabi",
        ]
        env = dict(os.environ, CGO_ENABLED="1")
        # The kernels compiled ahead of time (NVRTC: $GOSYM_NVRTC, else what kernelgen
        # finds), embedded by the build; without NVRTC it says so and the library compiles
        # them at run time.
        gen = [go, "run", "-trimpath", "-buildvcs=false", "./gobackend/cmd/kernelgen", "-out",
               os.path.join("kernels", "prebuilt")]
        print("gosym:", shlex.join(gen), flush=True)
        try:
            subprocess.run(gen, cwd=ROOT, env=env, check=True)
        except subprocess.CalledProcessError as e:
            raise CompileError(f"gosym: kernelgen failed with exit status {e.returncode}") from e
        print("gosym:", shlex.join(cmd), flush=True)
        try:
            subprocess.run(cmd, cwd=ROOT, env=env, check=True)
        except subprocess.CalledProcessError as e:
            raise CompileError(f"gosym: `go build` failed with exit status {e.returncode}") from e
        # cgo writes libgosym.h beside the library. In a wheel it would be stray
        # package data, so park it in build_temp; an in-place build keeps it
        # where `make lib` puts it (the C smoke test reads it there).
        header = out[: -len(".so")] + ".h"
        if os.path.exists(header) and not self.inplace:
            os.makedirs(self.build_temp, exist_ok=True)
            os.replace(header, os.path.join(self.build_temp, os.path.basename(header)))
        # The C ABI's header, for `python -m gosym.build_c10d` after pip install: the C++
        # backend (python/gosym/_c10d.cpp, package data) is built against the user's torch,
        # whose C++ ABI a wheel cannot match in advance.
        if not self.inplace:
            include = os.path.join(os.path.dirname(out), "include")
            os.makedirs(include, exist_ok=True)
            shutil.copyfile(os.path.join(ROOT, "cabi", "gosym.h"), os.path.join(include, "gosym.h"))


cmdclass = {"build_ext": build_go}

if bdist_wheel is not None:

    class bdist_wheel_py3(bdist_wheel):
        """Tags the wheel py3-none-<platform>: platform-specific, Python-agnostic."""

        def finalize_options(self):
            super().finalize_options()
            self.root_is_pure = False

        def get_tag(self):
            _, _, plat = super().get_tag()
            return "py3", "none", plat

    cmdclass["bdist_wheel"] = bdist_wheel_py3


setup(ext_modules=[GoExtension("gosym.libgosym")], cmdclass=cmdclass)
