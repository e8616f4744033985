"""``draftsmith-monitor URL``: watch a served draft's acceptance on a live vLLM server.

    draftsmith-monitor http://host:8000 [--interval 10] [--window 300]
        [--registry NAME [--root registry] [--ref production]] [--margin 0.05] [--min-acceptance 0.5]
        [--fail-on-alert] [--jsonl monitor.jsonl] [--count N | --duration S]

Every ``--interval`` seconds it reads the server's ``/metrics``, and over the last ``--window`` seconds
(eval/monitor.py) prints the acceptance rate, per-position acceptance, τ (new tokens per target step,
1 + accepted per draft round) and draft rounds/s on one line, and appends the same as one JSON object
per poll to ``--jsonl``. With ``--registry NAME`` the promoted version's measured acceptance is the
reference (:func:`promoted_reference`): an alert when the window falls below it by ``--margin``
(drift), and always below ``--min-acceptance`` (floor), printed with what to do. ``--fail-on-alert``
stops at the first alert with exit status 3. Exit 2 on a user error (one line), 0 otherwise,
Ctrl-C included. A server that stops answering (a restart) is reported and polled again; counters
that restart from zero are handled.

One JSONL record per poll: ``time`` (Unix s), ``url``, ``window_s``, ``status`` ("warming up", "idle",
"low sample", "ok", "alert", "no answer", "no spec metrics"), the window's figures (``acceptance_rate``,
``per_position_acceptance``, ``mean_accepted_tokens``, ``accepted_per_draft``, ``drafts_per_s``, ``drafts``,
``draft_tokens``, ``accepted_tokens``, ``span_s``, ``snapshots``, ``engines``, ``resets``; absent when the poll
read nothing, ``error`` says why), ``alerts`` ([{"rule", "value", "threshold", "message"}]),
``recommendation`` (lines, with alerts), ``reference``, ``drift_below`` and ``floor`` (the thresholds).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Optional

from draftsmith.decode.errors import ConfigError, UserError
from draftsmith.decode.vllm import VllmError, scrape_metrics
from draftsmith.registry import LocalRegistry, RegistryError
from draftsmith.eval.monitor import (DEFAULT_MARGIN, DEFAULT_MIN_ACCEPTANCE, DEFAULT_MIN_DRAFT_TOKENS, MonitorError, Rules,
                          Window, check_rules, metric_names, missing_metrics_message, recommendation, snapshot,
                          status)

ALERT_EXIT = 3


# -- the promoted version's figures -----------------------------------------------------------------
def promoted_reference(registry: LocalRegistry, name: str, ref: str = "production") -> dict:
    """What `ref` of `name` was promoted on: {"name", "version", "acceptance_rate", "source", "k", "draft",
    "retrain_command"}.

    The acceptance rate, best first: vLLM's in the serving A/B stored with the version (serving.json) at the
    served K and the serving concurrency — the same counters the monitor reads; else the figure the promotion
    decided on (version.json "summary": vLLM's or the batch-1 eval's at the best K, as its source says).
    """
    record = registry.resolve(name, ref)
    path = registry.path(name, record["version"])
    summary = record.get("summary") or {}
    k = record.get("best_k")
    rate, source = _serving_acceptance(path / "serving.json", summary, k, record.get("serving_concurrency"))
    if rate is None and summary.get("acceptance_rate") is not None:
        rate = summary["acceptance_rate"]
        source = summary.get("acceptance_source") or f"eval (batch 1) at K={k}"
    if rate is None:
        raise RegistryError(f"registry {registry.root}: {name} v{record['version']} records no acceptance rate "
                            "(version.json has no summary): run draftsmith-monitor without --registry (floor only)")
    draft = path / "draft"
    return {"name": name, "ref": ref, "version": record["version"], "acceptance_rate": float(rate), "source": source,
            "k": k, "draft": str(draft), "retrain_command": retrain_command(record, draft, registry.root)}


def _serving_acceptance(path: Path, summary: dict, k, concurrency) -> tuple[Optional[float], Optional[str]]:
    """vLLM's acceptance rate of the promoted draft at K=`k` and `concurrency` in the stored serving A/B."""
    draft = (summary.get("serving") or {}).get("draft")
    if not path.exists() or draft is None or concurrency is None:
        return None, None
    cells = json.loads(path.read_text()).get("cells") or []
    cell = next((c for c in cells if c.get("draft") == draft and c.get("k") == k
                 and c.get("concurrency") == concurrency and c.get("acceptance_rate") is not None), None)
    if cell is None:
        return None, None
    return cell["acceptance_rate"], f"vLLM serving A/B at K={k}, concurrency {concurrency}"


