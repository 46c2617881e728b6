"""docs/SECURITY.md "Encrypted files", line by line (the tamper classes are test_tamper.py's).

E1 no plaintext on disk, temporary files included; E5 fresh salts, so two
saves differ and no nonce repeats; E6 the key is never written; E8
signatures cover encrypted files and verify without the key; E9 hostile
``encryption`` objects and key files are one clear error; E10 unencrypted
files are byte-identical to what tensorlist wrote before encryption existed.
"""
from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tensorlist as tl
from tensorlist.crypto import spec

pytest.importorskip("cryptography")

#: A value no ciphertext reproduces by chance: 8 distinctive bytes, repeated.
SENTINEL = np.frombuffer(b"PLAINTXT" * 4096, np.uint8).copy()
META = {"secret": "the-metadata-sentinel-string", "record": {"loss": 0.125}}


def _files(root):
    for d, _, names in os.walk(root):
        for n in names:
            yield os.path.join(d, n)


def _assert_nothing_plain(root, *needles: bytes):
    for path in _files(root):
        with open(path, "rb") as f:
            data = f.read()
        for needle in needles:
            assert needle not in data, f"{needle[:16]!r} found in {path}"


def test_no_plaintext_and_no_key_reach_the_disk(tmp_path):
    key = tl.Key.generate()
    raw = key.material(None)
    path = tmp_path / "m.tl"
    tl.save(path, {"w": SENTINEL, "small": np.frombuffer(b"TINYSECRET", np.uint8)}, metadata=META, key=key)
    with tl.Writer(tmp_path / "w.tl", metadata=META, key=key) as w:
        w.add("w", SENTINEL)
        w.reserve("r", SENTINEL.shape, np.uint8)[:] = SENTINEL
    tl.save_document(tmp_path / "doc.json", {"m": tl.Tensors({"w": SENTINEL}, metadata=META)}, key=key)
    _assert_nothing_plain(tmp_path, b"PLAINTXTPLAINTXT", b"TINYSECRET", b"metadata-sentinel", raw,
                          base64.b64encode(raw), raw.hex().encode())
    assert (tl.load(path, key=key)["w"] == SENTINEL).all()
    assert tl.open(tmp_path / "w.tl", key=key).metadata == META


def test_a_killed_encrypted_save_leaves_no_plaintext(tmp_path):
    """SIGKILL mid-save: whatever temporary files remain hold ciphertext only."""
    script = textwrap.dedent(f"""
        import numpy as np, sys, tensorlist as tl
        key = tl.Key(bytes(32))
        big = np.frombuffer(b"PLAINTXT" * (1 << 22), np.uint8)
        print("ready", flush=True)
        while True:
            tl.save({str(tmp_path / 'big.tl')!r}, {{"w": big}}, metadata={META!r}, key=key)
    """)
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline().strip() == b"ready"
        for _ in range(200):
            if any(".data" in p for p in _files(tmp_path)):
                break
            import time
            time.sleep(0.01)
        import time
        time.sleep(0.05)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert any(True for _ in _files(tmp_path))
    _assert_nothing_plain(tmp_path, b"PLAINTXTPLAINTXT", b"metadata-sentinel")


def test_two_saves_of_the_same_arrays_differ(tmp_path):
    key = tl.Key.generate()
    arrays = {"w": np.zeros(100_000, np.float32)}
    tl.save(tmp_path / "a.tl", arrays, key=key)
    tl.save(tmp_path / "b.tl", arrays, key=key)
    da, db = (json.loads((tmp_path / n).read_text()) for n in ("a.tl", "b.tl"))
    assert da["encryption"]["salt"] != db["encryption"]["salt"]
    bytes_a = (tmp_path / da["location"]).read_bytes()
    bytes_b = (tmp_path / db["location"]).read_bytes()
    assert len(bytes_a) == len(bytes_b) and bytes_a != bytes_b
    # zeros in, and still no two 16-byte blocks alike: no keystream repeats inside a file either
    blocks = {bytes_a[i:i + 16] for i in range(0, 400_000, 16)}
    assert len(blocks) == 400_000 // 16


