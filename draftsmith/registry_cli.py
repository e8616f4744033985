"""``draftsmith-registry``: list, show and re-alias registry versions; complete pending W&B links.

    draftsmith-registry list [NAME] [--root registry]
    draftsmith-registry show NAME [REF]          # REF: 3, v3, or an alias (default production); with the
                                                 # K per concurrency band when promoted on a serving A/B
    draftsmith-registry alias NAME ALIAS REF     # e.g. promote staging to production by hand
    draftsmith-registry link-pending [--project draftsmith]   # online: link versions promoted offline
"""

from __future__ import annotations

import argparse
import json
import sys

from draftsmith.registry import LocalRegistry, RegistryError, format_bands, format_versions


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="draftsmith-registry", description=__doc__.splitlines()[0])
    parser.add_argument("--root", default="registry", help="registry root directory (config key registry.root)")
    sub = parser.add_subparsers(dest="command", required=True)
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
    except RegistryError as exc:
        print(f"draftsmith-registry: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
