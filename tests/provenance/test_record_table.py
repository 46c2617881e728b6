"""A record's history as rows: epochs counted from 1, one meaning per column, the same in every view.

``record.history_rows`` is the one place a record's history becomes per-epoch
rows; ``tensorlist record``, the loops' demo and the exports read it. The
class at the end runs the same records through every view that names an
epoch of the history and checks each against the record's JSON, read here
independently (entry ``i`` of a history list is epoch ``i + 1``).
"""
from __future__ import annotations

import copy
import re

import numpy as np
import pytest

from _record_support import full_record
from tensorlist.cli import main
from tensorlist.errors import FormatError
from tensorlist.provenance.exports import cyclonedx_bom, model_card
from tensorlist.provenance.record import (HistoryRow, epoch_number, history_rows, history_table,
                                          read_training_record, save_model_file)

WEIGHTS = {"w": np.arange(4, dtype=np.float32)}


def _record(validation, training_loss=None, learning_rate=None, groups=2):
    """full_record() with the given history (its epochs.done and weights made to fit; no weights hash:
    save_model_file fills it in). Numbers print exactly in the table's 6 significant digits."""
    rec = full_record()
    n = len(validation)
    rec["epochs"] = {"asked": n + 2, "done": n}
    rec["history"] = {
        "training_loss": training_loss if training_loss is not None else [2.0 ** -i for i in range(n)],
        "validation": validation,
        "learning_rate": learning_rate if learning_rate is not None else [[0.001, 0.01]] * n,
    }
    if groups == 1:
        rec["optimizer"]["parameter_groups"] = None
    best = [v for v in validation if v is not None]
    rec["weights"] = {"kind": "final", "epoch": n, "validation": validation[-1], "sha256": None}
    if not best:
        rec["weights"]["validation"] = None
    return rec


#: Histories whose pitfalls differ: the best epoch first (an off-by-one shows), in the middle, last;
#: unvalidated epochs (nulls) before and between values; one parameter group.
CASES = {
    "best-first": _record([0.1, 0.2, 0.3]),
    "best-middle": dict(full_record(), weights=dict(full_record()["weights"], sha256=None)),
    "best-last-with-gaps": _record([None, 0.5, None, 0.25, None, 0.125],
                                   training_loss=[1.0, 0.5, 0.25, None, 0.125, None]),
    "one-group": _record([0.4, 0.3], learning_rate=[0.1, 0.05], groups=1),
}


def _expected(rec):
    """(epoch, training loss, validation, learning rate) per entry, from the JSON: entry i is epoch i + 1."""
    h = rec["history"]
    return [(i + 1, h["training_loss"][i], h["validation"][i], h["learning_rate"][i])
            for i in range(rec["epochs"]["done"])]


def _summary(rec):
    """The epochs, where the lowest validation is and where the last training loss is, from the JSON."""
    h = rec["history"]
    vals = [(i + 1, v) for i, v in enumerate(h["validation"]) if v is not None]
    losses = [(i + 1, v) for i, v in enumerate(h["training_loss"]) if v is not None]
    best = min(vals, key=lambda iv: iv[1])
    return {"epochs": rec["epochs"]["done"], "best": best, "last loss": losses[-1]}


def test_epoch_number_counts_from_one():
    assert [epoch_number(i) for i in range(3)] == [1, 2, 3]


@pytest.mark.parametrize("case", sorted(CASES))
def test_rows_are_the_history_entries_numbered_from_one(case):
    rec = CASES[case]
    rows = history_rows(rec)
    assert all(isinstance(r, HistoryRow) for r in rows)
    assert [tuple(r) for r in rows] == _expected(rec)


def test_table_prints_one_line_per_epoch_with_dashes_for_nulls():
    rec = _record([None, 0.5], training_loss=[2.0, None], learning_rate=[[0.001, None], None])
    assert history_table(rec) == [
        "epoch   training loss    validation  learning rate",
        "    1               2             -  0.001, -",
        "    2               -           0.5  -",
    ]


