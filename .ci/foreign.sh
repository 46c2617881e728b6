#!/usr/bin/env bash
# The Python package itself on other CPUs (docs/DEVELOPMENT.md, "Platforms"):
# s390x (big-endian) and aarch64, each a Debian bookworm root file system made from Debian's packages
# and run through binfmt_misc and qemu-user, as a user there would: Debian's python3 and numpy, the
# package built from this tree with `pip install --no-deps .`, then
#   1. the tests that need neither torch nor a framework, inside (the lists below: -m "not slow", then the
#      slow-marked CLI tests in two processes);
#   2. files crossing hosts: .ci/foreign_files.py writes one fixed set of tensors on this host and on
#      each foreign one, every host reads every other's, and the bytes on disk must equal this host's.
#
#   .ci/foreign.sh                        (CI calls it from .ci/run; 6 to 8 minutes on 2 cores shared with
#                                          other work, the two legs side by side: aarch64 340-445 s (root
#                                          file system 12-22 s, pip 43-59 s, tests 257-334 s, test_cli ~30 s),
#                                          s390x 283-371 s (18-24 s, 35-46 s, 192-263 s, ~38 s))
#   FOREIGN_ARCHES=s390x .ci/foreign.sh   (one architecture)
#
# Cheap root file systems: `mmdebstrap --variant=extract` unpacks the packages and runs no maintainer
# script under emulation (configuring with dpkg under qemu took ~10 minutes per architecture); the few
# links those scripts would make (BLAS/LAPACK alternatives) are made here, and the Python files are
# byte-compiled by this host's Python 3.11 (bookworm's too). Nothing is kept between runs (downloading
# the packages takes seconds). There is no ml_dtypes for s390x (no wheel, not in
# Debian): there bfloat16/float8 must fail with tensorlist's error naming ml_dtypes (the conformance
# corpus and foreign_files.py check it), and the other tests leave them out; aarch64 installs ml_dtypes' wheel. pip reaches the registry for the build's
# requirements (setuptools >= 77, cffi) with this host's certificate authorities copied in.
# Needs root (apt-get, binfmt_misc, chroot); CI runs as root. $PYTHON: this host's interpreter with
# tensorlist installed (CI's venv).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
ARCHES=(${FOREIGN_ARCHES:-s390x aarch64})
SUITE=bookworm
MIRROR=${FOREIGN_MIRROR:-http://deb.debian.org/debian}
HOST=$(uname -m)
start=$SECONDS

# What runs inside (-m "not slow"): the test modules that need neither torch nor a framework adapter and
# say the most about a foreign CPU, chosen to fit the script's time (~9 minutes with the two legs side by
# side on 2 cores): the C bindings and struct mirrors, byte order, every reader and writer, round trips of
# every dtype and layout, CRC32C (every path this CPU has), the conformance corpus, conversions between
# every format (test_convert*: their torch tests skip, the rest need only numpy), the weights hash and the
# training record's readers, hostile and malformed files, atomic saves and cleanup, FP4's packed pairs and the
# carriers of bfloat16/float8 bits, the DCP range reads. SLOW_*: slow-marked
# modules, run whole: test_cli (a child interpreter per test, 30-40 s in two processes once the other leg
# is done; its no-ml_dtypes test is real on s390x). Left out for time (each runs in the main leg):
# test_cli_pipe (~4 minutes under qemu), test_record_schema and test_record_fastcheck (jsonschema-heavy: 5
# and 2 minutes), test_tree, test_dcp_tiling. Tests needing torch, ml_dtypes (none for s390x), moto,
# safetensors or google-crc32c skip there with their reason (-ra).
TESTS=(core/test_lowlevel core/test_platforms core/test_readers core/test_roundtrip core/test_conformance core/test_crc32c core/test_save_fastpath
       cli/test_cli_escape cli/test_convert cli/test_convert_hostile cli/test_convert_seams provenance/test_record_hash provenance/test_record_functions
       hostile/test_hostile hostile/test_hostile_values hostile/test_malformed core/test_fastpath core/test_atomic hostile/test_security core/test_validate_tree
       core/test_cleanup core/test_fp4 core/test_bits dcp/test_dcp_ranges)
TESTS_S390X=("${TESTS[@]}")
TESTS_AARCH64=("${TESTS[@]}")
SLOW_S390X=(cli/test_cli)
SLOW_AARCH64=(cli/test_cli)
# s390x's tests in two processes (pytest-xdist), aarch64's in one: three processes keep the 2 cores busy
declare -A XDIST=([s390x]="-n 2" [aarch64]="")
PACKAGES=python3,python3-dev,python3-pip,python3-numpy,python3-cffi,python3-jsonschema,python3-pytest
PACKAGES+=,python3-hypothesis,python3-pytest-xdist,gcc,libc6-dev,dash,bash,coreutils

declare -A DEB_ARCH=([s390x]=s390x [aarch64]=arm64)
declare -A TRIPLET=([s390x]=s390x-linux-gnu [aarch64]=aarch64-linux-gnu)

need=()
command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
for a in "${ARCHES[@]}"; do command -v "qemu-$a-static" >/dev/null || need+=(qemu-user-static); done
command -v update-binfmts >/dev/null || need+=(binfmt-support)
if [ ${#need[@]} -gt 0 ]; then
    echo "== installing ${need[*]}"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
# binfmt_misc: mounted and the interpreters registered (with the F flag: usable inside a chroot)
[ -e /proc/sys/fs/binfmt_misc/status ] || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
for a in "${ARCHES[@]}"; do
    [ -e "/proc/sys/fs/binfmt_misc/qemu-$a" ] || update-binfmts --enable "qemu-$a"
done

WORK=$(mktemp -d "${TMPDIR:-/tmp}/foreign.XXXXXX")
cleanup() {
    for a in "${ARCHES[@]}"; do
        for m in proc dev/pts; do
            if mountpoint -q "$WORK/$a/$m" 2>/dev/null; then umount "$WORK/$a/$m"; fi
        done
    done
    rm -rf "$WORK"
}
trap cleanup EXIT
mkdir -p "$WORK/files"

inside() {  # inside ARCH CMD...: CMD in ARCH's root file system, with a clean environment
    local a=$1
    shift
    chroot "$WORK/$a" /usr/bin/env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/root LANG=C.UTF-8 \
        PIP_CERT=/etc/ssl/certs/ca-certificates.crt PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_BREAK_SYSTEM_PACKAGES=1 \
        PIP_ROOT_USER_ACTION=ignore ${PIP_INDEX_URL:+PIP_INDEX_URL=$PIP_INDEX_URL} \
        ${https_proxy:+https_proxy=$https_proxy} ${http_proxy:+http_proxy=$http_proxy} "$@"
}

leg() {  # leg ARCH: root file system, install, tests, this host's files; its own log
    local a=$1 root=$WORK/$1 t=$SECONDS
    mmdebstrap --quiet --variant=extract --architectures="${DEB_ARCH[$a]}" --include="$PACKAGES" \
        "$SUITE" "$root" "$MIRROR"
    # what the skipped maintainer scripts would have done that matters here
    local lib=$root/usr/lib/${TRIPLET[$a]}
    ln -sf blas/libblas.so.3 "$lib/libblas.so.3"
    ln -sf lapack/liblapack.so.3 "$lib/liblapack.so.3"
    ln -sf gcc "$root/usr/bin/cc"
    mkdir -p "$root/etc/ssl/certs"
    cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/"
    cp /etc/resolv.conf /etc/hosts "$root/etc/" 2>/dev/null || true
    [ -e /etc/pip.conf ] && cp /etc/pip.conf "$root/etc/"
    if "$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
        "$PYTHON" -m compileall -q -j 0 "$root/usr/lib/python3.11" "$root/usr/lib/python3/dist-packages" \
            >/dev/null 2>&1 || true
    fi
    echo "== $a: root file system $((SECONDS - t))s, $(du -smx "$root" | cut -f1) MB"
    mount -t proc proc "$root/proc"
    mkdir -p "$root/dev/pts"  # a terminal for the CLI's tests: a devpts of its own
    mount -t devpts -o newinstance,ptmxmode=0666 devpts "$root/dev/pts"
    ln -sf pts/ptmx "$root/dev/ptmx"

    # the package from this tree, as `pip install --no-deps .`: the tracked files only
    mkdir "$root/src"
    git ls-files -z | xargs -0 cp --parents -t "$root/src"
    t=$SECONDS
    inside "$a" sh -c 'cd /src && python3 -m pip install -q --no-deps .'
    # fsspec (pure Python; Debian's is older than the floor) for the memory:// tests; ml_dtypes' wheel
    # where there is one (not for s390x), a release that takes Debian's numpy as it is
    inside "$a" sh -c "python3 -m pip install -q 'fsspec>=2023.5' $([ "$a" = s390x ] || echo ml_dtypes) \\
        numpy==\$(python3 -c 'import numpy; print(numpy.__version__)')"
    # the tests import the installed package, not the source tree
    rm -rf "$root/src/tensorlist" "$root/src/build"
    echo "== $a: pip install $((SECONDS - t))s"
    inside "$a" python3 -c 'import sys, tensorlist, numpy; print(sys.byteorder, "endian, numpy", numpy.__version__)'

    t=$SECONDS
    local files=() list="TESTS_${a^^}[@]"
    for m in "${!list}"; do files+=("tests/$m.py"); done
    inside "$a" sh -c "cd /src && python3 -m pytest -q -p no:cacheprovider -m 'not slow' -ra ${XDIST[$a]} ${files[*]}"
    echo "== $a: tests $((SECONDS - t))s"
    files=() list="SLOW_${a^^}[@]"
    for m in "${!list}"; do files+=("tests/$m.py"); done
    if [ ${#files[@]} -gt 0 ]; then
        t=$SECONDS
        inside "$a" sh -c "cd /src && python3 -m pytest -q -p no:cacheprovider -ra -n 2 ${files[*]}"
        echo "== $a: slow tests $((SECONDS - t))s"
    fi

    mkdir "$root/files"
    cp -a "$WORK/files/$HOST" "$root/files/"
    cp .ci/foreign_files.py "$root/"
    inside "$a" python3 /foreign_files.py write "/files/$a"
    inside "$a" python3 /foreign_files.py read "/files/$HOST"
}

echo "== this host ($HOST): the fixed set of files"
"$PYTHON" .ci/foreign_files.py write "$WORK/files/$HOST"

# the legs side by side, one core each; each log shown whole when it ends
pids=()
for a in "${ARCHES[@]}"; do
    leg "$a" >"$WORK/$a.log" 2>&1 &
    pids+=($!)
done
failed=0
for i in "${!ARCHES[@]}"; do
    if wait "${pids[$i]}"; then status=ok; else status=FAILED; failed=1; fi
    echo "----- ${ARCHES[$i]} ($status)"
    cat "$WORK/${ARCHES[$i]}.log"
done
[ $failed = 0 ] || { echo "foreign.sh: FAILED"; exit 1; }

echo "== files crossing hosts, and their bytes"
for a in "${ARCHES[@]}"; do
    cp -a "$WORK/$a/files/$a" "$WORK/files/"
    "$PYTHON" .ci/foreign_files.py read "$WORK/files/$a"
    for b in "${ARCHES[@]}"; do
        if [ "$a" != "$b" ]; then
            cp -a "$WORK/$a/files/$a" "$WORK/$b/files/"
            inside "$b" python3 /foreign_files.py read "/files/$a"
        fi
    done
    # every file both hosts can write is the same bytes (s390x writes no ml_dtypes file)
    if ! diff <(grep -v '^ml_dtypes ' "$WORK/files/$a/digests.txt") \
              <(grep -v '^ml_dtypes ' "$WORK/files/$HOST/digests.txt"); then
        echo "foreign.sh: FAILED: files written on $a differ from this host's"
        exit 1
    fi
    if [ "$a" != s390x ] && ! diff "$WORK/files/$a/digests.txt" "$WORK/files/$HOST/digests.txt"; then
        echo "foreign.sh: FAILED: files written on $a differ from this host's"
        exit 1
    fi
    echo "== $a: every file's bytes equal this host's"
done
echo "foreign.sh: all passed ($((SECONDS - start))s)"
