"""A model file's training record in the formats other tools read: a CycloneDX 1.6 ML-BOM and a model card.

Both are made from a model file verified first
(:func:`~tensorlist.provenance.record.verify_model_file`: the file, both records, the
weights hash), so an export never describes weights its record does not match.

- :func:`cyclonedx_bom`: a CycloneDX 1.6 JSON BOM whose one component is the
  ``machine-learning-model``: its files (descriptor, data file) as nested
  ``file`` components with their SHA-256; a ``modelCard`` whose
  ``modelParameters.datasets`` are the data records (training, validation),
  whose ``quantitativeAnalysis`` holds the last training loss and the weights'
  validation value, and whose ``properties`` are the training settings, one
  per field (``tensorlist:training:optimizer.class``...); the origin as the
  component's ``pedigree.ancestors``. The JSON is written by hand (no
  dependency); the tests check it against the official schema.
- :func:`model_card`: Markdown with YAML front matter (``library_name``,
  ``tags``, ``datasets``, ``base_model``) that ``huggingface_hub.ModelCard``
  parses, and prose sections of the training settings and history.

Every string taken from a record is escaped for where it goes: JSON escapes
its controls itself; YAML scalars are double-quoted with every control, format
and non-character code point escaped; Markdown values sit in code spans with
the same characters escaped (``_base.terminal.escape_controls``), so a record
cannot inject markup, front matter or terminal sequences. docs/PROVENANCE_LINEAGE.md
maps every field.

Imports ``record``, ``reader``, ``format``, ``_storage.commit``, ``_destinations``, ``_base.terminal``, ``errors``.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import re
import unicodedata
import uuid
from typing import Any, Dict, List, Optional, Tuple

from tensorlist import __version__
from tensorlist._storage.commit import atomic_file
from tensorlist._storage.destinations import made_directories, refuse_existing
from tensorlist._base.terminal import escape_controls
from tensorlist.format import MAX_INT, Limits, sha256_file
from tensorlist.reader import Reader
from tensorlist.provenance.record import history_rows, read_dataset_params, verify_model_file

__all__ = ["CYCLONEDX_SPEC_VERSION", "PROPERTY_PREFIX", "model_files", "cyclonedx_bom", "model_card", "export"]

CYCLONEDX_SPEC_VERSION = "1.6"
#: Namespace of the BOM's property names (CycloneDX's taxonomy: a tool's own names carry its prefix).
PROPERTY_PREFIX = "tensorlist:"
#: Characters of one value shown in the model card's prose (the BOM and the file keep every value whole).
PROSE_VALUE_CHARS = 200


def model_files(path) -> List[Tuple[str, str]]:
    """``[(name, path)]`` of a model file's files: the descriptor, then its data file.

    Names are relative to the descriptor's directory (the data file is confined there).
    """
    path = os.fsdecode(path)
    with Reader(path) as r:
        data = r.descriptor.data_path
    base = os.path.dirname(os.path.abspath(path))
    return [(os.path.basename(path), path), (os.path.relpath(data, base), data)]


def _file_hashes(path: str) -> List[Tuple[str, str]]:
    """``[(name, sha256)]`` of :func:`model_files`, each hashed whole a block at a time."""
    files = model_files(path)
    limits = (Limits().max_descriptor_bytes, MAX_INT)
    return [(name, sha256_file(p, limit, what="model file", file=p)) for (name, p), limit in zip(files, limits)]


def _text(value: Any) -> str:
    """A record value as one property string: strings as they are, anything else as compact JSON."""
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), allow_nan=False)


def _flatten(value: Any, name: str, out: List[Tuple[str, str]]) -> None:
    """``(dotted name, text)`` for each field of ``value``: objects opened, lists and scalars as text.

    Iterative: a record is nested at most ``_base.jsonio.MAX_DEPTH`` levels (validated), never a recursion.
    """
    stack = [(name, value)]
    while stack:
        where, v = stack.pop()
        if isinstance(v, dict) and v:
            stack.extend((f"{where}.{k}" if where else str(k), x) for k, x in reversed(list(v.items())))
        else:
            out.append((where, _text(v)))


def _history_summary(record) -> Dict[str, Any]:
    """The history in a few fields: epochs, first and last loss (and its epoch), the best validation and its epoch,
    the last rate."""
    rows = history_rows(record)  # epochs numbered as every table of the record numbers them
    losses = [(r.epoch, r.training_loss) for r in rows if r.training_loss is not None]
    vals = [(r.epoch, r.validation) for r in rows if r.validation is not None]
    rates = [(r.epoch, r.learning_rate) for r in rows if r.learning_rate is not None]
    best = min(vals, key=lambda iv: iv[1]) if vals else None
    return {
        "epochs": len(rows),
        "training_loss.first": losses[0][1] if losses else None,
        "training_loss.last": losses[-1][1] if losses else None,
        "training_loss.last_epoch": losses[-1][0] if losses else None,
        "validation.min": best[1] if best else None,
        "validation.min_epoch": best[0] if best else None,
        "validation.last": vals[-1][1] if vals else None,
        "learning_rate.last": rates[-1][1] if rates else None,
    }


def _datasets(record, data: dict) -> List[Tuple[str, dict]]:
    """``[(role, data record)]``: the training data, then the validation data when recorded."""
    out = [("training", data)]
    validation = record["validation"]
    if validation is not None and isinstance(validation.get("dataset_params"), dict):
        out.append(("validation", validation["dataset_params"]))
    return out


def _dataset_name(role: str, data: dict) -> str:
    name = data.get("name")
    return name if isinstance(name, str) and name else f"{role} data"


def _settings(record) -> List[Tuple[str, str]]:
    """The record's training settings, flattened: everything but the history (summarised) and the data records."""
    out: List[Tuple[str, str]] = []
    for key, value in record.items():
        if key == "history":
            continue
        if key == "validation" and isinstance(value, dict):
            value = {k: v for k, v in value.items() if k != "dataset_params"}
        _flatten(value, key, out)
    for key, value in _history_summary(record).items():
        out.append((f"history.{key}", _text(value)))
    return out


