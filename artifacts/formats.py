"""The on-disk formats stages hand each other: one reader and one writer per format, used by every producer
and every reader, on the ground floor so that stages that never import each other share them.

| format | producer | readers |
|---|---|---|
| datagen output: ``manifest.json`` + ``data/`` (``datasets.save_to_disk``: splits ``train``, ``heldout``) | train/datagen.py, train/datagen_vllm.py | train (batches), eval (held-out prompts, the draft vocabulary), scripts |
| ``metrics.json`` (the batch-1 eval) | eval/runner.py | promote, summary, sweep report, registry versions |
| ``serving.json`` (the serving A/B, the serve stage) | eval/serving.py | promote, summary, the monitor's reference, registry versions |
| ``version.json`` (a registry version) | draftsmith/registry.py | the registry, the monitor, ``draftsmith-registry`` |

A missing or malformed file is an :class:`ArtifactError` naming the path and the stage to run; the
JSON writers are atomic (:func:`draftsmith.artifacts.write_json`). The fields of each JSON format are
documented where it is produced (``eval.runner.run``, ``eval.serving``, ``draftsmith.registry``); the
readers check the keys every reader relies on and the schema version.
"""

from __future__ import annotations

import json
from pathlib import Path

from draftsmith.artifacts import write_json
from draftsmith.artifacts.errors import UserError

DATAGEN_MANIFEST = "manifest.json"
DATAGEN_DATA = "data"
DATAGEN_SPLITS = ("train", "heldout")
DATAGEN_COLUMNS = ("prompt_ids", "completion_ids", "finished")  # + topk_ids / topk_logprobs when kept
METRICS_KEYS = ("schema_version", "records", "summary")
SERVING_KEYS = ("cells",)  # what every reader relies on (the boundary is derived from the cells)
VERSION_KEYS = ("version", "fingerprint")


class ArtifactError(UserError, ValueError):
    """A stage output that is missing or malformed; the message names the file and the stage to run."""


def read_json(path: str | Path, *, what: str, run: str, keys: tuple[str, ...] = ()) -> dict:
    """The JSON object at `path` (a `what`, made by `run`), checked for `keys`; :class:`ArtifactError` otherwise."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise ArtifactError(f"{path} does not exist: no {what} there; {run} first") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ArtifactError(f"{path} cannot be read ({exc}); {run} again") from None
    except json.JSONDecodeError as exc:
        raise ArtifactError(f"{path} is not valid JSON ({exc.msg} at line {exc.lineno}): a damaged {what}; "
                            f"{run} again") from None
    if not isinstance(doc, dict):
        raise ArtifactError(f"{path} holds a JSON {type(doc).__name__}, not a {what}; {run} again")
    missing = [key for key in keys if key not in doc]
    if missing:
        raise ArtifactError(f"{path} lacks {missing}: not a {what} (or one of an older schema); {run} again")
    return doc


# -- the datagen output -----------------------------------------------------------------------------
def read_datagen_manifest(out_dir: str | Path) -> dict:
    """The manifest of the datagen output at `out_dir` (its presence marks a finished output)."""
    if not (Path(out_dir) / DATAGEN_MANIFEST).exists():
        raise ArtifactError(f"{out_dir} is not a datagen output (no {DATAGEN_MANIFEST}); run the datagen stage "
                            "(stages=[datagen,...]) first")
    return read_json(Path(out_dir) / DATAGEN_MANIFEST, what="datagen output's manifest",
                     run="run the datagen stage (stages=[datagen,...])")


def read_datagen(out_dir: str | Path, splits: tuple[str, ...] = DATAGEN_SPLITS):
    """(DatasetDict, manifest) of the datagen output at `out_dir`, with `splits` present and the row columns
    every reader relies on; :class:`ArtifactError` naming the directory otherwise."""
    import datasets

    out_dir = Path(out_dir)
    manifest = read_datagen_manifest(out_dir)
    try:
        data = datasets.load_from_disk(str(out_dir / DATAGEN_DATA))
    except FileNotFoundError:
        raise ArtifactError(f"{out_dir / DATAGEN_DATA} is missing beside its manifest: an incomplete datagen "
                            "output; run the datagen stage again (force=true)") from None
    absent = [s for s in splits if s not in data]
    if absent:
        raise ArtifactError(f"{out_dir} has no {absent} split (it has {list(data)}): not a draftsmith datagen "
                            "output; run the datagen stage again")
    for split in splits:
        lacking = [c for c in DATAGEN_COLUMNS if c not in data[split].column_names]
        if lacking:
            raise ArtifactError(f"{out_dir}: the {split} split lacks the columns {lacking}; run the datagen stage again")
    return data, manifest


def write_datagen(out_dir: str | Path, data, manifest: dict) -> None:
    """Write a datagen output into `out_dir` (a temporary directory the caller renames into place): the
    DatasetDict `data` under ``data/``, then the manifest, which marks it finished."""
    out_dir = Path(out_dir)
    data.save_to_disk(str(out_dir / DATAGEN_DATA))
    write_json(out_dir / DATAGEN_MANIFEST, manifest)


# -- metrics.json, serving.json, version.json -------------------------------------------------------
# The writers write a document as it is (the registry keeps a copy of the metrics a version was promoted on);
# the readers check the keys every reader relies on.
def _file(path: str | Path, name: str) -> Path:
    """`path` itself, or `name` inside it when it is a directory."""
    path = Path(path)
    return path / name if path.is_dir() else path


def read_metrics(path: str | Path) -> dict:
    """An eval's ``metrics.json`` (`path` is the file or its directory)."""
    return read_json(_file(path, "metrics.json"), what="eval metrics.json", run="run the eval stage", keys=METRICS_KEYS)


def write_metrics(out_dir: str | Path, metrics: dict) -> Path:
    """Write ``metrics.json`` into `out_dir` (atomically); returns its path."""
    return write_json(Path(out_dir) / "metrics.json", metrics)


def read_serving(path: str | Path) -> dict:
    """The serving A/B's ``serving.json`` (`path` is the file or its directory)."""
    path = _file(path, "serving.json")
    doc = read_json(path, what="serving A/B output (serving.json)",
                    run="run the serve stage (stages=[serve,promote] serve.engine=vllm)", keys=SERVING_KEYS)
    if not isinstance(doc["cells"], list):
        raise ArtifactError(f"{path}: 'cells' is not a list: not a serving A/B output; run the serve stage again")
    return doc


def write_serving(out_dir: str | Path, serving: dict) -> Path:
    """Write ``serving.json`` into `out_dir` (atomically); returns its path."""
    return write_json(Path(out_dir) / "serving.json", serving)


def read_version(path: str | Path) -> dict:
    """A registry version's ``version.json`` (`path` is the file or the version's directory)."""
    return read_json(_file(path, "version.json"), what="registry version record",
                     run="promote the draft again (the registry version is damaged)", keys=VERSION_KEYS)


def write_version(out_dir: str | Path, record: dict) -> Path:
    """Write ``version.json`` into a version's (temporary) directory; returns its path."""
    return write_json(Path(out_dir) / "version.json", record)
