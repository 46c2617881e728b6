"""Signed models: tensorlist.provenance.signing and `tensorlist sign`/`verify`, checked against the stock model_signing.

Every key and certificate is made here (cryptography); nothing reaches the network.
"""
import base64
import datetime
import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("model_signing", reason="tensorlist[sign] (model-signing) is not installed")

from cryptography import x509  # noqa: E402
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import NameOID  # noqa: E402

from tensorlist.provenance import signing
from tensorlist.errors import TensorListError  # noqa: E402
from tensorlist.provenance.record import read_training_record, save_model_file  # noqa: E402
from tensorlist.provenance.signing.bundle import Key, write_bundle  # noqa: E402

from _record_support import full_record  # noqa: E402
from _paths import ROOT

ENV = dict(os.environ, PYTHONPATH=ROOT)


def _pem_key(key, path):
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    pub = path.with_suffix(".pub")
    pub.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                  serialization.PublicFormat.SubjectPublicKeyInfo))
    return str(path), str(pub)


def _cert(subject_key, subject, issuer_key, issuer, *, ca, days=(-1, 30)):
    now = datetime.datetime.now(datetime.timezone.utc)
    b = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
         .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
         .public_key(subject_key.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(now + datetime.timedelta(days=days[0]))
         .not_valid_after(now + datetime.timedelta(days=days[1]))
         .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
         .add_extension(x509.KeyUsage(digital_signature=not ca, content_commitment=False, key_encipherment=False,
                                      data_encipherment=False, key_agreement=False, key_cert_sign=ca,
                                      crl_sign=ca, encipher_only=False, decipher_only=False), critical=True))
    return b.sign(issuer_key, hashes.SHA256())


def _write_cert(cert, path):
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return str(path)


@pytest.fixture
def keys(tmp_path):
    d = tmp_path / "keys"
    d.mkdir()
    priv, pub = _pem_key(ec.generate_private_key(ec.SECP256R1()), d / "k.priv")
    other_priv, other_pub = _pem_key(ec.generate_private_key(ec.SECP256R1()), d / "other.priv")
    return {"priv": priv, "pub": pub, "other_priv": other_priv, "other_pub": other_pub, "dir": d}


def _model_dir(path, seed=0):
    path.mkdir()
    record = full_record()
    record["weights"]["sha256"] = None
    rng = np.random.default_rng(seed)
    save_model_file(str(path / "model.json"), {"w": rng.standard_normal((4, 3)).astype(np.float32),
                                               "b": np.zeros(3, np.float32)},
                    training=record, dataset_params={"name": "toy", "split": "train"})
    (path / "config.json").write_text('{"hidden": 3}')
    (path / "sub").mkdir()
    (path / "sub" / "tokenizer.txt").write_text("a b c")
    return path


@pytest.fixture
def model(tmp_path):
    return _model_dir(tmp_path / "model")


def _tl(*args):
    return subprocess.run([sys.executable, "-m", "tensorlist", *args], capture_output=True, text=True, env=ENV,
                          timeout=120)


def _stock(*args):
    return subprocess.run([sys.executable, "-m", "model_signing", *args], capture_output=True, text=True,
                          timeout=120)


def _data_file(model):
    return next(p for p in model.iterdir() if p.name.endswith(".data"))


def test_tensorlist_signature_verifies_with_stock_and_stock_with_tensorlist(model, keys, tmp_path):
    sig = str(tmp_path / "tl.sig")
    r = _tl("sign", str(model), "--key", keys["priv"], "--signature", sig)
    assert r.returncode == 0 and "signed 4 files" in r.stdout, r.stderr
    r = _stock("verify", "key", str(model), "--signature", sig, "--public_key", keys["pub"])
    assert r.returncode == 0 and "Verification succeeded" in r.stdout, r.stdout + r.stderr
    # the stock signer, its signature inside the model directory (it leaves it out of the signed set)
    inside = str(model / "model.sig")
    r = _stock("sign", "key", str(model), "--signature", inside, "--private_key", keys["priv"])
    assert r.returncode == 0, r.stderr
    r = _tl("verify", str(model), "--public-key", keys["pub"], "--signature", inside)
    assert r.returncode == 0 and "verified 4 files" in r.stdout, r.stderr
    files = signing.verify(model, public_key=keys["pub"], signature=inside)
    assert sorted(files) == sorted(["model.json", _data_file(model).name, "config.json", "sub/tokenizer.txt"])
    # and tensorlist's own, written inside the directory, is left out of the set the same way
    own = str(model / "own.sig")
    signing.sign(model, private_key=keys["priv"], signature=own)
    assert _stock("verify", "key", str(model), "--signature", own, "--public_key", keys["pub"]).returncode == 0
    assert len(signing.verify(model, public_key=keys["pub"], signature=own)) == 5  # model.sig is a file now