@pytest.mark.parametrize("break_it, field", [
    (lambda r: r["history"]["validation"].pop(), "history.validation"),
    (lambda r: r["history"].pop("training_loss"), "history.training_loss"),
    (lambda r: r["history"]["learning_rate"].__setitem__(1, "fast"), "history.learning_rate[1]"),
    (lambda r: r["epochs"].__setitem__("done", 7), "history.training_loss"),
])
def test_a_malformed_history_is_a_format_error_naming_file_and_field(break_it, field):
    rec = copy.deepcopy(full_record())
    break_it(rec)
    for view in (history_rows, history_table):
        with pytest.raises(FormatError) as err:
            view(rec, file="final.tl", field_prefix="metadata.training")
        assert err.value.file == "final.tl"
        assert err.value.field == f"metadata.training.{field}"


def test_a_record_that_is_not_a_mapping_is_a_type_error():
    with pytest.raises(TypeError, match="training record is a JSON object"):
        history_rows([1, 2])


# --------------------------------------------------------------------------
# every view of a history names epochs alike


def _number(text):
    return None if text == "-" else float(text)


def _view_rows(rec, path, capsys):
    return [(r.epoch, r.training_loss, r.validation, r.learning_rate)
            for r in history_rows(read_training_record(path))]


def _view_record_command(rec, path, capsys):
    assert main(["record", path]) == 0
    lines = capsys.readouterr().out.splitlines()
    table = lines[lines.index("epoch   training loss    validation  learning rate") + 1:]
    rows = []
    for line in table:
        epoch, loss, val, rate = re.match(r"^\s*(\d+)\s+(\S+)\s+(\S+)\s+(.*)$", line).groups()
        rates = [_number(x) for x in rate.split(", ")]
        rows.append((int(epoch), _number(loss), _number(val), rates if "," in rate else rates[0]))
    return rows


def _view_model_card(rec, path, capsys):
    card = model_card(path)
    done = re.search(r"Epochs recorded: ` (\d+) `", card)
    best = re.search(r"Validation: lowest ` (\S+) ` at epoch ` (\d+) `", card)
    last = re.search(r"Training loss: first ` \S+ `, last ` (\S+) ` at epoch ` (\d+) `", card)
    return {"epochs": int(done.group(1)), "best": (int(best.group(2)), float(best.group(1))),
            "last loss": (int(last.group(2)), float(last.group(1)))}


def _view_cyclonedx(rec, path, capsys):
    (model,) = cyclonedx_bom(path)["components"]
    card = model["modelCard"]
    props = {p["name"]: p["value"] for p in card["properties"]}
    (loss,) = [m for m in card["quantitativeAnalysis"]["performanceMetrics"] if m["type"] == "training loss"]
    return {"epochs": int(props["tensorlist:training:history.epochs"]),
            "best": (int(props["tensorlist:training:history.validation.min_epoch"]),
                     float(props["tensorlist:training:history.validation.min"])),
            "last loss": (int(loss["slice"].removeprefix("epoch ")), float(loss["value"]))}


class TestEveryViewNumbersEpochsAsTheRecord:
    """The same records through every view of a history: the Python rows, ``tensorlist record``, the model
    card and the CycloneDX BOM; each must name the epochs the record's JSON names (entry i: epoch i + 1)."""

    VIEWS = {"history_rows": _view_rows, "tensorlist record": _view_record_command,
             "model card": _view_model_card, "cyclonedx": _view_cyclonedx}

    @pytest.mark.parametrize("view", sorted(VIEWS))
    @pytest.mark.parametrize("case", sorted(CASES))
    def test_view(self, view, case, tmp_path, capsys):
        rec = copy.deepcopy(CASES[case])
        path = str(tmp_path / "final.tl")
        save_model_file(path, WEIGHTS, training=rec, dataset_params={"name": "data"})
        seen = self.VIEWS[view](rec, path, capsys)
        if isinstance(seen, list):  # a table: every row
            assert seen == _expected(rec)
        else:  # a summary: the epochs, where the best validation and the last training loss are
            assert seen == _summary(rec)
