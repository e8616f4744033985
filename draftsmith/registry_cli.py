"""``draftsmith-registry``: list, show and re-alias registry versions; complete pending W&B links.

    draftsmith-registry list [NAME] [--root registry]   # every option before or after the subcommand
    draftsmith-registry show NAME [REF]          # REF: 3, v3, or an alias (default production); with the
                                                 # K per concurrency band when promoted on a serving A/B, the
                                                 # batch-size K schedule vLLM serves, and the --speculative-config
    draftsmith-registry alias NAME ALIAS REF     # e.g. promote staging to production by hand
    draftsmith-registry link-pending [--project draftsmith]   # online: link versions promoted offline
    draftsmith-registry export-alerts NAME [--ref production] [--out FILE]   # Prometheus alerting rules for
                                                 # the served draft, thresholds from its measurements
"""

from __future__ import annotations

import argparse
import json
import sys

from draftsmith.artifacts.errors import UserError
from draftsmith.registry import LocalRegistry, RegistryError, format_bands, format_versions
from draftsmith.serve.schedule import describe_schedule


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="draftsmith-registry", description=__doc__.splitlines()[0])
    parser.add_argument("--root", default="registry", help="registry root directory (config key registry.root)")
    # --root after the subcommand too (`show NAME --root R`): each subcommand takes it, defaulting to "not given"
    # so that the one before the subcommand, or the default, stands when it is left out
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--root", default=argparse.SUPPRESS, help="registry root directory (config key registry.root)")
    sub = parser.add_subparsers(dest="command", required=True)
    add_parser = sub.add_parser

    def with_common(*args, **kwargs):
        return add_parser(*args, parents=[common], **kwargs)

    sub.add_parser = with_common
    p_list = sub.add_parser("list", help="versions and aliases of one name, or all names")
    p_list.add_argument("name", nargs="?")
    p_show = sub.add_parser("show", help="one version's record, speculative config and path")
    p_show.add_argument("name")
    p_show.add_argument("ref", nargs="?", default="production")
    p_alias = sub.add_parser("alias", help="point an alias at a version")
    p_alias.add_argument("name")
    p_alias.add_argument("alias")
    p_alias.add_argument("ref")
    p_link = sub.add_parser("link-pending", help="link versions promoted while W&B was offline (needs online mode)")
    p_link.add_argument("--project", default="draftsmith")
    _add_export_alerts(sub)
    args = parser.parse_args(argv)

    registry = LocalRegistry(args.root)
    try:
        if args.command == "list":
            names = [args.name] if args.name else registry.names()
            if not names:
                print(f"no drafts registered in {registry.root}")
            for name in names:
                print(f"{name}  ({registry.root / name})")
                print(format_versions(registry, name))
        elif args.command == "show":
            record = registry.resolve(args.name, args.ref)
            path = registry.path(args.name, record["version"])
            shown = {**record, "aliases": registry.aliases_of(args.name, record["version"]),
                     "speculative_config": json.loads((path / "speculative_config.json").read_text())}
            shown.pop("source", None)
            if record.get("k_by_concurrency"):  # promoted on a serving A/B: the K to serve per concurrency band
                shown["serving_bands"] = format_bands(record["k_by_concurrency"])
                shown["serving_table"] = str(path / "serving.json")
            shown["k_schedule_description"] = describe_speculation(shown["speculative_config"])
            print(json.dumps(shown, indent=2))
        elif args.command == "alias":
            print(json.dumps(registry.set_alias(args.name, args.alias, args.ref), indent=2))
        elif args.command == "link-pending":
            import wandb

            from draftsmith.wandb_registry import complete_pending

            with wandb.init(project=args.project, job_type="promote", reinit="create_new") as run:
                if run.offline:
                    raise RegistryError("W&B is offline: linking to W&B Registry needs WANDB_MODE=online")
                done = complete_pending(run, registry.root)
            print(f"linked {len(done)} pending version(s)")
        elif args.command == "export-alerts":
            _export_alerts(registry, args)
    except UserError as exc:  # RegistryError, and the alert rules' errors
        print(f"draftsmith-registry: error: {exc}", file=sys.stderr)
        return 2
    return 0


def describe_speculation(config: dict) -> str:
    """What a speculative_config.json makes vLLM do, in one line: ``batch 1-5: K=4; 6-11: K=2; >=12: off``
    (a batch-size K schedule) or ``static K=3 at every batch size``."""
    schedule = config.get("num_speculative_tokens_per_batch_size")
    if schedule:
        return describe_schedule(schedule)
    return f"static K={config.get('num_speculative_tokens')} at every batch size"


def _add_export_alerts(sub) -> None:
    from draftsmith.decode.acceptance import ACCEPTANCE_FLOOR
    from draftsmith.monitor.alert_rules import DEFAULT_FOR, DEFAULT_WINDOW
    from draftsmith.monitor.window import DEFAULT_MARGIN, DEFAULT_MIN_DRAFT_TOKENS

    p = sub.add_parser("export-alerts", help="Prometheus alerting rules for the served draft (thresholds from the "
                                             "promoted version's measurements)")
    p.add_argument("name")
    p.add_argument("--ref", default="production", help="version or alias (default production)")
    p.add_argument("--out", metavar="FILE", help="write the rules here (atomically); default: print them")
    p.add_argument("--margin", type=float, default=DEFAULT_MARGIN,
                   help=f"drift alert below the measured acceptance minus this (default {DEFAULT_MARGIN})")
    p.add_argument("--min-acceptance", type=float, default=ACCEPTANCE_FLOOR,
                   help=f"floor alert below this acceptance rate (the first-position acceptance for a version with "
                        f"a batch-size K schedule; default {ACCEPTANCE_FLOOR})")
    p.add_argument("--window", default=DEFAULT_WINDOW,
                   help=f"PromQL range of the acceptance rate (default {DEFAULT_WINDOW})")
    p.add_argument("--for", dest="for_", default=DEFAULT_FOR,
                   help=f"how long a rule holds before it fires (default {DEFAULT_FOR})")
    p.add_argument("--selector", default="", help='label matchers for every counter, e.g. \'job="vllm"\'')
    p.add_argument("--min-draft-tokens", type=int, default=DEFAULT_MIN_DRAFT_TOKENS,
                   help=f"drafted tokens a window needs before it may alert (default {DEFAULT_MIN_DRAFT_TOKENS})")


def _export_alerts(registry: LocalRegistry, args) -> None:
    """The rules for `args.ref` of `args.name` (monitor/alert_rules.py ``export_rules``), printed or written."""
    from draftsmith.monitor.alert_rules import export_rules
    from draftsmith.monitor_cli import promoted_reference

    done = export_rules(promoted_reference(registry, args.name, args.ref), args.out, margin=args.margin,
                        min_acceptance=args.min_acceptance, window=args.window, for_=args.for_,
                        selector=args.selector, min_draft_tokens=args.min_draft_tokens)
    checked = "promtool check rules passed" if done["promtool"] is not None else "promtool not on PATH, not run"
    if done["path"] is None:
        print(done["text"], end="", flush=True)
        print(f"# checked: read back as Prometheus rules; {checked}", file=sys.stderr)
    else:
        ref = done["reference"]
        watched = "first-position acceptance" if ref.get("figure") == "first_position_acceptance" else "acceptance"
        print(f"wrote {done['path']}: alerts for {args.name} v{ref['version']} (measured {watched} "
              f"{ref['acceptance_rate']:.3f}, {ref['source']}); read back as Prometheus rules; {checked}")


if __name__ == "__main__":
    sys.exit(main())
