"""Prometheus alerting rules for a served draft: the monitor's rules (monitor/window.py) written as PromQL.

For teams that already scrape vLLM with Prometheus: ``draftsmith-registry export-alerts NAME`` writes
this file with the thresholds of the promoted version (:func:`export_rules`, from its reference:
monitor/reference.py). The acceptance rate over a window ``W`` is
computed from the same counters as the monitor, summed over engines (and over every scraped server
of the model; narrow it with a label selector)::

    sum by (model_name) (increase(vllm:spec_decode_num_accepted_tokens_total[W]))
      / sum by (model_name) (increase(vllm:spec_decode_num_draft_tokens_total[W]))

``increase()`` handles counter resets as the monitor does. A version served with a batch-size K schedule that
drafts several K's is watched, as by the monitor (monitor/window.py), on its first-position acceptance::

    sum by (model_name) (increase(vllm:spec_decode_num_accepted_tokens_per_pos_total{position="0"}[W]))
      / sum by (model_name) (increase(vllm:spec_decode_num_drafts_total[W]))

with the volume counted in drafts. Rules (alerts only, no recording rules), on the watched figure:

- ``DraftAcceptanceDrift`` (warning): acceptance < measured - margin, for ``for_``;
- ``DraftAcceptanceBelowFloor`` (critical): acceptance < min_acceptance, for ``for_``;
- ``DraftSpecDecodeMetricsAbsent`` (warning): no spec-decode counter at all (speculation off, or
  the server is not scraped);

the first two only on a window with at least ``min_draft_tokens`` drafted tokens. The file is
checked by reading it back (:func:`check_rules_file`: YAML, then the structure Prometheus' rule
loader requires) and, when ``promtool`` is on PATH, by ``promtool check rules`` (:func:`promtool_check`).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Optional

from draftsmith.artifacts import write_text
from draftsmith.artifacts.errors import UserError
from draftsmith.decode.acceptance import ACCEPTANCE_FLOOR
from draftsmith.monitor.reference import reference_rules
from draftsmith.monitor.window import (ACCEPTANCE_RATE, DEFAULT_MARGIN, DEFAULT_MIN_DRAFT_TOKENS, FIGURES,
                                       FIRST_POSITION, recommendation)
from draftsmith.serve.metrics import PER_POS, SPEC_COUNTERS

DURATION_RE = re.compile(r"^(0|(\d+y)?(\d+w)?(\d+d)?(\d+h)?(\d+m)?(\d+s)?(\d+ms)?)$")  # Prometheus model.Duration
LABEL_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
METRIC_RE = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
GROUP_KEYS = {"name", "interval", "query_offset", "limit", "rules", "labels"}
RULE_KEYS = {"record", "alert", "expr", "for", "keep_firing_for", "labels", "annotations"}
DEFAULT_WINDOW = "10m"  # the PromQL range the acceptance rate is taken over
DEFAULT_FOR = "15m"  # how long a rule must hold before it fires


class AlertRulesError(UserError, ValueError):
    """An alert-rule setting or file Prometheus would not load; the message names the option or the rule."""


def is_duration(value, zero_ok: bool = True) -> bool:
    """Whether `value` is a Prometheus duration string (``10m``, ``1h30m``; ``0`` only when `zero_ok`)."""
    return isinstance(value, str) and bool(value) and bool(DURATION_RE.match(value)) and (zero_ok or value != "0")


def check_duration(flag: str, value: str, zero_ok: bool = False) -> str:
    """`value` when it is a Prometheus duration (``10m``, ``1h30m``), else AlertRulesError naming `flag`."""
    if not is_duration(value, zero_ok):
        raise AlertRulesError(f"{flag}={value!r} is not a Prometheus duration: use e.g. 5m, 1h or 1h30m")
    return value


def acceptance_expr(window: str, selector: str = "") -> str:
    """PromQL: the acceptance rate over `window`, summed over engines, per model_name."""
    acc, drafted = (_increase(SPEC_COUNTERS[key], window, selector) for key in ("accepted_tokens", "draft_tokens"))
    return f"{acc}\n  / {drafted}"


def first_position_expr(window: str, selector: str = "") -> str:
    """PromQL: the first-position acceptance over `window` (accepted at position 0 / drafts), summed over engines,
    per model_name: what the monitor watches for a version with a batch-size K schedule."""
    first = _increase(PER_POS, window, ", ".join(filter(None, [selector, 'position="0"'])))
    drafts = _increase(SPEC_COUNTERS["drafts"], window, selector)
    return f"{first}\n  / {drafts}"


def figure_expr(figure: str, window: str, selector: str = "") -> str:
    """PromQL of the watched figure (monitor/window.py FIGURES) over `window`."""
    if figure not in FIGURES:
        raise AlertRulesError(f"the watched figure must be one of {sorted(FIGURES)}, got {figure!r}")
    return first_position_expr(window, selector) if figure == FIRST_POSITION else acceptance_expr(window, selector)


def _increase(metric: str, window: str, selector: str) -> str:
    return f"sum by (model_name) (increase({metric}{{{selector}}}[{window}]))" if selector else \
        f"sum by (model_name) (increase({metric}[{window}]))"


def prometheus_rules(*, name: str, version: Optional[int], measured: Optional[float], source: str, margin: float,
                     min_acceptance: float, window: str = DEFAULT_WINDOW, for_: str = DEFAULT_FOR,
                     selector: str = "", min_draft_tokens: int = DEFAULT_MIN_DRAFT_TOKENS,
                     recommendation: dict[str, str] | None = None, figure: str = ACCEPTANCE_RATE) -> dict:
    """The rule file's content (a dict for yaml.safe_dump) for the draft `name` v`version`.

    Args:
        measured: the promoted version's measured acceptance rate (None: no drift rule, the floor only).
        source: where `measured` comes from (e.g. "vLLM serving A/B at K=4, concurrency 8"), for annotations.
        margin: the drift rule fires below measured - margin; min_acceptance: the floor rule's threshold.
        window: the PromQL range the acceptance is taken over; for_: how long a rule must hold before it fires.
        selector: label matchers without braces (``job="vllm", model_name="my-target"``) narrowing every counter.
        min_draft_tokens: drafted tokens the window needs before the acceptance rules may fire (drafts, for
            the first-position figure: its trials).
        recommendation: {"drift": text, "floor": text}, the action each alert's annotations recommend.
        figure: the watched figure, "acceptance_rate" or "first_position_acceptance" (a version with a batch-size
            K schedule drafting several K's: monitor/reference.py ``watched_figure``); `measured` is its value.
    """
    check_duration("--window", window)
    check_duration("--for", for_, zero_ok=True)
    if any(c in selector for c in "{}"):
        raise AlertRulesError(f"--selector {selector!r}: give the label matchers without braces, e.g. job=\"vllm\"")
    acceptance = figure_expr(figure, window, selector)
    trials = SPEC_COUNTERS["drafts" if figure == FIRST_POSITION else "draft_tokens"]
    volume = f"{_increase(trials, window, selector)} >= {int(min_draft_tokens)}"
    what_figure = "acceptance rate" if figure == ACCEPTANCE_RATE else FIGURES[figure]
    labels = {"draftsmith_name": name, **({"draftsmith_version": f"v{version}"} if version is not None else {})}
    what = f"{name}" + (f" v{version}" if version is not None else "")
    recommendation = recommendation or {}
    rules = []
    if measured is not None:
        drift = round(measured - margin, 6)
        rules.append({
            "alert": "DraftAcceptanceDrift",
            "expr": f"(\n  {acceptance}\n) < {drift:g}\nand\n  {volume}",
            "for": for_, "labels": {"severity": "warning", **labels},
            "annotations": {
                "summary": f"Speculative-decoding acceptance of draft {what} drifted below {drift:g}",
                "description": (f"vLLM's {what_figure} over {window} is {{{{ $value | printf \"%.3f\" }}}}, below "
                                f"{drift:g} = the measured {measured:.3f} ({source}) - margin {margin:g}: live "
                                "traffic has moved away from what the draft was trained on."),
                "recommendation": recommendation.get("drift", "retrain the draft on recent traffic")}})
    rules.append({
        "alert": "DraftAcceptanceBelowFloor",
        "expr": f"(\n  {acceptance}\n) < {min_acceptance:g}\nand\n  {volume}",
        "for": for_, "labels": {"severity": "critical", **labels},
        "annotations": {
            "summary": f"Speculative-decoding acceptance of draft {what} is below {min_acceptance:g}",
            "description": (f"vLLM's {what_figure} over {window} is {{{{ $value | printf \"%.3f\" }}}}, below "
                            f"{min_acceptance:g}: below it speculation usually costs more than it saves."),
            "recommendation": recommendation.get("floor", "disable speculation, then retrain the draft")}})
    counter = SPEC_COUNTERS["drafts"]
    rules.append({
        "alert": "DraftSpecDecodeMetricsAbsent",
        "expr": f"absent({counter}{{{selector}}})" if selector else f"absent({counter})",
        "for": for_, "labels": {"severity": "warning", **labels},
        "annotations": {
            "summary": f"No speculative-decoding counters for draft {what}",
            "description": (f"{counter} is absent: the vLLM server runs without --speculative-config, or "
                            "Prometheus does not scrape it.")}})
    return {"groups": [{"name": f"draftsmith-{name}", "rules": rules}]}


def rules_yaml(doc: dict) -> str:
    """`doc` as YAML, multi-line strings (the PromQL) as literal blocks so the file reads like hand-written rules."""
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    def text(dumper, value):
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)

    Dumper.add_representer(str, text)
    return yaml.dump(doc, Dumper=Dumper, sort_keys=False, width=120, allow_unicode=True)


def check_rules_file(text: str) -> dict:
    """Read a rule file back (yaml.safe_load) and check the structure Prometheus' rule loader requires
    (rulefmt: known keys only, unique non-empty group names, one of record/alert, an expr, durations, label
    and annotation names); returns the parsed document, AlertRulesError naming the first problem."""
    import yaml

    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise AlertRulesError(f"the alert rules are not valid YAML: {exc}") from exc
    problems = _structure_problems(doc)
    if problems:
        raise AlertRulesError("the alert rules would not load in Prometheus: " + "; ".join(problems))
    return doc


def _structure_problems(doc) -> list[str]:
    if not isinstance(doc, dict) or set(doc) != {"groups"} or not isinstance(doc["groups"], list):
        return ["the file must be a mapping with one key, 'groups', holding a list"]
    problems, names = [], set()
    for i, group in enumerate(doc["groups"]):
        where = f"group {i + 1}"
        if not isinstance(group, dict):
            problems.append(f"{where} is not a mapping")
            continue
        problems += [f"{where}: unknown key {k!r}" for k in sorted(set(group) - GROUP_KEYS)]
        name = group.get("name")
        if not isinstance(name, str) or not name:
            problems.append(f"{where}: 'name' must be a non-empty string")
        elif name in names:
            problems.append(f"{where}: group name {name!r} is repeated")
        names.add(name)
        if not isinstance(group.get("rules"), list):
            problems.append(f"{where}: 'rules' must be a list")
            continue
        for j, rule in enumerate(group["rules"]):
            problems += [f"{where}, rule {j + 1}: {p}" for p in _rule_problems(rule)]
    return problems


def _rule_problems(rule) -> list[str]:
    if not isinstance(rule, dict):
        return ["not a mapping"]
    problems = [f"unknown key {k!r}" for k in sorted(set(rule) - RULE_KEYS)]
    alert, record = rule.get("alert"), rule.get("record")
    if bool(alert) == bool(record):
        problems.append("exactly one of 'alert' and 'record' must be set")
    if record and not METRIC_RE.match(str(record)):
        problems.append(f"recording rule name {record!r} is not a metric name")
    if record and ("annotations" in rule or "for" in rule or "keep_firing_for" in rule):
        problems.append("a recording rule takes no 'annotations', 'for' or 'keep_firing_for'")
    expr = rule.get("expr")
    if not isinstance(expr, str) or not expr.strip():
        problems.append("'expr' must be a non-empty string")
    elif not _balanced(expr):
        problems.append(f"'expr' has unbalanced brackets: {expr!r}")
    for key in ("for", "keep_firing_for"):
        if key in rule and not is_duration(rule[key]):
            problems.append(f"{key!r} {rule[key]!r} is not a Prometheus duration")
    for key in ("labels", "annotations"):
        values = rule.get(key, {})
        if not isinstance(values, dict):
            problems.append(f"{key!r} must be a mapping")
            continue
        problems += [f"{key[:-1]} name {k!r} is invalid" for k in values if not LABEL_RE.match(str(k))]
        problems += [f"{key[:-1]} {k!r} must be a string" for k, v in values.items() if not isinstance(v, str)]
    return problems


def _balanced(expr: str) -> bool:
    """Brackets (), [], {} balance outside double-quoted strings (a PromQL syntax check is promtool's)."""
    pairs, stack, quoted = {")": "(", "]": "[", "}": "{"}, [], False
    for i, ch in enumerate(expr):
        if ch == '"' and (i == 0 or expr[i - 1] != "\\"):
            quoted = not quoted
        elif not quoted and ch in "([{":
            stack.append(ch)
        elif not quoted and ch in pairs:
            if not stack or stack.pop() != pairs[ch]:
                return False
    return not stack and not quoted


def promtool_check(path: str, promtool: Optional[str] = None, timeout_s: float = 60.0) -> Optional[str]:
    """Run ``promtool check rules PATH`` when promtool is on PATH (or given): None when it is absent, its output
    when it passes; AlertRulesError quoting it when it fails."""
    promtool = promtool or shutil.which("promtool")
    if promtool is None:
        return None
    try:
        done = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True,
                              timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise AlertRulesError(f"`{promtool} check rules {path}` did not run: {exc}") from exc
    output = (done.stdout + done.stderr).strip()
    if done.returncode != 0:
        raise AlertRulesError(f"`promtool check rules` rejected the generated rules: {output[-600:]}")
    return output


def export_rules(reference: dict, out: str | Path | None = None, *, margin: float = DEFAULT_MARGIN,
                 min_acceptance: float = ACCEPTANCE_FLOOR, window: str = DEFAULT_WINDOW, for_: str = DEFAULT_FOR,
                 selector: str = "", min_draft_tokens: int = DEFAULT_MIN_DRAFT_TOKENS) -> dict:
    """The rule file for the promoted version `reference` (monitor/reference.py ``version_reference``) with the
    thresholds of its measurements, checked by reading it back and by ``promtool check rules`` when promtool is
    on PATH; the other arguments as :func:`prometheus_rules` (`margin`, `min_acceptance`: as the monitor's).

    Returns {"text", "reference", "promtool" (its output, or None when it is not installed), "path"}; the file
    is written atomically to `out` only after the checks passed (`out` None: not written).
    """
    rules = reference_rules(reference, margin=margin, min_acceptance=min_acceptance,
                            min_draft_tokens=min_draft_tokens)
    advice = {rule: "; ".join(recommendation({rule}, reference["retrain_command"])) for rule in ("drift", "floor")}
    name, version, measured = reference["name"], reference["version"], reference["acceptance_rate"]
    doc = prometheus_rules(name=name, version=version, measured=measured, source=reference["source"],
                           margin=rules.margin, min_acceptance=rules.min_acceptance, window=window, for_=for_,
                           selector=selector, min_draft_tokens=min_draft_tokens, recommendation=advice,
                           figure=rules.figure)
    text = (f"# Prometheus alerting rules for the served draft {name} v{version} ({reference['root']}),\n"
            f"# generated by draftsmith-registry export-alerts: measured {rules.figure_label} {measured:.3f}"
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
