"""``tensorlist encrypt``, ``decrypt``, ``keygen`` and ``--key-file`` of ``inspect``/``validate``, run for real."""
import json
import os
import stat

import numpy as np
import pytest

import tensorlist as tl
from _cli_crypto_support import run

pytest.importorskip("cryptography")
pytestmark = pytest.mark.slow  # every test runs python -m tensorlist in a child

KEY = tl.Key(bytes(range(32)))


def one_error_line(p, command, *names):
    assert p.returncode != 0
    assert "Traceback" not in p.stderr
    lines = p.stderr.splitlines()
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith(f"tensorlist {command}: error: "), lines[0]
    for name in names:
        assert name in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def ws(tmp_path):
    """A plain list (odd alignment, an empty tensor, a bfloat16 one) and a key file."""
    import ml_dtypes
    d = tmp_path
    tensors = {"w": np.arange(1000, dtype=np.float32).reshape(10, 100), "e": np.zeros(0, np.int8),
               "h": np.ones(5, ml_dtypes.bfloat16), "b": np.arange(7, dtype=np.int16)}
    tl.save(d / "plain.tl", tensors, metadata={"owner": "lab", "step": 3}, alignment=256)
    KEY.save(d / "k.key")
    return d


def offsets(path, key=None):
    with tl.open(path, key=key) as r:
        return [(t.name, t.byte_offset, t.byte_length) for t in r.descriptor.tensors], r.descriptor.metadata


def test_keygen_writes_a_private_key_and_never_replaces_one(tmp_path):
    p = run("keygen", tmp_path / "sub" / "new.key")
    assert p.returncode == 0, p.stderr
    path = tmp_path / "sub" / "new.key"
    assert path.stat().st_size == 32 and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_bytes().hex() not in p.stdout + p.stderr
    before = path.read_bytes()
    one_error_line(run("keygen", path), "keygen", str(path))
    assert path.read_bytes() == before


def test_round_trip_keeps_names_order_metadata_and_offsets(ws):
    p = run("encrypt", ws / "plain.tl", ws / "sealed.tl", "--key-file", ws / "k.key")
    assert p.returncode == 0, p.stderr
    assert bytes(range(32)).hex() not in p.stdout + p.stderr
    with tl.open(ws / "sealed.tl") as r:
        assert r.encrypted and r.descriptor.metadata is None
    assert offsets(ws / "sealed.tl", KEY) == offsets(ws / "plain.tl")
    p = run("decrypt", ws / "sealed.tl", ws / "back.tl", "--key-file", ws / "k.key")
    assert p.returncode == 0, p.stderr
    assert offsets(ws / "back.tl") == offsets(ws / "plain.tl")
    with tl.open(ws / "back.tl") as r:
        assert not r.encrypted and all(t.crc32c is not None for t in r.descriptor.tensors)
    a, b = tl.load(ws / "plain.tl", bits=True), tl.load(ws / "back.tl", bits=True)
    assert list(a) == list(b) and all(np.array_equal(a[k], b[k]) for k in a)
    assert run("validate", "--verify", ws / "back.tl").returncode == 0


def test_a_model_directory_round_trips_with_its_index_copied(ws):
    src = ws / "model"
    (src / "tok").mkdir(parents=True)
    tl.save(src / "model-00001-of-00002.json", {"a": np.arange(10, dtype=np.float32)}, metadata={"format": "pt"})
    tl.save(src / "model-00002-of-00002.json", {"b": np.ones((3, 3))})
    (src / "model.index.json").write_text(json.dumps({"metadata": {"total_size": 112}, "weight_map": {
        "a": "model-00001-of-00002.json", "b": "model-00002-of-00002.json"}}))
    (src / "config.json").write_text("{}")
    (src / "tok" / "t.txt").write_text("hi")
    p = run("encrypt", src, ws / "sealed", "--key-file", ws / "k.key")
    assert p.returncode == 0, p.stderr
    assert (ws / "sealed" / "model.index.json").read_bytes() == (src / "model.index.json").read_bytes()
    assert (ws / "sealed" / "tok" / "t.txt").read_text() == "hi"
    with tl.open(ws / "sealed" / "model-00001-of-00002.json") as r:
        assert r.encrypted
    p = run("validate", "--verify", "--key-file", ws / "k.key", ws / "sealed")
    assert p.returncode == 0, p.stderr
    one_error_line(run("encrypt", src, ws / "sealed", "--key-file", ws / "k.key"), "encrypt", "sealed", "--force")
    p = run("decrypt", ws / "sealed", ws / "back", "--key-file", ws / "k.key")
    assert p.returncode == 0, p.stderr
    assert tl.load(ws / "back" / "model-00001-of-00002.json", mmap=False)["a"].sum() == 45
    assert offsets(ws / "back" / "model-00001-of-00002.json")[1] == {"format": "pt"}


def test_an_existing_destination_is_refused_without_force(ws):
    (ws / "dst.tl").write_text("mine")
    line = one_error_line(run("encrypt", ws / "plain.tl", ws / "dst.tl", "--key-file", ws / "k.key"), "encrypt",
                          str(ws / "dst.tl"), "--force")
    assert "exists" in line and (ws / "dst.tl").read_text() == "mine"
    assert run("encrypt", ws / "plain.tl", ws / "dst.tl", "--key-file", ws / "k.key", "--force").returncode == 0
    assert offsets(ws / "dst.tl", KEY)[1] == {"owner": "lab", "step": 3}
    one_error_line(run("decrypt", ws / "dst.tl", ws / "plain.tl", "--key-file", ws / "k.key"), "decrypt",
                   str(ws / "plain.tl"), "--force")