def test_a_passphrase_opens_what_it_saved_whatever_the_costs(tmp_path):
    cheap = tl.Key.from_passphrase("correct horse", memory_kib=64, iterations=1, lanes=1)
    tl.save(tmp_path / "p.tl", {"w": np.arange(5)}, key=cheap)
    kdf = json.loads((tmp_path / "p.tl").read_text())["encryption"]["kdf"]
    assert (kdf["name"], kdf["memoryKiB"], kdf["iterations"], kdf["lanes"]) == ("argon2id", 64, 1, 1)
    again = tl.Key.from_passphrase("correct horse", memory_kib=128, iterations=1, lanes=1)  # other salt and cost
    assert (tl.load(tmp_path / "p.tl", key=again)["w"] == np.arange(5)).all()
    wrong = tl.Key.from_passphrase("wrong horse", memory_kib=64, iterations=1, lanes=1)
    with pytest.raises(tl.EncryptionError, match="another key"):
        tl.load(tmp_path / "p.tl", key=wrong)


def test_inspecting_needs_no_key(tmp_path):
    tl.save(tmp_path / "m.tl", {"w": np.ones((2, 3), np.float32)}, metadata=META, key=tl.Key.generate())
    with tl.open(tmp_path / "m.tl") as r:
        assert r.encrypted and r.keys() == ["w"] and r.info("w").shape == (2, 3) and r.metadata is None
        with pytest.raises(tl.EncryptionError, match="encrypted: pass key="):
            r["w"]
    assert tl.validate(tmp_path / "m.tl")[0].version == 2


def test_signatures_cover_encrypted_files_and_verify_without_the_key(tmp_path):
    pytest.importorskip("model_signing")
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from tensorlist.provenance.signing import SignatureError, sign, verify
    priv = ec.generate_private_key(ec.SECP256R1())
    (tmp_path / "k.priv").write_bytes(priv.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                         serialization.NoEncryption()))
    (tmp_path / "k.pub").write_bytes(priv.public_key().public_bytes(serialization.Encoding.PEM,
                                                                    serialization.PublicFormat.SubjectPublicKeyInfo))
    model = tmp_path / "model"
    model.mkdir()
    tl.save(model / "m.tl", {"w": SENTINEL}, metadata=META, key=tl.Key.generate())
    sig = str(tmp_path / "m.sig")
    signed = sign(str(model / "m.tl"), private_key=str(tmp_path / "k.priv"), signature=sig)
    assert verify(str(model / "m.tl"), public_key=str(tmp_path / "k.pub"), signature=sig) == signed
    data = next(p for p in model.iterdir() if p.name.endswith(".data"))
    with open(data, "r+b") as f:
        f.seek(100)
        b = f.read(1)
        f.seek(100)
        f.write(bytes([b[0] ^ 1]))
    with pytest.raises(SignatureError):
        verify(str(model / "m.tl"), public_key=str(tmp_path / "k.pub"), signature=sig)


def test_an_unencrypted_save_is_byte_identical_to_a_plain_one(tmp_path):
    """key=None writes what tensorlist always wrote: formatVersion 1, checksums, no encryption object."""
    arrays = {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.zeros(0, np.int8)}
    tl.save(tmp_path / "a.tl", arrays, metadata={"k": 1})
    tl.save(tmp_path / "b.tl", arrays, metadata={"k": 1}, key=None)
    da, db = (json.loads((tmp_path / n).read_text()) for n in ("a.tl", "b.tl"))
    assert da["formatVersion"] == 1 and "encryption" not in da and "crc32c" in da["tensors"][0]
    da.pop("location"), db.pop("location")
    assert da == db
    text = (tmp_path / "a.tl").read_text()
    assert text.startswith('{"formatVersion":1,"tensors":[\n{"name":"w","dims":[3,4],"dataType":6,"byteOffset":0,')


# --- E9: hostile encryption objects, key files -------------------------------------------------------------

def _encrypted(tmp_path):
    tl.save(tmp_path / "m.tl", {"a": np.ones(3000, np.float32), "b": np.zeros(0)}, metadata=META,
            key=tl.Key(bytes(32)))
    return json.loads((tmp_path / "m.tl").read_text())


def _set(path, value):
    def change(d):
        node = d
        for p in path[:-1]:
            node = node[p]
        if value is KeyError:
            del node[path[-1]]
        else:
            node[path[-1]] = value
    return change