def _verified(path) -> tuple:
    """``(path, record, data record, file hashes)`` of a model file, verified once for every export."""
    path = os.fsdecode(path)
    record = verify_model_file(path)
    return path, record, read_dataset_params(path), _file_hashes(path)


def cyclonedx_bom(path) -> dict:
    """A CycloneDX 1.6 BOM (a JSON-ready dict) of the model file ``path``, verified first.

    Raises:
        FormatError: the file is not a valid model file, or its weights do not
            match its record (naming the file and field).
        OSError: a file cannot be read.
    """
    return _bom(_verified(path))


def _bom(facts: tuple) -> dict:
    path, record, data, hashes = facts
    name = os.path.basename(path)
    files = [
        {"type": "file", "bom-ref": f"model-file-{i}", "name": fname,
         "hashes": [{"alg": "SHA-256", "content": digest}]}
        for i, (fname, digest) in enumerate(hashes)
    ]
    datasets = []
    for role, d in _datasets(record, data):
        props = []
        _flatten(d, "", props)
        datasets.append({"type": "dataset", "name": _dataset_name(role, d), "contents": {"properties": [
            {"name": f"{PROPERTY_PREFIX}role", "value": role},
            *({"name": f"{PROPERTY_PREFIX}dataset_params:{k}", "value": v} for k, v in props if k)]}})
    history = _history_summary(record)
    metrics = []
    if history["training_loss.last"] is not None:
        metrics.append({"type": "training loss", "value": _text(history["training_loss.last"]),
                        "slice": f"epoch {history['training_loss.last_epoch']}"})
    weights = record["weights"]
    if weights["validation"] is not None:
        function = (record["validation"] or {}).get("function") or {}
        label = function.get("class") or function.get("callable") if isinstance(function, dict) else None
        metrics.append({"type": "validation" + (f" ({label})" if isinstance(label, str) else ""),
                        "value": _text(weights["validation"]), "slice": f"epoch {weights['epoch']}"})
    model_card_section: Dict[str, Any] = {
        "modelParameters": {"datasets": datasets},
        "properties": [{"name": f"{PROPERTY_PREFIX}training:{k}", "value": v} for k, v in _settings(record)],
    }
    if metrics:
        model_card_section["quantitativeAnalysis"] = {"performanceMetrics": metrics}
    component: Dict[str, Any] = {
        "type": "machine-learning-model",
        "bom-ref": "model",
        "name": name,
        "description": f"tensorlist model file: {weights['kind']} weights after epoch {weights['epoch']}",
        "properties": [
            {"name": f"{PROPERTY_PREFIX}weights_sha256", "value": weights["sha256"] or ""},
            {"name": f"{PROPERTY_PREFIX}training_record_format", "value": record["format"]},
        ],
        "components": files,
        "modelCard": model_card_section,
    }
    origin = record["initial_weights"].get("origin")
    if origin is not None:
        component["pedigree"] = {"ancestors": [{
            "type": "machine-learning-model", "name": origin["file"],
            "properties": [{"name": f"{PROPERTY_PREFIX}weights_sha256", "value": origin["weights_sha256"]}],
        }]}
    now = _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")
    return {
        "$schema": "http://cyclonedx.org/schema/bom-1.6.schema.json",
        "bomFormat": "CycloneDX",
        "specVersion": CYCLONEDX_SPEC_VERSION,
        "serialNumber": uuid.uuid4().urn,
        "version": 1,
        "metadata": {"timestamp": now,
                     "tools": {"components": [{"type": "library", "name": "tensorlist", "version": __version__}]}},
        "components": [component],
    }