@pytest.mark.parametrize("size", [0, 31, 33])
def test_a_key_file_of_the_wrong_length_is_one_line_naming_it(ws, size):
    bad = ws / f"bad{size}.key"
    bad.write_bytes(b"k" * size)
    for command in (["encrypt", ws / "plain.tl", ws / "out.tl"], ["validate", "--verify", ws / "plain.tl"],
                    ["inspect", ws / "plain.tl"]):
        line = one_error_line(run(*command, "--key-file", bad), command[0], str(bad))
        assert f"{size}" in line
    assert not (ws / "out.tl").exists()


def test_a_missing_key_file_is_one_line_naming_it(ws):
    line = one_error_line(run("encrypt", ws / "plain.tl", ws / "out.tl", "--key-file", ws / "nokey"), "encrypt",
                          str(ws / "nokey"))
    assert "key file" in line and not (ws / "out.tl").exists()


def test_the_wrong_key_is_one_line_naming_the_file(ws):
    assert run("encrypt", ws / "plain.tl", ws / "sealed.tl", "--key-file", ws / "k.key").returncode == 0
    tl.Key.generate().save(ws / "other.key")
    for command in (["decrypt", ws / "sealed.tl", ws / "out.tl"], ["validate", "--verify", ws / "sealed.tl"]):
        line = one_error_line(run(*command, "--key-file", ws / "other.key"), command[0], str(ws / "sealed.tl"))
        assert "another key" in line
    assert not (ws / "out.tl").exists()
    one_error_line(run("encrypt", ws / "sealed.tl", ws / "twice.tl", "--key-file", ws / "k.key"), "encrypt",
                   "encrypted already")
    one_error_line(run("decrypt", ws / "plain.tl", ws / "out.tl", "--key-file", ws / "k.key"), "decrypt",
                   "not encrypted")


def test_inspect_without_the_key_says_encrypted_and_shows_the_table(ws):
    assert run("encrypt", ws / "plain.tl", ws / "sealed.tl", "--key-file", ws / "k.key").returncode == 0
    p = run("inspect", ws / "sealed.tl")
    assert p.returncode == 0, p.stderr
    assert "encrypted: aes-256-gcm" in p.stdout and "1048576" in p.stdout and "no passphrase kdf" in p.stdout
    assert "--key-file" in p.stdout and '"owner"' not in p.stdout and "bfloat16" in p.stdout
    p = run("inspect", ws / "sealed.tl", "--key-file", ws / "k.key")
    assert p.returncode == 0 and '"owner": "lab"' in p.stdout
    doc = json.loads(run("inspect", "--json", ws / "sealed.tl").stdout)
    assert doc["metadata"] is None and doc["encryption"]["scheme"] == "aes-256-gcm"
    assert doc["encryption"]["kdf"] is None and [t["name"] for t in doc["tensors"]] == ["w", "e", "h", "b"]
    assert json.loads(run("inspect", "--json", ws / "plain.tl").stdout)["encryption"] is None


def test_inspect_says_a_passphrase_kdf_is_recorded(tmp_path):
    key = tl.Key.from_passphrase("correct horse", memory_kib=64, iterations=1, lanes=1)
    tl.save(tmp_path / "p.tl", {"w": np.ones(3, np.float32)}, key=key)
    p = run("inspect", tmp_path / "p.tl")
    assert p.returncode == 0 and "argon2id" in p.stdout and "passphrase" in p.stdout, p.stdout + p.stderr
    assert "correct horse" not in p.stdout


def test_validate_without_the_key_checks_the_structure_and_refuses_to_verify(ws):
    assert run("encrypt", ws / "plain.tl", ws / "sealed.tl", "--key-file", ws / "k.key").returncode == 0
    p = run("validate", ws / "sealed.tl")
    assert p.returncode == 0 and "ok" in p.stdout, p.stderr
    line = one_error_line(run("validate", "--verify", ws / "sealed.tl"), "validate", str(ws / "sealed.tl"))
    assert "encrypted" in line and "--key-file" in line
    p = run("validate", "--verify", "--key-file", ws / "k.key", ws / "sealed.tl")
    assert p.returncode == 0 and "tag" in p.stdout, p.stderr


def test_validate_verify_finds_a_flipped_bit_in_the_data_file(ws):
    assert run("encrypt", ws / "plain.tl", ws / "sealed.tl", "--key-file", ws / "k.key").returncode == 0
    desc = json.loads((ws / "sealed.tl").read_text())
    data = ws / desc["location"]
    raw = bytearray(data.read_bytes())
    raw[desc["byteOffset"] + 100] ^= 0x04  # inside tensor "w"
    data.write_bytes(bytes(raw))
    assert run("validate", ws / "sealed.tl").returncode == 0  # the structure is intact
    line = one_error_line(run("validate", "--verify", "--key-file", ws / "k.key", ws / "sealed.tl"), "validate",
                          str(ws / "sealed.tl"))
    assert "'w'" in line and "authentication" in line
    one_error_line(run("decrypt", ws / "sealed.tl", ws / "out.tl", "--key-file", ws / "k.key"), "decrypt",
                   str(ws / "sealed.tl"))
    assert not (ws / "out.tl").exists() and not [n for n in os.listdir(ws) if n.startswith("out.tl")]