HOSTILE = {
    "chunk-zero": (_set(["encryption", "chunkBytes"], 0), "chunkBytes"),
    "chunk-not-power-of-two": (_set(["encryption", "chunkBytes"], 5000), "chunkBytes"),
    "chunk-huge": (_set(["encryption", "chunkBytes"], 1 << 40), "chunkBytes"),
    "chunk-tiny-many-tags": (_set(["encryption", "chunkBytes"], 4096), "tags/byteLength"),
    "chunk-float": (_set(["encryption", "chunkBytes"], 4096.0), "chunkBytes"),
    "scheme-unknown": (_set(["encryption", "scheme"], "rot13"), "scheme"),
    "salt-short": (_set(["encryption", "salt"], base64.b64encode(b"x" * 31).decode()), "salt"),
    "salt-not-base64": (_set(["encryption", "salt"], "!!!!"), "salt"),
    "keycheck-missing": (_set(["encryption", "keyCheck"], KeyError), "keyCheck"),
    "metadata-short": (_set(["encryption", "metadata"], base64.b64encode(b"x" * 8).decode()), "metadata"),
    "tags-longer-than-the-file": (_set(["encryption", "tags", "byteLength"], 1 << 60), "tags/byteLength"),
    "tags-past-the-region": (_set(["encryption", "tags", "byteOffset"], 1 << 40), "tags/byteOffset"),
    "tags-over-a-tensor": (_set(["encryption", "tags", "byteOffset"], 0), "tags/byteOffset"),
    "tags-not-object": (_set(["encryption", "tags"], [0, 32]), "tags"),
    "unknown-field": (_set(["encryption", "iv"], "AAAA"), "encryption"),
    "kdf-memory-absurd": (_set(["encryption", "kdf"], {"name": "argon2id", "salt": base64.b64encode(b"s" * 16).decode(),
                                                       "memoryKiB": 1 << 40, "iterations": 1, "lanes": 1}), "kdf"),
    "kdf-iterations-absurd": (_set(["encryption", "kdf"], {"name": "argon2id", "salt": base64.b64encode(b"s" * 16).decode(),
                                                           "memoryKiB": 64, "iterations": 10 ** 9, "lanes": 1}), "kdf"),
    "kdf-scrypt": (_set(["encryption", "kdf"], {"name": "scrypt"}), "kdf"),
    "version-1": (_set(["formatVersion"], 1), "formatVersion"),
    "plain-metadata": (_set(["metadata"], {"injected": True}), "metadata"),
    "crc-present": (lambda d: d["tensors"][0].__setitem__("crc32c", 0), "crc32c"),
    "encryption-array": (_set(["encryption"], []), "encryption"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
@pytest.mark.parametrize("read", ["load", "validate"])
def test_a_hostile_encryption_object_is_one_clear_error(tmp_path, case, read):
    doc = _encrypted(tmp_path)
    change, field = HOSTILE[case]
    change(doc)
    (tmp_path / "m.tl").write_text(json.dumps(doc))
    with pytest.raises(tl.FormatError) as info:
        if read == "load":
            tl.load(tmp_path / "m.tl", key=tl.Key(bytes(32)))
        else:
            tl.validate(tmp_path / "m.tl")
    e = info.value
    assert str(tmp_path / "m.tl") in str(e) and "\n" not in str(e) and len(str(e)) < 400
    assert e.field is not None and field.split("/")[-1] in e.field, (e.field, str(e))


@pytest.mark.parametrize("size", [0, 31, 33, 4096])
def test_a_key_file_of_the_wrong_length_is_refused_naming_it(tmp_path, size):
    (tmp_path / "k").write_bytes(b"k" * size)
    with pytest.raises(ValueError, match=f"key file .*k.* holds {min(size, 33)}"):
        tl.Key.from_file(tmp_path / "k")


def test_a_missing_or_unreadable_key_file_is_an_oserror(tmp_path):
    with pytest.raises(FileNotFoundError):
        tl.Key.from_file(tmp_path / "absent")
    with pytest.raises(IsADirectoryError):
        tl.Key.from_file(tmp_path)


def test_key_save_refuses_an_existing_file_and_is_private(tmp_path):
    k = tl.Key.generate()
    k.save(tmp_path / "k")
    assert os.stat(tmp_path / "k").st_mode & 0o777 == 0o600
    with pytest.raises(FileExistsError):
        tl.Key.generate().save(tmp_path / "k")
    assert tl.Key.from_file(tmp_path / "k").material(None) == k.material(None)
    assert "Key" in repr(k) and k.material(None).hex() not in repr(k)


def test_keys_are_checked_where_given():
    with pytest.raises(ValueError, match="32 bytes"):
        tl.Key(b"short")
    with pytest.raises(TypeError, match="Key.from_file"):
        tl.save("unused.tl", {}, key="key.bin")
    with pytest.raises(ValueError, match="lamp"):
        tl.save("unused.tl", {}, key=tl.Key.generate(), lamp=True)


# --- the format's round trip ---------------------------------------------------------------------------------

_DTYPES = [np.float32, np.float64, np.int8, np.uint16, np.int64, np.complex64, np.bool_]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(_DTYPES), st.lists(st.integers(0, 5), max_size=3),
                          st.integers(0, 2**32 - 1)), max_size=6),
       st.sampled_from([True, False, "copy"]), st.booleans())
