#!/usr/bin/env python3
"""Check that libgosym.so, cabi/gosym.h and the cgo-generated header agree.

1. Every gosym_* function declared in gosym.h is exported by the library, and
   every exported gosym_* symbol is declared in gosym.h.
2. The cgo-generated header compiles on its own with the strict flags.
3. The gosym_* declarations of both headers have the same types: proven by the
   compiler when the two headers fit in one translation unit; otherwise (cgo
   cannot spell `const`) by comparing prototypes normalized for const, typedef
   spelling (GoInt32 = int32_t) and parameter names.

Standard library only: it runs before any venv exists.
"""

import argparse
import os
import re
import shlex
import subprocess
import sys

STRICT = ["-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic"]
HERE = os.path.dirname(os.path.abspath(__file__))
C_TESTS = os.path.join(os.path.dirname(HERE), "tests", "c")

# C type names of one ABI meaning (x86-64/aarch64 Linux, LP64), the cgo
# typedefs included.
CANONICAL = {
    "int8_t": "i8", "GoInt8": "i8", "signed char": "i8",
    "uint8_t": "u8", "GoUint8": "u8", "unsigned char": "u8",
    "int16_t": "i16", "GoInt16": "i16", "short": "i16", "short int": "i16",
    "uint16_t": "u16", "GoUint16": "u16", "unsigned short": "u16",
    "unsigned short int": "u16",
    "int32_t": "i32", "GoInt32": "i32", "int": "i32",
    "uint32_t": "u32", "GoUint32": "u32", "unsigned int": "u32",
    "int64_t": "i64", "GoInt64": "i64", "GoInt": "i64", "long": "i64",
    "long int": "i64", "long long": "i64", "long long int": "i64",
    "uint64_t": "u64", "GoUint64": "u64", "GoUint": "u64", "unsigned long": "u64",
    "unsigned long int": "u64", "unsigned long long": "u64", "unsigned long long int": "u64",
    "uintptr_t": "u64", "GoUintptr": "u64", "size_t": "u64",
    "float": "f32", "GoFloat32": "f32", "double": "f64", "GoFloat64": "f64",
    "_Bool": "bool", "GoBool": "bool",
}
KEYWORDS = {"void", "char", "short", "int", "long", "float", "double", "signed",
            "unsigned", "_Bool", "const", "volatile", "restrict", "struct",
            "union", "enum"}
TYPEDEF = re.compile(r"(?<=[;{}])\s*typedef\s+([^;{}()]+?)\s+(\w+)\s*;")
PROTO = re.compile(r"(?:\A|(?<=[;{}]))\s*([^;{}()]*?)\b(gosym_\w+)\s*\(([^()]*)\)\s*;")