# ---------------------------------------------------------------------------
# the model card

#: Code points a YAML reader refuses raw (PyYAML's NON_PRINTABLE) or that reorder or hide text.
_YAML_UNSAFE = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"})


def _yaml_str(text: str) -> str:
    """``text`` as a double-quoted YAML scalar with every control, format or unassigned code point escaped."""
    out = ['"']
    for c in text:
        if c == '"' or c == "\\":
            out.append("\\" + c)
        elif unicodedata.category(c) in _YAML_UNSAFE or c == "\x85":
            n = ord(c)
            out.append(f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}")
        else:
            out.append(c)
    out.append('"')
    return "".join(out)


def _code(value: Any) -> str:
    """A value in a Markdown code span: controls escaped, cut to :data:`PROSE_VALUE_CHARS`, never closed early."""
    text = escape_controls(_text(value)).replace("\n", "\\n").replace("\t", "\\t")
    if len(text) > PROSE_VALUE_CHARS:
        text = text[:PROSE_VALUE_CHARS] + "... (cut; the file's record holds it whole)"
    fence = "`" * (max((len(m) for m in re.findall(r"`+", text)), default=0) + 1)
    return f"{fence} {text} {fence}"


def _spec_text(spec) -> Optional[str]:
    if not isinstance(spec, dict):
        return None
    name = spec.get("class") or spec.get("callable")
    return name if isinstance(name, str) else None


def _training_lines(record) -> List[str]:
    opt = record["optimizer"]
    lines = [f"- Weights: {_code(record['weights']['kind'])} after epoch {_code(record['weights']['epoch'])}, "
             f"weights_sha256 {_code(record['weights']['sha256'])}"]
    lines.append(f"- Optimizer: {_code(opt['class'])}, hyperparameters {_code(opt['hyperparameters'])}")
    if opt["parameter_groups"] is not None:
        lines.append(f"- Parameter groups: {_code(opt['parameter_groups'])}")
    if opt["scheduler"] is not None:
        lines.append(f"- Schedule: {_code(_spec_text(opt['scheduler']))} with {_code(opt['scheduler'].get('args'))}, "
                     f"stepped each {_code(opt['scheduler_step'])}")
    else:
        lines.append("- Schedule: none (constant learning rate, unless the loop set it)")
    epochs = record["epochs"]
    lines.append(f"- Epochs: {_code(epochs['done'])} done of {_code(epochs['asked'])} asked")
    lines.append(f"- Seed: {_code(record['seed'])}")
    if record["train"] is not None:
        lines.append(f"- Batches: {_code(record['train'])}")
    solver = record["solver"]
    lines.append(f"- Training loop: {_code(solver['class'])}, loss {_code(_spec_text(solver['loss']))}, "
                 f"parameters {_code(solver['solver_params'])}")
    initial = record["initial_weights"]
    origin = initial.get("origin")
    text = f"- Initial weights: from {_code(initial['from'])}"
    if initial.get("file") is not None:
        text += f" {_code(initial['file'])}"
    text += f", weights_sha256 {_code(record['initial_weights_sha256'])}"
    if origin is not None:
        text += f"; origin {_code(origin['file'])} (weights_sha256 {_code(origin['weights_sha256'])})"
    lines.append(text)
    lines.append(f"- Environment: {_code(record['environment'])}")
    return lines