def test_any_list_round_trips_encrypted(tmp_path_factory, specs, mmap, big_endian):
    d = tmp_path_factory.mktemp("rt")
    key = tl.Key(bytes(range(32)))
    arrays = {}
    for i, (dt, shape, seed) in enumerate(specs):
        a = (np.random.default_rng(seed).random(tuple(shape)) * 100).astype(dt)
        arrays[f"t{i}"] = a.astype(a.dtype.newbyteorder(">")) if big_endian and a.dtype.itemsize > 1 else a
    tl.save(d / "m.tl", arrays, metadata={"n": len(arrays)}, key=key)
    got = tl.load(d / "m.tl", key=key, mmap=mmap)
    assert list(got) == list(arrays)
    for k, a in arrays.items():
        assert got[k].dtype == a.dtype.newbyteorder("=") and got[k].shape == a.shape and (got[k] == a).all()
        assert got[k].flags.writeable
    assert tl.open(d / "m.tl", key=key).metadata == {"n": len(arrays)}
    assert tl.validate(d / "m.tl", verify=True, key=key)[0].encryption.tags_length == \
        spec.TAG_BYTES * sum(spec.chunk_count(a.nbytes, spec.DEFAULT_CHUNK) for a in arrays.values())


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 700), st.integers(0, 100)), max_size=6), st.integers(1, 5),
       st.integers(1, 3))
def test_the_windowed_file_writer_writes_what_the_sealer_seals(tmp_path_factory, sizes, per, threads):
    """Sealer.write (windows sealed in parallel, written in order by one thread) gives the very bytes and
    tags that Sealer.seal hands out chunk by chunk: the same file key, nonces and places."""
    from tensorlist.crypto.cipher import Sealer

    chunk, rng = 64, np.random.default_rng(len(sizes))
    sealer = Sealer(tl.Key(bytes(range(32))), chunk_bytes=chunk, threads=threads)
    tensors, off = [], 0
    for i, (n, gap) in enumerate(sizes):
        off += gap
        tensors.append((i, rng.integers(0, 256, n, np.uint8), off))
        off += n
    want = bytearray(off)

    def put(buf, at):
        want[at:at + len(buf)] = buf

    sealer.seal(tensors, put)
    tags = dict(sealer.tags)
    sealer.tags.clear()
    path = tmp_path_factory.mktemp("w") / "data"
    fd = os.open(path, os.O_CREAT | os.O_RDWR)
    try:
        sealer.write(fd, tensors[::-1], str(path), window=per * chunk)  # any order in, file order out
    finally:
        os.close(fd)
    assert path.read_bytes().ljust(off, b"\0") == bytes(want)
    assert sealer.tags == tags and len(tags) == len(sizes)


def test_a_failed_sealed_write_names_the_file(tmp_path):
    from tensorlist.crypto.cipher import Sealer

    path = tmp_path / "data"
    path.write_bytes(b"")
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(OSError, match="writing .*data"):
            Sealer(tl.Key.generate(), chunk_bytes=64).write(fd, [(0, np.ones(1000, np.uint8), 0)], str(path),
                                                            window=128)
    finally:
        os.close(fd)