def fail(msg):
    print(f"check_abi: FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def preprocess(cc, header, includes):
    cmd = [*cc, "-E", "-P", *(f"-I{d}" for d in includes), header]
    r = run(cmd)
    if r.returncode != 0:
        fail(f"{shlex.join(cmd)} failed:\n{r.stderr}")
    return r.stdout


def normalize_type(tokens):
    """['const', 'char', '*'] -> 'char*'; ['GoInt32'] -> 'i32'."""
    words = [t for t in tokens if t not in ("const", "volatile", "restrict",
                                            "extern", "struct", "union", "enum",
                                            "__declspec", "dllexport")]
    stars = sum(t == "*" for t in words)
    base = " ".join(t for t in words if t != "*")
    return CANONICAL.get(base, base) + "*" * stars


def normalize_param(param):
    tokens = re.findall(r"\w+|\*", param)
    # Drop the parameter name: a trailing identifier after a type.
    if (len(tokens) > 1 and tokens[-1] not in KEYWORDS and tokens[-1] != "*"
            and tokens[-2] not in ("struct", "union", "enum")):
        tokens = tokens[:-1]
    return normalize_type(tokens)


def simple_typedefs(text):
    """{name: definition} of typedefs like `typedef const char gosym_cchar;`."""
    return {name: ty for ty, name in TYPEDEF.findall(text)
            if name not in CANONICAL and name not in ty.split()}


def expand(decl, typedefs):
    """Spells out typedef names in a declaration (typedefs of typedefs too)."""
    for _ in range(8):
        new = re.sub(r"\b\w+\b", lambda m: typedefs.get(m.group(), m.group()), decl)
        if new == decl:
            break
        decl = new
    return decl


def prototypes(text):
    """{name: (return type, (param types...))} of the gosym_* functions."""
    typedefs = simple_typedefs(text)
    out = {}
    for ret, name, params in PROTO.findall(text):
        ret, params = expand(ret, typedefs), expand(params, typedefs)
        ps = [p.strip() for p in params.split(",") if p.strip()]
        if ps == ["void"]:
            ps = []
        out[name] = (normalize_type(re.findall(r"\w+|\*", ret)),
                     tuple(normalize_param(p) for p in ps))
    return out


def exported_symbols(lib):
    r = run(["nm", "-D", "--defined-only", lib])
    if r.returncode != 0:
        fail(f"nm -D {lib} failed:\n{r.stderr}")
    syms = set()
    for line in r.stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in "TW" and parts[2].startswith("gosym_"):
            syms.add(parts[2])
    return syms


def compile_tu(cc, source, includes, work_dir, extra=()):
    obj = os.path.join(work_dir, os.path.basename(source) + ".o")
    cmd = [*cc, *STRICT, *extra, *(f"-I{d}" for d in includes), "-c", source,
           "-o", obj]
    r = run(cmd)
    return cmd, r


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cc", default="cc")
    ap.add_argument("--header", required=True)
    ap.add_argument("--cgo-header", required=True)
    ap.add_argument("--lib", required=True)
    ap.add_argument("--work-dir", required=True)
    args = ap.parse_args()
    cc = shlex.split(args.cc)
    os.makedirs(args.work_dir, exist_ok=True)
    hdr_dir = os.path.dirname(os.path.abspath(args.header))
    cgo_dir = os.path.dirname(os.path.abspath(args.cgo_header))
    if not os.path.exists(args.cgo_header):
        fail(f"{args.cgo_header} is missing: `make lib` writes it beside the library")

    declared = prototypes(preprocess(cc, args.header, [hdr_dir]))
    if not declared:
        fail(f"no gosym_* prototype found in {args.header}")
    exported = exported_symbols(args.lib)
    missing = sorted(set(declared) - exported)
    undeclared = sorted(exported - set(declared))
    if missing:
        fail(f"declared in {args.header} but not exported by {args.lib}: {', '.join(missing)}")
    if undeclared:
        fail(f"exported by {args.lib} but not declared in {args.header}: {', '.join(undeclared)}")
    print(f"check_abi: {len(declared)} gosym_* functions declared and exported")

    # cgo's own prologue is not ours to fix, but it must stay warning-free.
    cmd, r = compile_tu(cc, os.path.join(C_TESTS, "cgo_header.c"),
                        [cgo_dir, hdr_dir], args.work_dir)
    if r.returncode != 0:
        fail(f"the cgo header does not compile cleanly:\n{shlex.join(cmd)}\n{r.stderr}")
    print(f"check_abi: {args.cgo_header} compiles with {' '.join(STRICT)}")

    cmd, r = compile_tu(cc, os.path.join(C_TESTS, "both_headers.c"),
                        [cgo_dir, hdr_dir], args.work_dir)
    if r.returncode == 0:
        print("check_abi: both headers compile in one translation unit")
        return
    first = next((ln for ln in r.stderr.splitlines() if "error" in ln), r.stderr.strip())
    print(f"check_abi: the headers cannot share a translation unit ({first.strip()}); "
          "comparing normalized prototypes instead")

    cgo = prototypes(preprocess(cc, args.cgo_header, [cgo_dir, hdr_dir]))
    mismatches = [
        f"  {name}:\n    gosym.h: {declared[name]}\n    cgo:     {cgo[name]}"
        for name in sorted(set(declared) & set(cgo)) if declared[name] != cgo[name]
    ]
    if mismatches:
        fail("gosym_* declarations differ between the headers:\n" + "\n".join(mismatches))
    print(f"check_abi: {len(set(declared) & set(cgo))} gosym_* prototypes agree "
          "(modulo const and typedef spelling)")


if __name__ == "__main__":
    main()