def _history_lines(record) -> List[str]:
    h = _history_summary(record)
    lines = [f"- Epochs recorded: {_code(h['epochs'])}",
             f"- Training loss: first {_code(h['training_loss.first'])}, last {_code(h['training_loss.last'])}"
             + ("" if h["training_loss.last_epoch"] is None else f" at epoch {_code(h['training_loss.last_epoch'])}")]
    if h["validation.min"] is not None:
        lines.append(f"- Validation: lowest {_code(h['validation.min'])} at epoch {_code(h['validation.min_epoch'])}, "
                     f"last {_code(h['validation.last'])}")
    else:
        lines.append("- Validation: none recorded")
    lines.append(f"- Learning rate at the last epoch: {_code(h['learning_rate.last'])}")
    return lines


def model_card(path) -> str:
    """A Hugging Face model card (Markdown with YAML front matter) of the model file ``path``, verified first.

    Raises:
        FormatError: the file is not a valid model file (naming file and field).
        OSError: a file cannot be read.
    """
    return _card(_verified(path))


def _card(facts: tuple) -> str:
    path, record, data, hashes = facts
    datasets = [d.get("name") for _, d in _datasets(record, data)]
    datasets = list(dict.fromkeys(n for n in datasets if isinstance(n, str) and n))
    front = ["---", "library_name: tensorlist", 'tags: ["tensorlist", "training-record"]']
    if datasets:
        front.append("datasets: [" + ", ".join(_yaml_str(n) for n in datasets) + "]")
    origin = record["initial_weights"].get("origin")
    if origin is not None:
        front.append(f"base_model: {_yaml_str(origin['file'])}")
    front.append("---")
    name = escape_controls(os.path.basename(path)).replace("\n", "\\n")
    body = [
        "",
        f"# Model card: {_code(name)}",
        "",
        "Made by `tensorlist export` from the training record inside the model file, after checking the file "
        "and that its weights hash to the record's `weights.sha256`. `tensorlist lineage` checks its chain "
        "of origins; `tensorlist record` prints the whole history.",
        "",
        "## Training procedure",
        "",
        *_training_lines(record),
        "",
        "## Training history",
        "",
        *_history_lines(record),
        "",
        "## Training data",
        "",
    ]
    for role, d in _datasets(record, data):
        body.append(f"- {role.capitalize()}: {_code(_dataset_name(role, d))}, record {_code(d)}")
    body += ["", "## Files", ""]
    body += [f"- {_code(fname)}: SHA-256 {_code(digest)}" for fname, digest in hashes]
    return "\n".join(front + body) + "\n"


def export(path, *, cyclonedx=None, model_card_path=None, overwrite: bool = True) -> List[str]:
    """Writes the exports asked for (each atomically); returns the paths written.

    Args:
        path: the model file.
        cyclonedx: where to write the CycloneDX 1.6 JSON BOM, or None.
        model_card_path: where to write the model card (Markdown), or None.
        overwrite: replace an output that exists; False refuses (both outputs checked before
            either is written), as ``tensorlist export`` does without ``--force``.

    A missing directory above an output is made (parents included).

    Raises:
        ValueError: neither output asked for, both to one path, or an output that is a file of the model.
        DestinationExistsError: ``overwrite=False`` and an output exists; nothing is written then.
        FormatError, OSError: as :func:`cyclonedx_bom` and :func:`model_card`; nothing is written then.
    """
    if cyclonedx is None and model_card_path is None:
        raise ValueError("export: ask for at least one output (cyclonedx= or model_card_path=)")
    named = [os.fsdecode(o) for o in (cyclonedx, model_card_path) if o is not None]
    if len({os.path.abspath(o) for o in named}) < len(named):
        raise ValueError(f"{named[0]}: the CycloneDX BOM and the model card would both be written to it")
    protected = [p for _, p in model_files(path)]
    for out in named:
        if any(os.path.exists(out) and os.path.samefile(out, p) for p in protected):
            raise ValueError(f"{out}: a file of the model itself: refused, it would be overwritten (even with "
                             "overwrite=True)")
    facts = _verified(path)  # one verification and one hash of each file, for both outputs
    refuse_existing(named, overwrite=overwrite)  # both checked before either is written
    outputs = []
    if cyclonedx is not None:  # both made before either is written: a failure leaves no half export
        outputs.append((cyclonedx, json.dumps(_bom(facts), indent=2) + "\n"))
    if model_card_path is not None:
        outputs.append((model_card_path, _card(facts)))
    written = []
    with made_directories([out for out, _ in outputs]):
        for out, text in outputs:
            with atomic_file(out) as tmp:
                with open(tmp, "w", encoding="utf-8", errors="strict") as f:
                    f.write(text)
            written.append(os.fsdecode(out))
    return written
