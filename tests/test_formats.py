"""The on-disk formats' one reader and writer (draftsmith.artifacts.formats): round trips, and every malformed
or missing output is one ArtifactError naming the file and the stage to run."""

import json

import pytest

from draftsmith.artifacts.formats import (ArtifactError, EvalMetrics, ServingTable, read_datagen, read_metrics,
                                          read_serving, read_version, write_datagen, write_metrics, write_serving,
                                          write_version)


def dataset(splits=("train", "heldout"), columns=("prompt_ids", "completion_ids", "finished")):
    import datasets

    row = {"prompt_ids": [1, 2], "completion_ids": [3, 4], "finished": True}
    return datasets.DatasetDict({s: datasets.Dataset.from_list([{c: row[c] for c in columns}]) for s in splits})


def test_datagen_round_trip_and_the_errors_name_the_directory(tmp_path):
    write_datagen(tmp_path / "ok", dataset(), {"schema_version": 1, "counts": {}})
    data, manifest = read_datagen(tmp_path / "ok")
    assert data["heldout"][0]["completion_ids"] == [3, 4] and manifest["schema_version"] == 1
    with pytest.raises(ArtifactError, match=r"nothing is not a datagen output \(no manifest.json\); run the datagen"):
        read_datagen(tmp_path / "nothing")
    write_datagen(tmp_path / "one", dataset(splits=("train",)), {})
    with pytest.raises(ArtifactError, match=r"one has no \['heldout'\] split"):
        read_datagen(tmp_path / "one")
    assert read_datagen(tmp_path / "one", splits=("train",))[0]["train"].num_rows == 1
    write_datagen(tmp_path / "cols", dataset(columns=("prompt_ids",)), {})
    with pytest.raises(ArtifactError, match=r"lacks the columns \['completion_ids', 'finished'\]"):
        read_datagen(tmp_path / "cols")
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "manifest.json").write_text("{}")
    with pytest.raises(ArtifactError, match="incomplete datagen output"):
        read_datagen(tmp_path / "half")


@pytest.mark.parametrize("write, read, doc, missing", [
    (write_metrics, read_metrics, {"schema_version": 1, "records": [], "summary": {}}, "summary"),
    (write_serving, read_serving, {"schema_version": 1, "cells": [], "boundary": {}}, "cells"),
    (write_version, read_version, {"version": 3, "fingerprint": "abc"}, "fingerprint"),
])
def test_json_formats_round_trip_and_refuse_what_is_not_theirs(tmp_path, write, read, doc, missing):
    path = write(tmp_path, doc)
    for got in (read(path), read(tmp_path)):  # the file or its directory
        assert getattr(got, "doc", got) == doc  # metrics and serving come as typed records over the document
    path.write_text(json.dumps({k: v for k, v in doc.items() if k != missing}))
    with pytest.raises(ArtifactError, match=f"lacks \\['{missing}'\\]"):
        read(path)
    path.write_text("{not json")
    with pytest.raises(ArtifactError, match=f"{path.name} is not valid JSON"):
        read(path)
    path.write_text("[1, 2]")
    with pytest.raises(ArtifactError, match="holds a JSON list"):
        read(path)
    path.unlink()
    with pytest.raises(ArtifactError, match="does not exist"):
        read(tmp_path)


def test_serving_cells_must_be_a_list(tmp_path):
    path = write_serving(tmp_path, {"cells": {"not": "a list"}})
    with pytest.raises(ArtifactError, match="'cells' is not a list"):
        read_serving(path)


def test_metrics_lookups_find_a_drafts_cells(tmp_path):
    doc = {"schema_version": 1, "eval_set": "abc", "config": {"target": "/t", "drafts": {"trained": "/d"}},
           "summary": {"trained": {"best_k": 2, "temperature": 0.0}},
           "records": [{"draft": "trained", "k": 1, "temperature": 0.0, "speedup": 1.1},
                       {"draft": "trained", "k": 2, "temperature": 0.0, "speedup": 1.3},
                       {"draft": "trained", "k": 2, "temperature": 0.8, "speedup": 1.2}]}
    metrics = read_metrics(write_metrics(tmp_path, doc))
    assert isinstance(metrics, EvalMetrics) and metrics.path == tmp_path / "metrics.json"
    assert (metrics.eval_set, metrics.target, metrics.drafts) == ("abc", "/t", {"trained": "/d"})
    assert metrics.chosen_record("trained")["speedup"] == 1.3  # its best K at its summary temperature
    assert metrics.record("trained", 2, 0.8)["speedup"] == 1.2
    assert metrics.record("trained", 3) is None and metrics.record("base", 1) is None
    with pytest.raises(ArtifactError, match=r"metrics.json has no draft 'base' in its summary \(it has \['trained'\]\)"):
        metrics.draft("base")
    (tmp_path / "metrics.json").write_text(json.dumps({**doc, "records": {}}))
    with pytest.raises(ArtifactError, match="'records' not a list"):
        read_metrics(tmp_path)


def test_serving_lookups_keep_closed_loop_cells_of_a_draft(tmp_path):
    cells = [{"draft": "trained", "k": 2, "concurrency": 1, "speedup": 1.4},
             {"draft": "trained", "k": 2, "concurrency": 8, "speedup": 0.9},
             {"draft": "trained", "k": 2, "concurrency": None, "request_rate": 4.0},  # an open-loop (rate) cell
             {"draft": "trained", "k": None, "concurrency": 1},
             {"draft": "production", "k": 2, "concurrency": 1, "speedup": 1.2}]
    doc = {"cells": cells, "scheduled": {"cells": [{"draft": "trained", "concurrency": 1, "column": "scheduled"}]},
           "settings": {"repeats": 2}, "vllm": {"version": "0.32.0"}, "dtype": "float32", "prompts": 16}
    serving = read_serving(write_serving(tmp_path, doc))
    assert isinstance(serving, ServingTable)
    assert [c["concurrency"] for c in serving.cells_of("trained")] == [1, 8]
    assert serving.cell("trained", 8, 2)["speedup"] == 0.9 and serving.cell("trained", 4, 2) is None
    assert serving.cell("production", 1, 2)["speedup"] == 1.2
    assert len(serving.scheduled_cells) == 1 and serving.settings == {"repeats": 2}
    assert serving.basis() == {"vllm": {"version": "0.32.0"}, "dtype": "float32", "prompts": 16}
