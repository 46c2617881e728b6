"""A signed SLSA provenance v1 attestation of the model's training records.

The Statement's subjects are the model's files (name, sha256), as in its
signature. ``predicate.buildDefinition``:

- ``buildType``: :data:`BUILD_TYPE` (docs/PROVENANCE.md describes it);
- ``externalParameters.trainingRecords``: ``{file name: record}``, each model
  file's training record exactly as ``tensorlist.provenance.record.read_training_record``
  returns it;
- ``internalParameters``: the tensorlist version that wrote the attestation;
- ``resolvedDependencies``: the initial weights (their ``weights_sha256`` and
  origin file), each dataset record (its content hash) and the code versions
  of each record's ``environment``, named by the file they belong to.

Verification checks the signature (the model signature's key), the subjects
against the files just hashed, and that the record read from each file equals
the attested one; a file holding a record the attestation does not name fails.
"""
from __future__ import annotations

import json
import os
from typing import Dict, Optional

from tensorlist.errors import FormatError, SignatureError
from tensorlist.provenance.signing import bundle

SLSA_PREDICATE = "https://slsa.dev/provenance/v1"
#: tensorlist's SLSA build type: a training run described by tensorlist training records.
BUILD_TYPE = "https://tensorlist.dev/provenance/training-record/v1"
BUILDER_ID = "https://tensorlist.dev/provenance/builder/v1"


def _record(path: str):
    from tensorlist.provenance.record import read_training_record
    return read_training_record(path)


def records(root: str, names) -> Dict[str, dict]:
    """``{name: record}`` for the files of ``names`` that are model files (hold a training record)."""
    out = {}
    for n in names:
        try:
            out[n] = json.loads(json.dumps(_record(os.path.join(root, *n.split("/")))))
        except FormatError:
            continue  # not a model file: a data file, a config, a record-less document
    return out


def _dependencies(name: str, record: dict, root: str) -> list:
    deps = []
    start = record.get("initial_weights") or {}
    origin = start.get("origin") if isinstance(start, dict) else None
    if record.get("initial_weights_sha256") or origin:
        dep = {"name": f"{name}#initial_weights", "annotations": {"from": start.get("from")}}
        if record.get("initial_weights_sha256"):
            dep["digest"] = {"tensorlist-weights-sha256": record["initial_weights_sha256"]}
        if isinstance(origin, dict):
            dep["uri"] = str(origin.get("file"))
            dep["annotations"]["origin_weights_sha256"] = origin.get("weights_sha256")
        deps.append(dep)
    try:
        from tensorlist.provenance.record import read_dataset_params
        data = read_dataset_params(os.path.join(root, *name.split("/")))
    except FormatError:
        data = None
    if isinstance(data, dict):
        dep = {"name": f"{name}#dataset_params", "annotations": {"dataset_params": data}}
        digest = data.get("content_hash")
        if isinstance(digest, dict) and isinstance(digest.get("sha256"), str):
            dep["digest"] = {str(digest.get("method", "sha256")): digest["sha256"]}
        deps.append(dep)
    env = record.get("environment")
    if isinstance(env, dict):
        for tool in sorted(env):
            if isinstance(env[tool], str):
                deps.append({"name": f"{name}#environment/{tool}", "annotations": {"version": env[tool]}})
    return deps


def attestation_statement(root: str, files: Dict[str, str]) -> dict:
    """The in-toto Statement attesting the training records of the model files among ``files``."""
    from tensorlist import __version__
    found = records(root, sorted(files))
    deps = [d for n in sorted(found) for d in _dependencies(n, found[n], root)]
    return {"_type": bundle.STATEMENT_TYPE,
            "subject": [{"name": n, "digest": {"sha256": files[n]}} for n in sorted(files)],
            "predicateType": SLSA_PREDICATE,
            "predicate": {"buildDefinition": {"buildType": BUILD_TYPE,
                                              "externalParameters": {"trainingRecords": found},
                                              "internalParameters": {"tensorlist": __version__},
                                              "resolvedDependencies": deps},
                          "runDetails": {"builder": {"id": BUILDER_ID}, "metadata": {}}}}


def check_attestation(file: str, root: str, files: Dict[str, str], *, public_key=None,
                      certificate_chain=()) -> Dict[str, dict]:
    """Checks the attestation at ``file`` against the model's hashed ``files``; returns the attested records."""
    statement = bundle.open_verified(file, public_key=public_key, certificate_chain=certificate_chain)
    if statement["predicateType"] != SLSA_PREDICATE:
        raise SignatureError(f"{file}: predicateType is {statement['predicateType']!r}, expected {SLSA_PREDICATE!r}")
    build = statement["predicate"].get("buildDefinition")
    if not isinstance(build, dict) or build.get("buildType") != BUILD_TYPE:
        raise SignatureError(f"{file}: buildDefinition.buildType is not {BUILD_TYPE!r}")
    params = build.get("externalParameters")
    attested = params.get("trainingRecords") if isinstance(params, dict) else None
    if not isinstance(attested, dict):
        raise SignatureError(f"{file}: buildDefinition.externalParameters.trainingRecords is not an object")
    subjects: Dict[str, Optional[str]] = {}
    for s in statement["subject"]:
        name = s.get("name") if isinstance(s, dict) else None
        digest = s.get("digest") if isinstance(s, dict) else None
        if not isinstance(name, str) or not isinstance(digest, dict) or name in subjects:
            raise SignatureError(f"{file}: a subject is malformed or repeated: {str(s)[:80]!r}")
        subjects[name] = digest.get("sha256")
    if subjects != files:
        wrong = sorted(set(subjects) ^ set(files)) or sorted(n for n in files if subjects[n] != files[n])
        raise SignatureError(f"{os.path.join(root, wrong[0])}: the attestation {file} is for other files "
                             "(another model, or files changed since)")
    actual = records(root, sorted(files))
    for name in sorted(set(attested) | set(actual)):
        if name not in actual:
            raise SignatureError(f"{os.path.join(root, name)}: attested as a model file but holds no record")
        if name not in attested:
            raise SignatureError(f"{os.path.join(root, name)}: holds a training record the attestation {file} "
                                 "does not name")
        if actual[name] != attested[name]:
            raise SignatureError(f"{os.path.join(root, name)}: its training record differs from the attested one")
    return attested