def test_single_tensorlist_file_signs_its_descriptor_and_data_file(model, keys, tmp_path):
    sig = str(tmp_path / "file.sig")
    files = signing.sign(model / "model.json", private_key=keys["priv"], signature=sig)
    assert sorted(files) == ["model.json", _data_file(model).name]
    assert signing.verify(model / "model.json", public_key=keys["pub"], signature=sig) == files
    r = _stock("verify", "key", str(model), "--signature", sig, "--public_key", keys["pub"], "--ignore_unsigned_files")
    assert r.returncode == 0, r.stdout + r.stderr
    data = _data_file(model)
    data.write_bytes(b"\x01" + data.read_bytes()[1:])
    with pytest.raises(signing.SignatureError, match=data.name):
        signing.verify(model / "model.json", public_key=keys["pub"], signature=sig)


def _byte(model):
    p = _data_file(model)
    b = bytearray(p.read_bytes())
    b[5] ^= 1
    p.write_bytes(bytes(b))
    return p.name


def _record_char(model):
    p = model / "model.json"
    text = p.read_text()
    assert text.count('"seed":42') == 1
    p.write_text(text.replace('"seed":42', '"seed":43'))
    return "model.json"


def _added(model):
    (model / "sub" / "extra.bin").write_bytes(b"x")
    return "extra.bin"


def _removed(model):
    os.remove(model / "config.json")
    return "config.json"


def _swapped(model):
    a, b = model / "config.json", model / "sub" / "tokenizer.txt"
    ta, tb = a.read_bytes(), b.read_bytes()
    a.write_bytes(tb)
    b.write_bytes(ta)
    return "config.json"


CHANGES = {"tensor byte": _byte, "record character": _record_char, "added file": _added,
           "removed file": _removed, "swapped files": _swapped}


class TestEveryChangeFailsBothTools:
    """A changed tensor byte or record character, an added, removed or swapped file, or a wrong key:
    the stock verifier and tensorlist's API and CLI all refuse, and tensorlist names the file."""

    @pytest.mark.parametrize("change", sorted(CHANGES))
    def test_change(self, model, keys, tmp_path, change):
        sig = str(tmp_path / "m.sig")
        signing.sign(model, private_key=keys["priv"], signature=sig)
        name = CHANGES[change](model)
        with pytest.raises(signing.SignatureError, match=name):
            signing.verify(model, public_key=keys["pub"], signature=sig)
        r = _tl("verify", str(model), "--public-key", keys["pub"], "--signature", sig)
        assert r.returncode == 1 and name in r.stderr and "verified" not in r.stdout
        assert _stock("verify", "key", str(model), "--signature", sig, "--public_key", keys["pub"]).returncode != 0

    def test_wrong_key(self, model, keys, tmp_path):
        sig = str(tmp_path / "m.sig")
        signing.sign(model, private_key=keys["priv"], signature=sig)
        with pytest.raises(signing.SignatureError, match="another key"):
            signing.verify(model, public_key=keys["other_pub"], signature=sig)
        r = _tl("verify", str(model), "--public-key", keys["other_pub"], "--signature", sig)
        assert r.returncode == 1 and "m.sig" in r.stderr and "verified" not in r.stdout
        assert _stock("verify", "key", str(model), "--signature", sig,
                      "--public_key", keys["other_pub"]).returncode != 0


def test_provenance_attests_each_files_record(model, keys, tmp_path):
    sig, prov = str(tmp_path / "m.sig"), str(tmp_path / "m.prov")
    r = _tl("sign", str(model), "--key", keys["priv"], "--signature", sig, "--provenance", prov)
    assert r.returncode == 0, r.stderr
    r = _tl("verify", str(model), "--public-key", keys["pub"], "--signature", sig, "--provenance", prov)
    assert r.returncode == 0 and "attestation" in r.stdout, r.stderr
    bundle = json.loads(open(prov).read())
    statement = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
    assert statement["predicateType"] == "https://slsa.dev/provenance/v1"
    assert {s["name"] for s in statement["subject"]} == set(signing.verify(model, public_key=keys["pub"],
                                                                           signature=sig))
    build = statement["predicate"]["buildDefinition"]
    assert build["buildType"] == signing.BUILD_TYPE
    assert build["externalParameters"]["trainingRecords"] == {
        "model.json": json.loads(json.dumps(read_training_record(str(model / "model.json"))))}
    deps = {d["name"]: d for d in build["resolvedDependencies"]}
    assert deps["model.json#initial_weights"]["digest"] == {"tensorlist-weights-sha256": "a" * 64}
    assert deps["model.json#dataset_params"]["annotations"]["dataset_params"]["name"] == "toy"
    assert deps["model.json#environment/torch"]["annotations"] == {"version": "2.13.0"}
    # another model's attestation (same key, same file names) fails
    other = _model_dir(tmp_path / "other", seed=1)
    osig, oprov = str(tmp_path / "o.sig"), str(tmp_path / "o.prov")
    signing.sign(other, private_key=keys["priv"], signature=osig, provenance=oprov)
    with pytest.raises(signing.SignatureError, match="other files"):
        signing.verify(model, public_key=keys["pub"], signature=sig, provenance=oprov)
    # an attestation whose files are right but whose record is not the file's (signed by the key holder)
    forged = json.loads(json.dumps(statement))
    forged["predicate"]["buildDefinition"]["externalParameters"]["trainingRecords"]["model.json"]["seed"] = 7
    write_bundle(prov, Key(keys["priv"]).sign_statement(forged))
    with pytest.raises(signing.SignatureError, match="model.json: its training record differs"):
        signing.verify(model, public_key=keys["pub"], signature=sig, provenance=prov)


