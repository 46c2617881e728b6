#!/usr/bin/env bash
# The C core under AddressSanitizer + UndefinedBehaviorSanitizer, ThreadSanitizer, valgrind and libFuzzer.
#
#   .ci/sanitize.sh            (CI calls it after the main suite; 1-2 minutes on 2 cores, plus installing clang)
#
# 1. A separate ASan/UBSan build of the extension (TENSORLIST_SANITIZE=1) in a scratch copy of the
#    tree; a canary proves the sanitizer is live (an out-of-bounds read through the C API must be
#    caught), then the C-level tests run against that build with libasan preloaded.
#    ThreadSanitizer (after its own canary, a racy program it must catch) over tests/c/test_core.c.
# 2. valgrind memcheck over a small driver of the C API (fuzz/standalone.c) and the seed corpus.
# 3. A short libFuzzer run of fuzz/fuzz_c.c (clang), when clang is installed or installable.
# Needs gcc with libasan/libubsan (gcc's own runtime), valgrind; installs what is missing with apt.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PYTHON=${PYTHON:-python}
FUZZ_RUNS=${FUZZ_RUNS:-1000000}
FUZZ_EXAMPLES=${TENSORLIST_FUZZ_EXAMPLES:-500}

need() {  # need CMD PACKAGE: apt-get install PACKAGE when CMD is missing (CI runs as root)
    command -v "$1" >/dev/null 2>&1 && return 0
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null
    fi
    command -v "$1" >/dev/null 2>&1
}

echo "== 1. ASan + UBSan build of the C core"
LIBASAN=$(gcc -print-file-name=libasan.so)
LIBUBSAN=$(gcc -print-file-name=libubsan.so)
[ -e "$LIBASAN" ] && [ -e "$LIBUBSAN" ] || { echo "libasan/libubsan not found (gcc runtime)"; exit 1; }
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cp -r tensorlist csrc tests schemas docs README.md pyproject.toml setup.py "$WORK/"
find "$WORK" -name '*.so' -delete
find "$WORK" -name __pycache__ -prune -exec rm -rf {} +
(cd "$WORK" && TENSORLIST_SANITIZE=1 TENSORLIST_STRICT_BUILD=1 "$PYTHON" csrc/build_ffi.py >/dev/null)
SO=$(ls "$WORK"/tensorlist/_core*.so)
ldd "$SO" | grep libasan >/dev/null || { echo "the sanitizer build does not link libasan"; exit 1; }
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
asan() { (cd "$WORK" && LD_PRELOAD="$LIBASAN" "$@"); }

asan "$PYTHON" -c "import tensorlist._core as c, sys; assert c.__file__.startswith(sys.argv[1]), c.__file__" "$WORK"
# canary: a read 64 bytes past a bytes object must be reported, or the sanitizer is not running
if asan env PYTHONMALLOC=malloc "$PYTHON" -c "
from tensorlist._core import ffi, lib
b = bytes(range(100)) * 10
lib.tl_crc32c(0, ffi.from_buffer(b), len(b) + 64)" 2>"$WORK/canary.log"; then
    echo "canary: ASan did not catch an out-of-bounds read"; exit 1
fi
grep -q "heap-buffer-overflow" "$WORK/canary.log" || { cat "$WORK/canary.log"; exit 1; }
echo "canary caught: ASan is live"

start=$SECONDS
# PYTHONMALLOC=malloc puts Python objects (the descriptor bytes the C scanner reads) in malloc'd
# blocks with ASan redzones; it slows hypothesis too much for the generated tests, run apart.
(cd "$WORK" && LD_PRELOAD="$LIBASAN" PYTHONMALLOC=malloc "$PYTHON" -m pytest -q -p no:cacheprovider \
    -o addopts="" tests/core/test_lowlevel.py tests/core/test_crc32c.py tests/hostile/test_malformed.py tests/core/test_conformance.py)
(cd "$WORK" && LD_PRELOAD="$LIBASAN" TENSORLIST_FUZZ_EXAMPLES="$FUZZ_EXAMPLES" "$PYTHON" -m pytest -q \
    -p no:cacheprovider -o addopts="" tests/core/test_fastpath.py tests/hostile/test_fuzz.py tests/hostile/test_security.py \
    tests/core/test_roundtrip.py)
echo "sanitized tests: $((SECONDS - start)) s"

echo "== 1b. ThreadSanitizer over the C test driver (threaded reads, writes, CRC helper threads)"
cat > "$WORK/race.c" <<'C'
#include <pthread.h>
static int shared;
static void *bump(void *arg) { (void)arg; shared++; return 0; }
int main(void) { pthread_t t; pthread_create(&t, 0, bump, 0); shared++; pthread_join(t, 0); return 0; }
C
gcc -fsanitize=thread -g -pthread -o "$WORK/race" "$WORK/race.c"
if TSAN_OPTIONS=halt_on_error=1 "$WORK/race" 2>"$WORK/race.log" || ! grep -q "data race" "$WORK/race.log"; then
    echo "canary: ThreadSanitizer did not catch a data race"; cat "$WORK/race.log"; exit 1
fi
gcc -std=c11 -O1 -g -fsanitize=thread -pthread -Icsrc -o "$WORK/test_core_tsan" tests/c/test_core.c csrc/*.c -lm
TMPDIR="$WORK" TSAN_OPTIONS=halt_on_error=1 "$WORK/test_core_tsan" tests/c/corpus.txt tests/conformance/valid/*.tl \
    tests/conformance/valid/*.json tests/conformance/valid/*.lamp tests/conformance/invalid/*.tl | tail -1

echo "== 2. valgrind (memcheck) over the C API driver"
need valgrind valgrind
make -s -C fuzz standalone
(cd fuzz && valgrind --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite \
    --track-origins=yes --quiet ./standalone ../tests/conformance/valid/*.tl ../tests/conformance/valid/*.json \
    ../tests/conformance/invalid/*.tl 2>&1) \
    | tail -3

echo "== 3. libFuzzer on the C descriptor scanner, column extractor and layout check"
if need clang clang; then
    make -s -C fuzz run RUNS="$FUZZ_RUNS" 2>&1 | grep -E "^(Done|stat::|==.*ERROR|SUMMARY)" || true
    [ -z "$(ls fuzz/crash-* fuzz/leak-* fuzz/timeout-* 2>/dev/null)" ] || { echo "libFuzzer found a crash"; exit 1; }
else
    echo "clang unavailable: libFuzzer run skipped"
fi
echo "sanitize.sh: all clean"
