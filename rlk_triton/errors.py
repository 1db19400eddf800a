"""Typed errors. Every input error names the argument it is about."""


class RlkError(Exception):
    """Base class of every error rlk_triton raises on purpose."""


class InputError(RlkError, ValueError):
    """An argument is unusable. ``argument`` names it."""

    def __init__(self, argument: str, message: str):
        self.argument = argument
        super().__init__(f"{argument}: {message}")


class ShapeError(InputError):
    """Shapes of the arguments do not fit together."""


class DTypeError(InputError, TypeError):
    """An argument has a dtype the operator does not support."""


class LayoutError(InputError):
    """An argument's memory layout is unsupported (for example a non-contiguous last dim)."""


class DeviceError(InputError):
    """Arguments live on a device the operator cannot run on (or on different devices)."""


class TargetIndexError(InputError, IndexError):
    """A target id lies outside [0, V) and is not the ignore_index."""


class IdRangeError(InputError, IndexError):
    """An id indexing a table (an embedding's token id, a RoPE position id) lies outside the table."""


class TemperatureError(InputError):
    """A temperature is not a finite positive number."""


class BackendError(InputError):
    """An unknown backend id was asked for."""


class PolicyError(RlkError, RuntimeError):
    """The mode policy could not choose a backend. ``decision`` is the structured record of why."""

    def __init__(self, message: str, decision: dict):
        self.decision = decision
        super().__init__(message)


class RlkFallbackWarning(UserWarning):
    """The policy fell back from the backend the modes asked for; the decision record says why."""


class ContractError(RlkError, LookupError):
    """A contract lookup failed: missing op, dtype or judgment. Lookups never default."""

    def __init__(self, what: str, message: str):
        self.what = what
        super().__init__(f"contract {what}: {message}")


class ContractSchemaError(ContractError):
    """A contract file does not follow contracts/SCHEMA.md."""