@pytest.fixture
def pki(tmp_path):
    d = tmp_path / "pki"
    d.mkdir()
    ca_key, leaf_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = _cert(ca_key, "Test CA", ca_key, "Test CA", ca=True, days=(-10, 365))
    out = {"leaf_key": _pem_key(leaf_key, d / "leaf.priv")[0], "ca": _write_cert(ca, d / "ca.pem"),
           "leaf": _write_cert(_cert(leaf_key, "signer", ca_key, "Test CA", ca=False), d / "leaf.pem"),
           "expired": _write_cert(_cert(leaf_key, "signer", ca_key, "Test CA", ca=False, days=(-30, -1)),
                                  d / "expired.pem"),
           "self": _write_cert(_cert(leaf_key, "signer", leaf_key, "signer", ca=False), d / "self.pem")}
    return out


def test_certificate_chain_signs_and_verifies_both_ways(model, pki, tmp_path):
    sig = str(tmp_path / "c.sig")
    r = _tl("sign", str(model), "--key", pki["leaf_key"], "--signature", sig, "--certificate-chain", pki["leaf"])
    assert r.returncode == 0, r.stderr
    r = _stock("verify", "certificate", str(model), "--signature", sig, "--certificate_chain", pki["ca"])
    assert r.returncode == 0, r.stdout + r.stderr
    r = _tl("verify", str(model), "--certificate-chain", pki["ca"], "--signature", sig)
    assert r.returncode == 0, r.stderr
    stock_sig = str(tmp_path / "stock.sig")
    r = _stock("sign", "certificate", str(model), "--signature", stock_sig, "--private_key", pki["leaf_key"],
               "--signing_certificate", pki["leaf"], "--certificate_chain", pki["ca"])
    assert r.returncode == 0, r.stderr
    assert len(signing.verify(model, certificate_chain=[pki["ca"]], signature=stock_sig)) == 4


