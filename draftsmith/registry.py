"""The model registry drafts are promoted to: local directories by default, mirrored to W&B Registry.

Local layout (``root`` is ``registry.root`` in the config)::

    root/<name>/v<N>/draft/                 the merged draft model with its tokenizer
    root/<name>/v<N>/metrics.json           the eval metrics it was promoted on
    root/<name>/v<N>/promotion.json         the promotion decision (gates, reasons)
    root/<name>/v<N>/speculative_config.json   pass to vLLM: --speculative-config "$(cat ...)"
    root/<name>/v<N>/version.json           version, fingerprint, source, time, best K (and, when promoted on
                                            a serving A/B, "k_by_concurrency": the K per concurrency band),
                                            "k_schedule": the batch-size K schedule given to vLLM, or None
    root/<name>/v<N>/serving.json           the serving A/B's per-concurrency table (when one ran)
    root/<name>/aliases.json                {"production": N, "staging": M}
    root/<name>/.lock                       taken around every change

A version may also record a training-free method (decode/ngram.py's prompt lookup, ``ngram:MIN-MAX``) instead of a
draft: "no draft needed", the answer when such a method beat the trained draft and cleared the gates. It has no
``draft/`` folder; version.json's ``training_free`` is the method's spec string (None for a draft), and
speculative_config.json is vLLM's ``method: ngram`` config with the measured K (or K schedule).
:func:`served_draft` says what any version serves: its folder, or that spec string.

Rules: versions are never overwritten or deleted (a new version is written to a temporary
directory and renamed into place under the lock); aliases move by rewriting ``aliases.json``
through a rename; registering a draft whose files are byte-identical to an existing version's
returns that version instead of creating another (its aliases are still moved as asked).

Concurrency: every change to a name happens under the name's file lock. A caller that must decide
on what it reads (the promote stage: "does the candidate beat the current production?") does the
read, the decision, the registration and the alias move inside one ``with
registry.transaction(name) as tx:`` block, so nothing can change between the read and the write
(compare-and-set). The lock is re-entrant within a thread, so ``register`` may be called inside a
transaction of the same name.

The K to serve: without a serving A/B, speculative_config.json holds one static K (the best K of the
eval). Promoted on a serving A/B, the measured bands (``k_by_concurrency``) become vLLM's batch-size K
schedule (serve/schedule.py ``batch_size_schedule``: the K switches at the geometric mean of two measured
levels; vLLM 0.32 takes it as ``"num_speculative_tokens_per_batch_size": [[start, end, K], ...]`` with
``"num_speculative_tokens"`` its largest K), recorded as ``k_schedule`` in version.json too. It stays the
static form (``k_schedule`` None, K = the best K at the serving concurrency) when ``register(...,
schedule=False)`` (config ``promote.k_schedule``: for engines or vLLM versions without the schedule). When
every measured level chose the same K the schedule is one band, ``[[1, N, K]]`` (N the highest measured level,
K carried beyond it): vLLM serves the same K as the static form, and the config says, as every version promoted
on a serving A/B does, over which loads its K was measured (the issue's contract: the field is there whenever
a serving A/B ran). On a GPU vLLM's scheduler pads new decode requests to K + 1 tokens only on the static path
(vllm/v1/core/sched/scheduler.py: "to preserve full cudagraph"): ``promote.k_schedule=false`` writes that form.
A table whose every band is K 0 cannot be served with a draft: RegistryError.

Targets: a version records the identity of the target it was evaluated against (``target`` in
version.json: path, sha256 of its config.json, tokenizer hash; see :func:`target_identity`). The
versions of one name belong to one target: registering a draft for another target raises
:class:`RegistryError`. Versions written before identities were recorded have none (unknown).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import threading
import time
from pathlib import Path

from draftsmith.artifacts import atomic_dir, write_json
from draftsmith.artifacts.errors import UserError
from draftsmith.artifacts.formats import read_version, write_metrics, write_serving, write_version

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
ALIAS_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")
_HELD = threading.local()  # .depth: {lock file: depth} of the registry locks this thread holds


class RegistryError(UserError, RuntimeError):
    """A registry problem the user can fix (path, name, unknown version or alias)."""


def is_free(draft: str | Path | None) -> bool:
    """Whether `draft` is the spec string of a training-free method the registry records (decode/free.py
    ``recordable``: prompt lookup, ``ngram:MIN-MAX``; not suffix decoding); a Path never is (a folder named ``ngram``
    is a folder)."""
    from draftsmith.decode.free import recordable

    return isinstance(draft, str) and recordable(draft)


def served_draft(record: dict) -> str:
    """What a version (its version.json `record`) serves: its draft folder, or the spec string of the training-free
    method it records (no folder)."""
    return record.get("training_free") or str(Path(record["path"]) / "draft")


def fingerprint(draft_dir: str | Path) -> str:
    """sha256 over the relative paths and bytes of every file of a model directory; of a training-free method's
    canonical spec string (:func:`is_free`: ``ngram`` and ``ngram:2-4`` are one method)."""
    digest = hashlib.sha256()
    if is_free(draft_dir):
        digest.update(b"training-free\0" + _draft(draft_dir).encode())
        return digest.hexdigest()
    root = Path(draft_dir)
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        with path.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def speculative_config(draft_dir: str | Path, k: int | None, schedule: list[list[int]] | None = None, *,
                       method_from: str | Path | None = None) -> dict:
    """The vLLM ``--speculative-config`` for serving `draft_dir` (resolved) with K tokens, or with the batch-size K
    `schedule` (then `k` is None or its largest K: serve/server.py ``speculative_config``). The method (a separate
    draft model, or an EAGLE head) is read from the checkpoint at `method_from` (default `draft_dir`): a version's
    files are written in a temporary folder before `draft_dir` exists. A training-free method's spec string gives
    its own config (``method: ngram`` and its lookup window)."""
    from draftsmith.serve.server import speculative_config as vllm_config, speculative_method

    if is_free(draft_dir):
        return vllm_config(str(draft_dir), k, schedule)
    method = speculative_method(method_from if method_from is not None else draft_dir)
    return vllm_config(str(Path(draft_dir).resolve()), k, schedule, method=method)


def k_schedule(serving: dict | None, schedule: bool = True) -> list[list[int]] | None:
    """The batch-size K schedule a version is served with (see the module docstring), or None for a static K:
    None when `schedule` is False, or without a serving A/B or its ``k_by_concurrency``; one band (the same K
    everywhere) gives a one-range schedule. RegistryError naming the key when the table is malformed or all
    off."""
    from draftsmith.serve.schedule import batch_size_schedule, check_schedule

    bands = (serving or {}).get("k_by_concurrency") or []
    if not schedule or not bands:
        return None
    try:
        return check_schedule(batch_size_schedule(list(bands)))  # all off: check_schedule says why
    except ValueError as exc:
        raise RegistryError(f"serving k_by_concurrency {bands}: {exc}") from exc


def target_identity(target: str | Path) -> dict:
    """What tells a target model apart, cheaply (no weight hashing, so fine for a 70B model).

    Returns ``{"path", "config_sha256" (of config.json's bytes), "tokenizer" (artifacts.tokenizer_hash)}``.
    `target` is a local model directory or a hub id (read from the local HF cache). Two targets are the
    same when config and tokenizer agree (:func:`same_target`); the path is recorded for messages only.
    Limitation: two fine-tunes of one base model with identical config.json and tokenizer look the same.
    """
    from transformers.utils import cached_file

    from draftsmith.artifacts import tokenizer_hash
    from draftsmith.decode.pair import load_tokenizer

    local = Path(str(target)).expanduser()
    try:
        config = local / "config.json" if local.is_dir() else Path(cached_file(str(target), "config.json"))
        config_bytes = config.read_bytes()
    except (OSError, ValueError) as exc:
        raise RegistryError(f"cannot identify the target {target}: its config.json cannot be read ({exc}); the eval's "
                            "target (pair.target) must still exist when a draft is promoted") from exc
    try:
        tokenizer = load_tokenizer(str(target), "target")
    except ValueError as exc:
        raise RegistryError(f"cannot identify the target {target}: {exc}") from exc
    return {"path": str(local.resolve()) if local.is_dir() else str(target),
            "config_sha256": hashlib.sha256(config_bytes).hexdigest(), "tokenizer": tokenizer_hash(tokenizer)}


def same_target(a: dict | None, b: dict | None) -> bool | None:
    """True/False when both identities are known; None when either is (a version from before identities)."""
    if not a or not b:
        return None
    return a["config_sha256"] == b["config_sha256"] and a["tokenizer"] == b["tokenizer"]


def describe_target(identity: dict) -> str:
    """``PATH (config 1a2b3c4d5e6f, tokenizer 0123abcd)`` for messages."""
    return f"{identity['path']} (config {identity['config_sha256'][:12]}, tokenizer {identity['tokenizer']})"


def target_mismatch(registry: "LocalRegistry", name: str, identity: dict | None) -> str | None:
    """The one-line refusal when `name`'s versions are drafts for another target than `identity`, else None."""
    known = registry.target(name)
    if same_target(known, identity) is not False:
        return None
    return (f"registry {registry.root}: promote.name {name!r} holds drafts for target {describe_target(known)}, not "
            f"for {describe_target(identity)}: use another promote.name or registry.root")


def check_registry_target(registry: "LocalRegistry", name: str, alias: str, target_path: str | Path) -> None:
    """Start-up check (before any work): raise RegistryError when `name` in `registry` holds drafts for
    another target than `target_path` (pair.target). Nothing to check when `name` has no versions, or only
    versions registered before target identities were recorded. `alias` (promote.alias) names the draft
    the message points at when it has one."""
    if registry.target(name) is None:
        return
    message = target_mismatch(registry, name, target_identity(target_path))
    if message is not None:
        production = registry.find(name, alias)
        if production is not None:
            message += f" ({alias} is v{production['version']})"
        raise RegistryError(message)


class LocalRegistry:
    """A registry of draft versions under one root directory (see the module docstring)."""

    def __init__(self, root: str | Path, lock_timeout_s: float = 600.0):
        self.root = Path(root).expanduser()
        self.lock_timeout_s = lock_timeout_s

    # -- reading ----------------------------------------------------------------------------
    def names(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and NAME_RE.match(p.name))

    def versions(self, name: str) -> list[dict]:
        """The version.json records of `name`, oldest first (empty when the name is new)."""
        entry = self._entry(name)
        found = []
        for path in entry.glob("v*/version.json") if entry.is_dir() else []:
            if re.fullmatch(r"v\d+", path.parent.name):
                found.append(read_version(path))
        return sorted(found, key=lambda v: v["version"])

    def aliases(self, name: str) -> dict[str, int]:
        path = self._entry(name) / "aliases.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def aliases_of(self, name: str, number: int) -> list[str]:
        """The aliases pointing at version `number` of `name`, sorted."""
        return sorted(a for a, v in self.aliases(name).items() if v == number)

    def resolve(self, name: str, ref: str | int) -> dict:
        """The version.json record of `ref`: a version number, "v3", or an alias such as "production"."""
        ref = str(ref)
        aliases = self.aliases(name)
        if ref in aliases:
            number = aliases[ref]
        elif re.fullmatch(r"v?\d+", ref):
            number = int(ref.lstrip("v"))
        else:
            raise RegistryError(f"registry {self.root}: {name!r} has no alias {ref!r} (aliases: {sorted(aliases) or 'none'})")
        path = self._entry(name) / f"v{number}" / "version.json"
        if not path.exists():
            known = [v["version"] for v in self.versions(name)]
            raise RegistryError(f"registry {self.root}: {name!r} has no version {number} (versions: {known or 'none'})")
        return read_version(path)

    def find(self, name: str, alias: str) -> dict | None:
        """The version record `alias` points at, or None when `name` has no such alias (yet)."""
        return self.resolve(name, alias) if alias in self.aliases(name) else None

    def path(self, name: str, ref: str | int) -> Path:
        """The directory of a version (``.../v<N>``)."""
        return self._entry(name) / f"v{self.resolve(name, ref)['version']}"

    def target(self, name: str) -> dict | None:
        """The target identity `name`'s drafts are for (from its versions), or None when unknown or new."""
        return next((v["target"] for v in reversed(self.versions(name)) if v.get("target")), None)

    # -- writing ----------------------------------------------------------------------------
    @contextlib.contextmanager
    def transaction(self, name: str):
        """``with registry.transaction(name) as tx:`` holds `name`'s lock for the block: what ``tx`` reads
        cannot change until ``tx.register`` / ``tx.set_alias`` write (compare-and-set). Re-entrant within
        a thread (another transaction or ``register`` of the same name inside the block does not deadlock)."""
        with self._lock(name):
            tx = RegistryTransaction(self, name)
            try:
                yield tx
            finally:
                tx.closed = True

    def register(self, name: str, draft_dir: str | Path, *, metrics: dict, promotion: dict, k: int,
                 aliases: list[str] | tuple[str, ...] = ("production",), source: dict | None = None,
                 target: dict | None = None, serving: dict | None = None, schedule: bool = True) -> dict:
        """Add `draft_dir` as the next version of `name` (or find the identical existing one) and
        point `aliases` at it. Returns the version record plus ``"created"`` (False when it existed).

        `target` is the :func:`target_identity` of the target the draft was evaluated against; RegistryError
        when `name`'s versions are for another target. `serving`: the serving A/B `k` was chosen from,
        ``{"table": serving.json's content, "k_by_concurrency": [{"from", "to" (absent on the last band),
        "k" (0 = off)}], "concurrency": the level k won at}``, stored as serving.json and in version.json.
        `schedule`: serve the bands as vLLM's batch-size K schedule (speculative_config.json's
        ``num_speculative_tokens_per_batch_size``, version.json's ``k_schedule``; :func:`k_schedule`); False:
        one static K = `k` (config ``promote.k_schedule``). To decide on the registry's state before
        registering, use :meth:`transaction` instead. `draft_dir` may be a training-free method's spec string
        (:func:`is_free`): the version then records the method, with no folder."""
        draft_dir = _draft(draft_dir)
        for alias in aliases:
            _check_alias(alias)
        fp = fingerprint(draft_dir)  # hashed before taking the lock
        with self.transaction(name) as tx:
            return tx.register(draft_dir, metrics=metrics, promotion=promotion, k=k, aliases=aliases, source=source,
                               target=target, draft_fingerprint=fp, serving=serving, schedule=schedule)

    def set_alias(self, name: str, alias: str, ref: str | int) -> dict:
        """Point `alias` at version `ref` of `name` (atomically); returns the new alias map."""
        _check_alias(alias)
        with self.transaction(name) as tx:
            return tx.set_alias(alias, ref)

    # -- internals --------------------------------------------------------------------------
    def _entry(self, name: str) -> Path:
        if not NAME_RE.match(name or ""):
            raise RegistryError(f"registry name {name!r} is invalid: use letters, digits, '.', '_' and '-' "
                                "(config key promote.name)")
        return self.root / name

    def _numbers(self, name: str) -> list[int]:
        return [int(p.name[1:]) for p in self._entry(name).glob("v*") if re.fullmatch(r"v\d+", p.name)]

    def _set_alias_locked(self, name: str, alias: str, number: int) -> dict:
        current = self.aliases(name)
        current[alias] = number
        write_json(self._entry(name) / "aliases.json", current)
        return current

    @contextlib.contextmanager
    def _lock(self, name: str):
        """`name`'s file lock, re-entrant per thread (two FileLock objects on one file in one process would
        block each other until the timeout)."""
        from filelock import FileLock, Timeout

        entry = self._entry(name)
        key = str(entry.resolve() / ".lock")
        depth = _HELD.__dict__.setdefault("depth", {})
        if depth.get(key):
            depth[key] += 1
            try:
                yield
            finally:
                depth[key] -= 1
            return
        try:
            entry.mkdir(parents=True, exist_ok=True)
            probe = entry / f".write-test-{os.getpid()}"
            probe.touch()
            probe.unlink()
        except OSError as exc:
            raise RegistryError(f"registry root {self.root} is not writable ({exc.strerror}); set registry.root "
                                "to a directory you can write to") from exc
        try:
            with FileLock(str(entry / ".lock"), timeout=self.lock_timeout_s):
                depth[key] = 1
                try:
                    yield
                finally:
                    depth[key] = 0
        except Timeout as exc:
            raise RegistryError(f"could not lock {entry / '.lock'} within {self.lock_timeout_s:.0f} s: another "
                                "promotion holds it; retry, or raise registry.lock_timeout_s") from exc


class RegistryTransaction:
    """Reads and writes of one registry name while its lock is held (from :meth:`LocalRegistry.transaction`)."""

    def __init__(self, registry: LocalRegistry, name: str):
        self.registry, self.name, self.closed = registry, name, False

    def _open(self) -> LocalRegistry:
        if self.closed:
            raise RegistryError(f"the registry transaction on {self.name!r} has ended; use the tx object only inside "
                                "its `with registry.transaction(name)` block")
        return self.registry

    def versions(self) -> list[dict]:
        return self._open().versions(self.name)

    def aliases(self) -> dict[str, int]:
        return self._open().aliases(self.name)

    def find(self, alias: str) -> dict | None:
        return self._open().find(self.name, alias)

    def resolve(self, ref: str | int) -> dict:
        return self._open().resolve(self.name, ref)

    def path(self, ref: str | int) -> Path:
        return self._open().path(self.name, ref)

    def target(self) -> dict | None:
        return self._open().target(self.name)

    def register(self, draft_dir: str | Path, *, metrics: dict, promotion: dict, k: int,
                 aliases: list[str] | tuple[str, ...] = ("production",), source: dict | None = None,
                 target: dict | None = None, draft_fingerprint: str | None = None, serving: dict | None = None,
                 files: dict[str, str | Path] | None = None, schedule: bool = True) -> dict:
        """:meth:`LocalRegistry.register` inside this transaction; `draft_fingerprint`: fingerprint(draft_dir)
        when the caller already has it (hashing a big draft outside the lock keeps the lock short); `files`:
        {name: path} copied into the version directory beside metrics.json (e.g. the eval's draft_vocab.json);
        `schedule`: as in :meth:`LocalRegistry.register` (False: a static K in speculative_config.json)."""
        reg, draft_dir = self._open(), _draft(draft_dir)
        for alias in aliases:
            _check_alias(alias)
        mismatch = target_mismatch(reg, self.name, target)
        if mismatch is not None:
            raise RegistryError(mismatch)
        sizes = k_schedule(serving, schedule)  # checked before anything is written
        fp = draft_fingerprint or fingerprint(draft_dir)
        existing = next((v for v in self.versions() if v["fingerprint"] == fp), None)
        if existing is None:
            # every v<N> directory counts, so a number is never reused even for a stray directory
            number = max(reg._numbers(self.name), default=0) + 1
            final = reg._entry(self.name) / f"v{number}"
            free = str(draft_dir) if is_free(draft_dir) else None
            record = {"name": self.name, "version": number, "fingerprint": fp, "created_at": time.time(),
                      "best_k": int(k), "summary": promotion.get("candidate"), "target": target,
                      "source": source or {}, "path": str(final.resolve()), "k_schedule": sizes,
                      "training_free": free}
            if serving is not None:
                record.update(serving_concurrency=serving.get("concurrency"),
                              k_by_concurrency=list(serving.get("k_by_concurrency") or []))
            with atomic_dir(final) as tmp:
                if free is None:
                    shutil.copytree(draft_dir, tmp / "draft")
                write_metrics(tmp, metrics)
                write_json(tmp / "promotion.json", promotion)
                config = (speculative_config(free, None if sizes else k, sizes) if free else
                          speculative_config(final / "draft", None if sizes else k, sizes, method_from=tmp / "draft"))
                write_json(tmp / "speculative_config.json", config)
                if serving is not None:
                    write_serving(tmp, serving["table"])
                for file_name, path in (files or {}).items():
                    shutil.copyfile(path, tmp / file_name)
                write_version(tmp, record)
            existing = {**record, "created": True}
        else:
            existing = {**existing, "created": False}
        for alias in aliases:
            reg._set_alias_locked(self.name, alias, existing["version"])
        return existing

    def set_alias(self, alias: str, ref: str | int) -> dict:
        """Point `alias` at version `ref`; returns the new alias map."""
        _check_alias(alias)
        number = self.resolve(ref)["version"]
        return self._open()._set_alias_locked(self.name, alias, number)


def _draft(draft: str | Path) -> str | Path:
    """A training-free method's canonical spec string, or the model directory `draft` (RegistryError unless it
    has a config.json)."""
    if is_free(draft):
        from draftsmith.decode.ngram import parse_ngram

        try:
            return parse_ngram(str(draft)).spec
        except ValueError as exc:
            raise RegistryError(f"{draft!r} is not a training-free method the registry can record ({exc})") from None
    draft_dir = Path(draft)
    if not (draft_dir / "config.json").exists():
        raise RegistryError(f"{draft_dir} is not a model directory (no config.json); pass the merged draft "
                            "that the train stage wrote to DIR/train/draft")
    return draft_dir


def _check_alias(alias: str) -> None:
    if not ALIAS_RE.match(alias):
        raise RegistryError(f"alias {alias!r} is not a valid alias (letters, digits, '_' and '-', starting with a "
                            "letter)")


def format_bands(bands: list[dict]) -> str:
    """``concurrency 1-4: K=4; 8: K=2; >=16: off`` from version.json's "k_by_concurrency"."""
    parts = []
    for band in bands:
        start, end = band["from"], band.get("to")
        span = f">={start}" if end is None else (str(start) if end == start else f"{start}-{end}")
        parts.append(f"{span}: {'off' if band['k'] == 0 else 'K=' + str(band['k'])}")
    return "concurrency " + "; ".join(parts)


def format_versions(registry: LocalRegistry, name: str) -> str:
    """A plain-text table of the versions of `name` and their aliases (the `list` command); the last column,
    "serves", is "K=3" for a static K, or the batch-size K schedule vLLM follows (``batch 1-5: K=4; >=6: K=2``)."""
    from draftsmith.serve.schedule import describe_schedule

    versions = registry.versions(name)
    if not versions:
        return f"{name}: no versions in {registry.root}"
    by_version: dict[int, list[str]] = {}
    for alias, number in sorted(registry.aliases(name).items()):
        by_version.setdefault(number, []).append(alias)
    lines = [f"{'version':>7}  {'aliases':<20} {'best K':>6} {'speedup':>8} {'acc.rate':>8}  {'created':<16}  serves"]
    for v in versions:
        summary = v.get("summary") or {}
        created = time.strftime("%Y-%m-%d %H:%M", time.localtime(v["created_at"]))
        serves = describe_schedule(v["k_schedule"]) if v.get("k_schedule") else f"K={v['best_k']}"
        if v.get("training_free"):  # no draft needed: the method and its K
            serves = f"{v['training_free']} (no draft), {serves}"
        lines.append(f"{'v' + str(v['version']):>7}  {','.join(by_version.get(v['version'], [])) or '-':<20} "
                     f"{v['best_k']:>6} {summary.get('speedup', float('nan')):>8.3f} "
                     f"{summary.get('acceptance_rate', float('nan')):>8.3f}  {created:<16}  {serves}")
    return "\n".join(lines)
