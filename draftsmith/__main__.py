"""``python -m draftsmith``: the same Hydra app as the ``draftsmith`` command."""

from draftsmith.cli import main

if __name__ == "__main__":
    main()
