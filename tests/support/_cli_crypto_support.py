"""The command line as a reader of encrypted lists, for the tamper test (``test_tamper.subject``).

:func:`cli_read` runs ``tensorlist validate --verify`` and ``tensorlist decrypt``
for real (``python -m tensorlist`` in a child) with the key in a key file, and
turns a non-zero exit status into ``EncryptionError(stderr)`` (a FormatError),
so that the test's assertions on the message hold for the command line's one
error line.
"""
import os
import subprocess
import sys
import tempfile

import tensorlist as tl


def run(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "tensorlist", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=300)


def cli_read(target, key) -> str:
    """Verifies and decrypts ``target.path`` with ``key`` (None: no --key-file; decrypt then is not run)."""
    with tempfile.TemporaryDirectory() as d:
        key_args = []
        if key is not None:
            key.save(os.path.join(d, "k.key"))
            key_args = ["--key-file", os.path.join(d, "k.key")]
        commands = [["validate", "--verify", *key_args, target.path]]
        if key is not None:
            commands.append(["decrypt", target.path, os.path.join(d, "plain.tl"), *key_args])
        for command in commands:
            p = run(*command)
            if p.returncode != 0:
                raise tl.EncryptionError(p.stderr.strip())
        return p.stdout
