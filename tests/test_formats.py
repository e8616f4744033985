"""The on-disk formats' one reader and writer (draftsmith.artifacts.formats): round trips, and every malformed
or missing output is one ArtifactError naming the file and the stage to run."""

import json

import pytest

from draftsmith.artifacts.formats import (ArtifactError, read_datagen, read_metrics, read_serving, read_version,
                                          write_datagen, write_metrics, write_serving, write_version)


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
    assert read(path) == doc and read(tmp_path) == doc  # the file or its directory
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
