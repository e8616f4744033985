"""The on-disk formats stages hand each other: one reader and one writer per format, used by every producer
and every reader, on the ground floor so that stages that never import each other share them.

| format | producer | readers |
|---|---|---|
| datagen output: ``manifest.json`` + ``data/`` (``datasets.save_to_disk``: splits ``train``, ``heldout``) | train/datagen.py, train/datagen_vllm.py | train (batches), eval (held-out prompts, the draft vocabulary), scripts |
| ``metrics.json`` (the batch-1 eval) | eval/runner.py | promote, summary, sweep report, registry versions |
| ``serving.json`` (the serving A/B, the serve stage) | eval/serving.py | promote, summary, the monitor's reference, registry versions |
| ``version.json`` (a registry version) | draftsmith/registry.py | the registry, the monitor, ``draftsmith-registry`` |
| a model directory's ``config.json`` ``architectures`` | transformers, decode/eagle.py save_eagle | decode/eagle.py (is it an EAGLE head), serve/server.py (vLLM's speculative method) |

A missing or malformed file is an :class:`ArtifactError` naming the path and the stage to run; the
JSON writers are atomic (:func:`draftsmith.artifacts.write_json`). ``metrics.json`` and ``serving.json``
are read into typed records (:class:`EvalMetrics`, :class:`ServingTable`): the document as written
plus the lookups every reader makes (a draft's summary, the cell at a K, a draft's cells at a
concurrency), so that no reader walks the JSON by hand. The fields of each JSON format are
documented where it is produced (``eval.runner.run``, ``eval.serving``, ``draftsmith.registry``); the
readers check the keys every reader relies on and the schema version.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
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


@dataclass(frozen=True)
class EvalMetrics:
    """A read ``metrics.json``: the document as written (``doc``, which the registry keeps a copy of) and the
    lookups its readers make, so that no reader walks the JSON by hand. Fields: ``eval.runner.run``."""

    path: Path
    doc: dict

    @property
    def summary(self) -> dict[str, dict]:
        """Per draft name: its summary (best K, speedup and interval, acceptance, k_choice, ...)."""
        return self.doc["summary"]

    @property
    def records(self) -> list[dict]:
        """One entry per (draft, K, temperature) cell."""
        return self.doc["records"]

    @property
    def config(self) -> dict:
        return self.doc.get("config") or {}

    @property
    def drafts(self) -> dict[str, str]:
        """Draft name -> the directory the eval measured."""
        return self.config.get("drafts") or {}

    @property
    def target(self) -> str | None:
        return self.config.get("target")

    @property
    def eval_set(self) -> str | None:
        """The eval-set id: equal ids mean the same target, prompts, K grid and decode settings."""
        return self.doc.get("eval_set")

    @property
    def repeats(self) -> dict | None:
        """The passes the eval took and why it stopped."""
        return self.doc.get("repeats")

    @property
    def warnings(self) -> list[str]:
        return self.doc.get("warnings", [])

    @property
    def draft_vocab(self) -> dict | None:
        """The reduced draft vocabulary the figures were measured with (eval.draft_vocab), or None."""
        return self.doc.get("draft_vocab")

    def draft(self, name: str) -> dict:
        """The summary of draft `name`; :class:`ArtifactError` naming the file and the drafts it has otherwise."""
        if name not in self.summary:
            raise ArtifactError(f"{self.path} has no draft {name!r} in its summary (it has {sorted(self.summary)}); "
                                "run the eval stage again")
        return self.summary[name]

    def record(self, draft: str, k: int, temperature: float | None = None) -> dict | None:
        """The cell of `draft` at `k` (and `temperature`; None: the draft's summary temperature), or None."""
        if temperature is None:
            temperature = (self.summary.get(draft) or {}).get("temperature")
        return next((r for r in self.records if r.get("draft") == draft and r.get("k") == k
                     and r.get("temperature") == temperature), None)

    def chosen_record(self, draft: str) -> dict | None:
        """The cell the summary of `draft` was taken from: its best K at its summary temperature."""
        return self.record(draft, self.draft(draft)["best_k"])


def model_architectures(model_dir: str | Path) -> list[str]:
    """The ``architectures`` a model directory's config.json names; [] when there is none or it cannot be read
    (a hub id, a missing or malformed file: whoever loads the model then says what is wrong with it)."""
    try:
        archs = json.loads((Path(str(model_dir)) / "config.json").read_text()).get("architectures") or []
    except (OSError, ValueError, AttributeError):
        return []
    return [str(a) for a in archs] if isinstance(archs, list) else []


def read_metrics(path: str | Path) -> EvalMetrics:
    """An eval's ``metrics.json`` (`path` is the file or its directory)."""
    path = _file(path, "metrics.json")
    doc = read_json(path, what="eval metrics.json", run="run the eval stage", keys=METRICS_KEYS)
    if not isinstance(doc["summary"], dict) or not isinstance(doc["records"], list):
        raise ArtifactError(f"{path}: 'summary' is not an object or 'records' not a list: not an eval metrics.json; "
                            "run the eval stage again")
    return EvalMetrics(path, doc)


def write_metrics(out_dir: str | Path, metrics: dict) -> Path:
    """Write ``metrics.json`` into `out_dir` (atomically); returns its path."""
    return write_json(Path(out_dir) / "metrics.json", metrics)


@dataclass(frozen=True)
class ServingTable:
    """A read ``serving.json``: the document as written (``doc``) and the lookups its readers make.
    Fields: ``eval.serving``."""

    path: Path
    doc: dict

    @property
    def cells(self) -> list[dict]:
        """Every cell: per (draft, K, concurrency or request rate); K None for the plain baseline's own cells."""
        return self.doc["cells"]

    @property
    def scheduled_cells(self) -> list[dict]:
        """The cells of the K schedules' columns, the candidate's and the training-free rival's (empty when they were
        not measured)."""
        return [c for key in ("scheduled", "scheduled_free") for c in (self.doc.get(key) or {}).get("cells") or []]

    @property
    def drafts(self) -> dict[str, str]:
        """Draft name -> the directory the serving A/B served."""
        return self.doc.get("drafts") or {}

    @property
    def settings(self) -> dict:
        """The serve.* settings it ran with."""
        return self.doc.get("settings") or {}

    @property
    def added_passes(self) -> dict | None:
        """The passes added at the decision level to settle a verdict, or None."""
        return self.doc.get("added_passes")

    @property
    def decision_servers(self) -> dict | None:
        """The server lives added to the decision cells (serve.decision_servers), or None."""
        return self.doc.get("decision_servers")

    def basis(self) -> dict:
        """What a cell's figures depend on besides the serve.* settings: vLLM's version and device, the dtype, the
        number of prompts."""
        return {"vllm": self.doc.get("vllm"), "dtype": self.doc.get("dtype"), "prompts": self.doc.get("prompts")}

    def cells_of(self, draft: str) -> list[dict]:
        """The closed-loop cells (a concurrency level) of `draft` with a known K."""
        return [c for c in self.cells
                if c.get("draft") == draft and c.get("concurrency") is not None and c.get("k") is not None]

    def cell(self, draft: str, concurrency: int, k: int) -> dict | None:
        """The closed-loop cell of `draft` at `concurrency` and `k`, or None."""
        return next((c for c in self.cells_of(draft) if c["concurrency"] == concurrency and c["k"] == k), None)


def read_serving(path: str | Path) -> ServingTable:
    """The serving A/B's ``serving.json`` (`path` is the file or its directory)."""
    path = _file(path, "serving.json")
    doc = read_json(path, what="serving A/B output (serving.json)",
                    run="run the serve stage (stages=[serve,promote] serve.engine=vllm)", keys=SERVING_KEYS)
    if not isinstance(doc["cells"], list):
        raise ArtifactError(f"{path}: 'cells' is not a list: not a serving A/B output; run the serve stage again")
    return ServingTable(path, doc)


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
