#!/usr/bin/env bash
# The C core on other compilers, systems and CPUs (docs/DEVELOPMENT.md, "Platforms").
#
#   .ci/cross.sh        (CI calls it from .ci/run; about 2 minutes on 2 cores, plus installing)
#
# 1. Compile and link (a shared library, -shared -fPIC) every csrc/*.c with -std=c11 -Wall -Wextra
#    -Wshadow -Werror: gcc 12 and clang (Debian) for Linux x86-64, aarch64 and s390x; zig cc (a
#    current clang with the libc headers of each target) for Linux glibc and musl and macOS arm64 and
#    x86-64. Any output from the compiler or linker, warnings included, fails the check.
# 2. Every C test driver (tests/c/test_*.c) built with the core and run: natively (gcc), aarch64
#    and s390x (big-endian) under qemu-user (static binaries), musl natively (zig, static).
#    test_core gets the conformance corpus: the table tests/c/corpus.txt and every descriptor.
# Needs root for apt-get when something is missing (CI runs as root); ziglang comes from PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
start=$SECONDS

APT_PACKAGES=(gcc clang gcc-aarch64-linux-gnu gcc-s390x-linux-gnu libc6-dev-arm64-cross libc6-dev-s390x-cross
              qemu-user-static)
missing=()
for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "== installing ${missing[*]}"
    [ "$(id -u)" = 0 ] || { echo "cross.sh: need root to apt-get install ${missing[*]}"; exit 1; }
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
if "$PYTHON" -m ziglang version >/dev/null 2>&1; then
    ZIG=("$PYTHON" -m ziglang)
else
    echo "== installing ziglang (PyPI) into a scratch venv"
    "$PYTHON" -m venv "$WORK/zig-venv"
    "$WORK/zig-venv/bin/python" -m pip install -q --disable-pip-version-check ziglang
    ZIG=("$WORK/zig-venv/bin/python" -m ziglang)
fi

SOURCES=(csrc/*.c)
WARN=(-std=c11 -Wall -Wextra -Wshadow -Werror -O2 -pthread -Icsrc)
checks=0

# quiet CMD...: runs CMD; any output (a warning included) or a failure stops the script, showing it
quiet() {
    local out
    if ! out=$("$@" 2>&1) || [ -n "$out" ]; then
        printf '%s\n' "$out"
        echo "cross.sh: FAILED: $*"
        exit 1
    fi
}

echo "== 1. compile and link the C core (${SOURCES[*]}) as a shared library"
link() {  # link LABEL CC... : one shared library, one line
    local label=$1
    shift
    quiet "$@" "${WARN[@]}" -fPIC -shared -o "$WORK/core.so" "${SOURCES[@]}"
    checks=$((checks + 1))
    printf '  %-40s ok\n' "$label"
}
GCC_V=$(gcc -dumpversion)
CLANG_V=$(clang -dumpversion)
ZIG_CLANG_V=$("${ZIG[@]}" cc --version | sed -n 's/.*clang version \([0-9.]*\).*/\1/p' | head -1)
link "gcc $GCC_V x86_64-linux-gnu" gcc
link "gcc $GCC_V aarch64-linux-gnu" aarch64-linux-gnu-gcc
link "gcc $GCC_V s390x-linux-gnu" s390x-linux-gnu-gcc
for t in x86_64-linux-gnu aarch64-linux-gnu s390x-linux-gnu; do
    link "clang $CLANG_V $t" clang --target="$t"
done
ZIG_TARGETS=(x86_64-linux-gnu aarch64-linux-gnu s390x-linux-gnu x86_64-linux-musl aarch64-linux-musl aarch64-macos
             x86_64-macos)
for t in "${ZIG_TARGETS[@]}"; do
    link "zig cc (clang $ZIG_CLANG_V) $t" "${ZIG[@]}" cc -target "$t"
done

echo "== 2. the C test drivers, natively and under qemu-user"
CORPUS=(tests/c/corpus.txt tests/conformance/valid/*.tl tests/conformance/valid/*.json
        tests/conformance/valid/*.lamp tests/conformance/invalid/*.tl)
runs=0
drive() {  # drive LABEL RUNNER COMPILER...: build every tests/c/test_*.c with the core, run it
    local label=$1 runner=$2
    shift 2
    local driver name exe args line
    for driver in tests/c/test_*.c; do
        name=$(basename "$driver" .c)
        exe="$WORK/$name-${label// /_}"
        quiet "$@" "${WARN[@]}" -static -o "$exe" "$driver" "${SOURCES[@]}" -lm
        args=()
        [ "$name" = test_core ] && args=("${CORPUS[@]}")
        if ! line=$(TMPDIR="$WORK" $runner "$exe" "${args[@]}" 2>&1); then
            printf '%s\n' "$line"
            echo "cross.sh: FAILED: $name on $label"
            exit 1
        fi
        runs=$((runs + 1))
        printf '  %-28s %s\n' "$label" "$(printf '%s\n' "$line" | tail -1)"
    done
}
drive "x86_64 (native, gcc)" "" gcc
drive "aarch64 (qemu, gcc)" qemu-aarch64-static aarch64-linux-gnu-gcc
drive "s390x (qemu, gcc)" qemu-s390x-static s390x-linux-gnu-gcc
drive "x86_64 musl (native, zig)" "" "${ZIG[@]}" cc -target x86_64-linux-musl

echo "cross.sh: $checks compile/link checks and $runs driver runs passed in $((SECONDS - start)) s"
