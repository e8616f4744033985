"""The user-error family: exceptions whose message says what is wrong and what to do.

The ``draftsmith`` command prints a :class:`UserError` as one line (``draftsmith: error: ...``);
any other exception is a bug and is printed with its traceback. Each package raises its own
subclass (``PairError``, ``PromptError``, ``TrainingError``, ``RegistryError``, ``ConfigError``);
``artifacts`` is the ground-floor room every other one may import, so the base class lives here.
"""

from __future__ import annotations


class UserError(Exception):
    """A problem the user can fix: the message names the config key or file and says what to do."""


class ConfigError(UserError, ValueError):
    """A setting that cannot work; the message names the key the user types (``method.lora_r``)."""


def check(ok: bool, message: str) -> None:
    """Raise :class:`ConfigError` with `message` unless `ok` (settings validation in ``__post_init__``)."""
    if not ok:
        raise ConfigError(message)


def check_choice(key: str, value, choices) -> None:
    """Raise :class:`ConfigError` naming `key` unless `value` is one of `choices`."""
    if value not in choices:
        raise ConfigError(f"{key}={value!r} is not one of {list(choices)}")