def retrain_command(record: dict, draft: Path, root: Path) -> str:
    """``draftsmith data.prompts=recent.jsonl pair.draft=<this version's draft> ...``: distil the production
    draft further on recent prompts, then let the champion gate decide against this registry entry."""
    config = (record.get("source") or {}).get("config") or {}
    pair = config.get("pair") or {}
    target = pair.get("target") or (record.get("target") or {}).get("path")
    args = ["draftsmith", "data.prompts=recent.jsonl", f"pair.draft={draft}"]
    if target:
        args.append(f"pair.target={target}")
    if target == "demo":
        preset = (config.get("demo") or {}).get("preset")
        if preset and preset != "default":
            args.append(f"demo.preset={preset}")
    else:
        args += [f"pair.{key}={pair[key]}" for key in ("dtype", "device") if pair.get(key)]
    args += [f"promote.name={record['name']}", f"registry.root={root}"]
    return " ".join(shlex.quote(a) for a in args)


# -- Prometheus rules (draftsmith-registry export-alerts) ---------------------------------------------
def export_alerts(registry: LocalRegistry, name: str, ref: str = "production", out: str | Path | None = None, *,
                  margin: float = DEFAULT_MARGIN, min_acceptance: float = DEFAULT_MIN_ACCEPTANCE, window: str = "10m",
                  for_: str = "15m", selector: str = "", min_draft_tokens: int = DEFAULT_MIN_DRAFT_TOKENS) -> dict:
    """Write Prometheus alerting rules for `ref` of `name` (eval/alert_rules.py) with the thresholds of its
    measurements, checked by reading them back and by ``promtool check rules`` when promtool is on PATH.

    Returns {"text", "reference", "promtool" (its output, or None when it is not installed), "path"}; the file
    is written atomically to `out` only after the checks passed (`out` None: not written).
    """
    import tempfile

    from draftsmith.artifacts import write_text
    from draftsmith.eval.alert_rules import check_rules_file, prometheus_rules, promtool_check, rules_yaml

    reference = promoted_reference(registry, name, ref)
    rules = Rules(reference=reference["acceptance_rate"], margin=margin, min_acceptance=min_acceptance,
                  min_draft_tokens=min_draft_tokens)
    advice = {rule: "; ".join(recommendation({rule}, reference["retrain_command"])) for rule in ("drift", "floor")}
    doc = prometheus_rules(name=name, version=reference["version"], measured=reference["acceptance_rate"],
                           source=reference["source"], margin=rules.margin, min_acceptance=rules.min_acceptance,
                           window=window, for_=for_, selector=selector, min_draft_tokens=min_draft_tokens,
                           recommendation=advice)
    text = (f"# Prometheus alerting rules for the served draft {name} v{reference['version']} ({registry.root}),\n"
            f"# generated by draftsmith-registry export-alerts: measured acceptance {reference['acceptance_rate']:.3f}"
            f" ({reference['source']}), margin {rules.margin:g}, floor {rules.min_acceptance:g}.\n"
            + rules_yaml(doc))
    check_rules_file(text)
    with tempfile.TemporaryDirectory(prefix="draftsmith-alerts-") as tmp:
        checked = Path(tmp) / "rules.yml"
        checked.write_text(text)
        promtool = promtool_check(str(checked))
    if out is not None:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        write_text(out, text)
    return {"text": text, "reference": reference, "promtool": promtool, "path": None if out is None else str(out)}


# -- polling ----------------------------------------------------------------------------------------
def base_url(url: str) -> str:
    """``http://host:port`` from ``host:port``, ``http://host:port/`` or ``http://host:port/metrics``."""
    url = url.strip().rstrip("/")
    if "://" not in url:
        url = "http://" + url
    return url[: -len("/metrics")] if url.endswith("/metrics") else url


