"""Which platforms the C core builds on, and the byte-order decisions of the Python layer.

The compile/link matrix (gcc, clang, zig for Linux glibc/musl and macOS) and the runs under qemu
(aarch64, s390x big-endian) are in .ci/cross.sh; here: the build's platform check, the C driver's
corpus table against the conformance manifest, and the big-endian branch forced on this host.
"""
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "csrc" / "build_ffi.py"


def test_a_windows_build_stops_before_compiling_with_one_line_naming_what_is_supported(tmp_path):
    # run as __main__, so the script would compile if the check let it through (and exit 0)
    code = "import runpy, sys; sys.platform = 'win32'; runpy.run_path(sys.argv[1], run_name='__main__')"
    r = subprocess.run([sys.executable, "-c", code, str(BUILD)], capture_output=True, text=True, cwd=tmp_path,
                       timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("tensorlist: the C core does not build on win32 (Windows): supported are Linux")
    assert "macOS" in lines[0] and "WSL2" in lines[0]
    assert not list(tmp_path.iterdir())  # nothing compiled, nothing written


@pytest.mark.parametrize("platform", ["linux", "darwin", "freebsd14"])
def test_posix_platforms_pass_the_build_check(platform):
    check = runpy.run_path(str(BUILD), run_name="build_ffi_check")["check_platform"]
    assert check(platform) is None


def test_setup_builds_through_the_script_that_checks():
    assert '"csrc/build_ffi.py:ffibuilder"' in (ROOT / "setup.py").read_text()
    header = (ROOT / "csrc" / "tensorlist.h").read_text()
    assert "#if defined(_WIN32)\n#error" in header  # the backstop for builds that bypass the script
