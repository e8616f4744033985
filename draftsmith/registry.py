"""The model registry drafts are promoted to: local directories by default, mirrored to W&B Registry.

Local layout (``root`` is ``registry.root`` in the config)::

    root/<name>/v<N>/draft/                 the merged draft model with its tokenizer
    root/<name>/v<N>/metrics.json           the eval metrics it was promoted on
    root/<name>/v<N>/promotion.json         the promotion decision (gates, reasons)
    root/<name>/v<N>/speculative_config.json   pass to vLLM: --speculative-config "$(cat ...)"
    root/<name>/v<N>/version.json           version, fingerprint, source, time, best K
    root/<name>/aliases.json                {"production": N, "staging": M}
    root/<name>/.lock                       taken around every change

Rules: versions are never overwritten or deleted (a new version is written to a temporary
directory and renamed into place under the lock); aliases move by rewriting ``aliases.json``
through a rename; registering a draft whose files are byte-identical to an existing version's
returns that version instead of creating another (its aliases are still moved as asked). The file
lock makes concurrent promotions from many sweep jobs safe.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import time
from pathlib import Path

from decode.artifacts import atomic_dir, write_json

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
ALIAS_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")


class RegistryError(RuntimeError):
    """A registry problem the user can fix (path, name, unknown version or alias)."""


def fingerprint(draft_dir: str | Path) -> str:
    """sha256 over the relative paths and bytes of every file of a model directory."""
    root = Path(draft_dir)
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        with path.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def speculative_config(draft_dir: str | Path, k: int) -> dict:
    """The vLLM ``--speculative-config`` for serving `draft_dir` as a separate draft model with K tokens."""
    return {"model": str(Path(draft_dir).resolve()), "method": "draft_model", "num_speculative_tokens": int(k)}


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
                found.append(json.loads(path.read_text()))
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
        return json.loads(path.read_text())

    def find(self, name: str, alias: str) -> dict | None:
        """The version record `alias` points at, or None when `name` has no such alias (yet)."""
        return self.resolve(name, alias) if alias in self.aliases(name) else None

    def path(self, name: str, ref: str | int) -> Path:
        """The directory of a version (``.../v<N>``)."""
        return self._entry(name) / f"v{self.resolve(name, ref)['version']}"

    # -- writing ----------------------------------------------------------------------------
    def register(self, name: str, draft_dir: str | Path, *, metrics: dict, promotion: dict, k: int,
                 aliases: list[str] | tuple[str, ...] = ("production",), source: dict | None = None) -> dict:
        """Add `draft_dir` as the next version of `name` (or find the identical existing one) and
        point `aliases` at it. Returns the version record plus ``"created"`` (False when it existed)."""
        draft_dir = Path(draft_dir)
        if not (draft_dir / "config.json").exists():
            raise RegistryError(f"{draft_dir} is not a model directory (no config.json); pass the merged draft "
                                "that the train stage wrote to DIR/train/draft")
        for alias in aliases:
            _check_alias(alias)
        fp = fingerprint(draft_dir)
        with self._lock(name):
            existing = next((v for v in self.versions(name) if v["fingerprint"] == fp), None)
            if existing is None:
                # every v<N> directory counts, so a number is never reused even for a stray directory
                number = max(self._numbers(name), default=0) + 1
                final = self._entry(name) / f"v{number}"
                record = {"name": name, "version": number, "fingerprint": fp, "created_at": time.time(),
                          "best_k": int(k), "summary": promotion.get("candidate"), "source": source or {},
                          "path": str(final.resolve())}
                with atomic_dir(final) as tmp:
                    shutil.copytree(draft_dir, tmp / "draft")
                    write_json(tmp / "metrics.json", metrics)
                    write_json(tmp / "promotion.json", promotion)
                    write_json(tmp / "speculative_config.json", speculative_config(final / "draft", k))
                    write_json(tmp / "version.json", record)
                existing = {**record, "created": True}
            else:
                existing = {**existing, "created": False}
            for alias in aliases:
                self._set_alias_locked(name, alias, existing["version"])
        return existing

    def set_alias(self, name: str, alias: str, ref: str | int) -> dict:
        """Point `alias` at version `ref` of `name` (atomically); returns the new alias map."""
        _check_alias(alias)
        with self._lock(name):
            number = self.resolve(name, ref)["version"]
            return self._set_alias_locked(name, alias, number)

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
        from filelock import FileLock, Timeout

        entry = self._entry(name)
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
                yield
        except Timeout as exc:
            raise RegistryError(f"could not lock {entry / '.lock'} within {self.lock_timeout_s:.0f} s: another "
                                "promotion holds it; retry, or raise registry.lock_timeout_s") from exc


def _check_alias(alias: str) -> None:
    if not ALIAS_RE.match(alias):
        raise RegistryError(f"alias {alias!r} is not a valid alias (letters, digits, '_' and '-', starting with a "
                            "letter)")


def format_versions(registry: LocalRegistry, name: str) -> str:
    """A plain-text table of the versions of `name` and their aliases (the `list` command)."""
    versions = registry.versions(name)
    if not versions:
        return f"{name}: no versions in {registry.root}"
    by_version: dict[int, list[str]] = {}
    for alias, number in sorted(registry.aliases(name).items()):
        by_version.setdefault(number, []).append(alias)
    lines = [f"{'version':>7}  {'aliases':<20} {'best K':>6} {'speedup':>8} {'acc.rate':>8}  created", ]
    for v in versions:
        summary = v.get("summary") or {}
        created = time.strftime("%Y-%m-%d %H:%M", time.localtime(v["created_at"]))
        lines.append(f"{'v' + str(v['version']):>7}  {','.join(by_version.get(v['version'], [])) or '-':<20} "
                     f"{v['best_k']:>6} {summary.get('speedup', float('nan')):>8.3f} "
                     f"{summary.get('acceptance_rate', float('nan')):>8.3f}  {created}")
    return "\n".join(lines)