class Monitor:
    """Polls one server's /metrics into a :class:`Window` and applies :class:`Rules`; :meth:`poll` -> one record."""

    def __init__(self, url: str, rules: Rules, window_s: float, timeout_s: float = 10.0):
        self.url, self.rules, self.timeout_s = base_url(url), rules, timeout_s
        self.window = Window(window_s)
        self.polls = 0
        self.alerts: list = []  # the Alert objects of the last poll

    def poll(self, t: Optional[float] = None) -> dict:
        """Read /metrics once. The first poll raises when the server does not answer or does not speculate
        (a wrong URL should fail fast); later ones report it in the record ("no answer", "no spec metrics")."""
        t = time.monotonic() if t is None else t
        first, self.polls, self.alerts = self.polls == 0, self.polls + 1, []
        record = {"time": round(time.time(), 3), "url": self.url, "window_s": self.window.seconds, "alerts": [],
                  "reference": self.rules.reference, "drift_below": self.rules.drift_threshold,
                  "floor": self.rules.min_acceptance}
        try:
            text = scrape_metrics(self.url, timeout_s=self.timeout_s)
        except VllmError as exc:
            if first:
                raise MonitorError(f"{exc} (give the base URL of a running vLLM server, e.g. http://host:8000)") \
                    from exc
            return {**record, "status": "no answer", "error": str(exc)}
        snap = snapshot(text, t)
        if not snap.series:
            message = missing_metrics_message(self.url, metric_names(text))
            if first:
                raise MonitorError(message)
            return {**record, "status": "no spec metrics", "error": message}
        stats = self.window.add(snap)
        self.alerts = check_rules(stats, self.rules)
        record.update(status=status(stats, self.rules), **stats.as_dict(),
                      alerts=[a.as_dict() for a in self.alerts])
        return record


def live_line(record: dict) -> str:
    """One compact line per poll."""
    clock = time.strftime("%H:%M:%S", time.localtime(record["time"]))
    if "acceptance_rate" not in record:
        return f"{clock}  {record['status']}: {record.get('error', '')}"
    fmt = (lambda v, spec: "-" if v is None else format(v, spec))
    per_pos = " ".join(f"{p:.2f}" for p in record["per_position_acceptance"]) or "-"
    alerts = ", ".join(a["rule"] for a in record["alerts"])
    state = f"ALERT {alerts}" if alerts else record["status"]
    reset = "; counters reset (restart)" if record["resets"] else ""
    return (f"{clock}  acceptance {fmt(record['acceptance_rate'], '.3f')}  per position [{per_pos}]  "
            f"tau {fmt(record['mean_accepted_tokens'], '.2f')}  drafts/s {fmt(record['drafts_per_s'], '.1f')}  "
            f"| {record['span_s']:.1f} s, {int(record['draft_tokens'])} drafted, {record['engines']} engine(s){reset} "
            f"| {state}")


def header(url: str, args, rules: Rules, reference: Optional[dict]) -> str:
    """The first line: what is watched and against which thresholds."""
    line = (f"draftsmith-monitor: watching {base_url(url)}/metrics every {args.interval:g} s over a {args.window:g} s "
            f"window; floor {rules.min_acceptance:g}")
    if reference:
        line += (f"; {reference['ref']} {reference['name']} v{reference['version']} was measured at acceptance "
                 f"{reference['acceptance_rate']:.3f} ({reference['source']}): drift below "
                 f"{rules.drift_threshold:.3f} (margin {rules.margin:g})")
    return line