class TestHostileInput:
    """Each hostile input is one clear error and a non-zero exit, through the API and the CLI; never "verified"."""

    def _cases(self, model, keys, pki, tmp_path):
        good = tmp_path / "good.sig"
        signing.sign(model, private_key=keys["priv"], signature=str(good))
        text = good.read_text()
        cases = {}

        def put(name, content, match):
            p = tmp_path / f"{name}.sig"
            p.write_bytes(content if isinstance(content, bytes) else content.encode())
            cases[name] = ({"public_key": keys["pub"]}, str(p), match)

        unreadable = "not a readable signature bundle"
        put("malformed", "{not json", unreadable)
        put("truncated", text[: len(text) // 2], unreadable)
        put("nested", "[" * 100000 + "]" * 100000, unreadable + ".*(nest|deep)")
        put("duplicate-key", text[:-1] + ', "mediaType": "x"}', unreadable + ".*duplicate")
        big = tmp_path / "oversized.sig"
        with open(big, "wb") as f:
            f.truncate(65 << 20)
        cases["oversized"] = ({"public_key": keys["pub"]}, str(big), "above the limit")
        two = json.loads(text)
        two["dsseEnvelope"]["signatures"] *= 2
        put("two-signatures", json.dumps(two), "2 signatures, expected exactly one")
        changed = json.loads(text)
        payload = json.loads(base64.b64decode(changed["dsseEnvelope"]["payload"]))
        payload["predicate"]["resources"][0]["digest"] = "0" * 64
        changed["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(payload).encode()).decode()
        put("payload-changed", json.dumps(changed), "does not verify with this key")
        other = _model_dir(tmp_path / "other", seed=3)
        osig = tmp_path / "other.sig"
        signing.sign(other, private_key=keys["priv"], signature=str(osig))
        cases["another-model"] = ({"public_key": keys["pub"]}, str(osig), "signed but missing|changed since|not covered")
        statement = json.loads(base64.b64decode(json.loads(text)["dsseEnvelope"]["payload"]))
        statement["predicate"]["resources"][0]["name"] = "../secret"
        outside = tmp_path / "outside.sig"
        write_bundle(outside, Key(keys["priv"]).sign_statement(statement))
        cases["manifest-outside"] = ({"public_key": keys["pub"]}, str(outside), "outside the signed directory")
        for which in ("expired", "self"):
            s = tmp_path / f"{which}-cert.sig"
            signing.sign(model, private_key=pki["leaf_key"], signature=str(s), certificate_chain=[pki[which]])
            roots = [pki["ca"]] if which == "expired" else [pki["self"]]
            cases[f"{which}-certificate"] = ({"certificate_chain": roots}, str(s),
                                             "not valid now" if which == "expired" else "self-issued")
        return cases

    def test_every_case_fails_the_api_and_the_cli(self, model, keys, pki, tmp_path):
        cases = self._cases(model, keys, pki, tmp_path)
        for name, (kw, sig, match) in sorted(cases.items()):
            with pytest.raises(TensorListError, match=match) as e:
                signing.verify(model, signature=sig, **kw)
            assert sig in str(e.value) or "model" in str(e.value), (name, e.value)
            flag = ["--public-key", kw["public_key"]] if "public_key" in kw else \
                ["--certificate-chain", *kw["certificate_chain"]]
            r = _tl("verify", str(model), "--signature", sig, *flag)
            assert r.returncode == 1 and "verified" not in r.stdout and "Traceback" not in r.stderr, (name, r)
            assert r.stderr.startswith("tensorlist verify: error:"), (name, r.stderr)

    def test_symlinks_and_special_files_in_the_directory(self, model, keys, tmp_path):
        sig = str(tmp_path / "m.sig")
        signing.sign(model, private_key=keys["priv"], signature=sig)
        outside = tmp_path / "secret.txt"
        outside.write_text("secret")
        os.symlink(outside, model / "sub" / "link.txt")
        for call in (lambda: signing.verify(model, public_key=keys["pub"], signature=sig),
                     lambda: signing.sign(model, private_key=keys["priv"], signature=sig)):
            with pytest.raises(TensorListError, match="link.txt.*symbolic link"):
                call()
        r = _tl("sign", str(model), "--key", keys["priv"], "--signature", sig, "--force")  # sig: the one above
        assert r.returncode == 1 and "symbolic link" in r.stderr
        os.remove(model / "sub" / "link.txt")
        os.mkfifo(model / "fifo")
        with pytest.raises(TensorListError, match="fifo.*not a regular file"):
            signing.verify(model, public_key=keys["pub"], signature=sig)


def test_dcp_layout_checkpoint_directory(model, keys, tmp_path):
    from tensorlist.convert import convert

    ckpt = tmp_path / "ckpt"
    with pytest.warns(UserWarning, match="metadata .* is not written"):  # the record stays in the model file
        convert(str(model / "model.json"), str(ckpt), dst_format="dcp", progress=False)
    names = sorted(str(p.relative_to(ckpt)) for p in ckpt.rglob("*") if p.is_file())
    sig = str(tmp_path / "ckpt.sig")
    r = _tl("sign", str(ckpt), "--key", keys["priv"], "--signature", sig)
    assert r.returncode == 0 and f"signed {len(names)} files" in r.stdout, r.stderr
    assert _stock("verify", "key", str(ckpt), "--signature", sig, "--public_key", keys["pub"]).returncode == 0
    assert sorted(signing.verify(ckpt, public_key=keys["pub"], signature=sig)) == names
    shard = next(p for p in ckpt.rglob("*.data"))
    shard.write_bytes(shard.read_bytes()[:-1])
    with pytest.raises(signing.SignatureError, match=shard.name):
        signing.verify(ckpt, public_key=keys["pub"], signature=sig)


def test_sign_and_verify_default_to_where_the_trainers_put_signatures(model, keys):
    """Without --signature: DIR/model.sig (outside the signed set), FILE.sig beside a file (signing.default_signature)."""
    r = _tl("sign", str(model), "--key", keys["priv"])
    assert r.returncode == 0 and f"signed 4 files -> {model / 'model.sig'}" in r.stdout, r.stderr
    r = _tl("verify", str(model), "--public-key", keys["pub"])
    assert r.returncode == 0 and f"verified 4 files against {model / 'model.sig'}" in r.stdout, r.stderr
    r = _tl("sign", str(model / "model.json"), "--key", keys["priv"])
    assert r.returncode == 0 and f"-> {model / 'model.json.sig'}" in r.stdout, r.stderr
    _byte(model)
    r = _tl("verify", str(model / "model.json"), "--public-key", keys["pub"])
    assert r.returncode == 1 and "changed since it was signed" in r.stderr, r.stdout + r.stderr
