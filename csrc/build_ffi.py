"""cffi build script for the C core (API, out-of-line mode).

setup.py names it in ``cffi_modules``; it produces the extension
``tensorlist._core``. Set TENSORLIST_STRICT_BUILD=1 to compile with warnings
as errors (CI does), TENSORLIST_SANITIZE=1 for an ASan/UBSan build.
"""
import os
import pathlib
import sys

from cffi import FFI

#: Where the C core builds and is tested (.ci/cross.sh): Linux (glibc and musl;
#: x86-64 and aarch64 run, s390x big-endian runs under qemu) and macOS (arm64
#: and x86-64, compiled and linked). Other POSIX systems are untested but may work.
SUPPORTED = "Linux (x86-64, aarch64, s390x; glibc or musl) and macOS (arm64, x86-64)"


def check_platform(platform=None) -> None:
    """Stops a build for a platform the C core cannot support, before any compiling, in one line.

    The core is POSIX (mmap, pread, pthreads); Windows has none of them
    (csrc/tensorlist.h also refuses _WIN32, for builds that bypass this script).
    """
    platform = sys.platform if platform is None else platform
    if platform == "win32":
        raise SystemExit(f"tensorlist: the C core does not build on {platform} (Windows): supported are {SUPPORTED}; "
                         "on Windows, use WSL2")


check_platform()

HERE = pathlib.Path(__file__).resolve().parent

# The C core is every csrc/*.c (fuzz/Makefile and the cross builds glob the same), as
# paths relative to the project root: setuptools runs the build from there and refuses
# absolute source paths in some modes.
SOURCES = sorted(f"csrc/{p.name}" for p in HERE.glob("*.c"))
HEADERS = sorted(f"csrc/{p.name}" for p in HERE.glob("*.h"))

ffibuilder = FFI()
ffibuilder.cdef((HERE / "tensorlist_cdef.h").read_text())

_args = ["-O2", "-std=c11", "-Wall", "-Wextra", "-Wshadow", "-pthread"]
_link = ["-pthread"]
if os.environ.get("TENSORLIST_STRICT_BUILD") == "1":
    _args.append("-Werror")
if os.environ.get("TENSORLIST_SANITIZE") == "1":
    _args += ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-O1"]
    _link += ["-fsanitize=address,undefined"]

ffibuilder.set_source(
    "tensorlist._core",
    '#include "tensorlist.h"',
    sources=SOURCES,
    include_dirs=["csrc"],
    depends=HEADERS,
    extra_compile_args=_args,
    extra_link_args=_link,
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