def watch(args, out=print) -> int:
    """The polling loop of the command; returns its exit status."""
    reference = None
    if args.registry:
        reference = promoted_reference(LocalRegistry(args.root), args.registry, args.ref)
    rules = Rules(reference=reference and reference["acceptance_rate"], margin=args.margin,
                  min_acceptance=args.min_acceptance, min_draft_tokens=args.min_draft_tokens,
                  reference_label=f"{args.ref} v{reference['version']}'s" if reference else "the reference")
    monitor = Monitor(args.url, rules, args.window, timeout_s=args.timeout)
    retrain = reference and reference["retrain_command"]
    jsonl = _open_jsonl(args.jsonl)
    out(header(args.url, args, rules, reference))
    start, shown, warned_k = time.monotonic(), set(), False
    try:
        while True:
            record = monitor.poll()
            kinds = {a.rule for a in monitor.alerts}
            if kinds:
                record["recommendation"] = recommendation(kinds, retrain)
            if jsonl:
                jsonl.write(json.dumps(record) + "\n")
                jsonl.flush()
            out(live_line(record))
            served_k = len(record.get("per_position_acceptance") or [])
            if reference and served_k and reference["k"] and served_k != reference["k"] and not warned_k:
                warned_k = True
                out(f"  note: the server drafts K={served_k}, {args.ref} was measured at K={reference['k']}: the "
                    "reference acceptance may not apply")
            if kinds and kinds != shown:
                for alert in record["alerts"]:
                    out(f"  ALERT {alert['rule']}: {alert['message']}")
                for line in record["recommendation"]:
                    out(f"  recommendation: {line}")
            shown = kinds
            if kinds and args.fail_on_alert:
                return ALERT_EXIT
            if args.count and monitor.polls >= args.count:
                return 0
            next_t = start + monitor.polls * args.interval
            if args.duration is not None and next_t - start > args.duration:
                return 0
            time.sleep(max(0.0, next_t - time.monotonic()))
    except KeyboardInterrupt:
        out(f"draftsmith-monitor: stopped after {monitor.polls} poll(s)")
        return 0
    finally:
        if jsonl:
            jsonl.close()


def _open_jsonl(path: Optional[str]):
    if not path:
        return None
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        return open(path, "a", encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"--jsonl {path} cannot be opened for appending ({exc.strerror})") from exc


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="draftsmith-monitor", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("url", help="the vLLM server (http://host:port, or its /metrics URL)")
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between polls (default 10)")
    parser.add_argument("--window", type=float, default=300.0, help="sliding window in seconds (default 300)")
    parser.add_argument("--registry", metavar="NAME", help="registry name whose promoted version is the reference")
    parser.add_argument("--root", default="registry", help="registry root directory (config key registry.root)")
    parser.add_argument("--ref", default="production", help="version or alias of NAME (default production)")
    parser.add_argument("--margin", type=float, default=DEFAULT_MARGIN,
                        help=f"drift alert below the reference minus this (default {DEFAULT_MARGIN})")
    parser.add_argument("--min-acceptance", type=float, default=DEFAULT_MIN_ACCEPTANCE,
                        help=f"floor alert below this acceptance rate (default {DEFAULT_MIN_ACCEPTANCE})")
    parser.add_argument("--min-draft-tokens", type=int, default=DEFAULT_MIN_DRAFT_TOKENS,
                        help=f"drafted tokens a window needs before it may alert (default {DEFAULT_MIN_DRAFT_TOKENS})")
    parser.add_argument("--fail-on-alert", action="store_true", help=f"stop at the first alert, exit {ALERT_EXIT}")
    parser.add_argument("--jsonl", metavar="PATH", help="append one JSON object per poll to PATH")
    parser.add_argument("--count", type=int, help="stop after N polls")
    parser.add_argument("--duration", type=float, help="stop after S seconds")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for /metrics (default 10)")
    args = parser.parse_args(argv)
    if not args.interval > 0:
        raise ConfigError(f"--interval must be > 0 seconds, got {args.interval}")
    if not args.window >= args.interval:
        raise ConfigError(f"--window {args.window:g} must be at least --interval {args.interval:g} (a window "
                          "needs two polls)")
    if args.count is not None and args.count < 1:
        raise ConfigError(f"--count must be >= 1, got {args.count}")
    if args.duration is not None and not args.duration > 0:
        raise ConfigError(f"--duration must be > 0 seconds, got {args.duration}")
    return args


def main(argv: list[str] | None = None) -> int:
    try:
        return watch(parse_args(argv))
    except UserError as exc:
        if os.environ.get("DRAFTSMITH_DEBUG"):
            raise
        print(f"draftsmith-monitor: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # during start-up (reading the registry, the first poll)
        return 0


if __name__ == "__main__":
    sys.exit(main())
