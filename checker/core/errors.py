"""The one error family the core raises for problems a user can fix (exit code 2 in every command)."""

from __future__ import annotations


class CheckerInputError(ValueError):
    """A user-fixable input problem. The message is one line: the value seen, the rule, the way out.

    ``code`` is a small stable integer so ranks can exchange *which* error they hit as an int64.
    """

    code: int = 1

    def __init__(self, message: str) -> None:
        super().__init__(message.replace("\n", " "))


class ConfigError(CheckerInputError):
    """The model config or model spec cannot be read or is missing a key."""

    code = 2


class LayoutError(CheckerInputError):
    """The parallel layout does not fit the model (pp size, tp size, partition)."""

    code = 3


class BudgetError(CheckerInputError):
    """The budget is invalid or too small for the state pool or one running request."""

    code = 4


class FlagError(CheckerInputError):
    """A flag value or a combination of flags SGLang rejects."""

    code = 5


ERROR_CLASSES: dict[int, type[CheckerInputError]] = {
    cls.code: cls for cls in (CheckerInputError, ConfigError, LayoutError, BudgetError, FlagError)
}
