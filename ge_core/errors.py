"""The error hierarchy. Every error a user can cause is a :class:`GEError` subclass.

Each message names what is involved (file, node, op, plugin, pass) and says what to do.
The CLI prints ``error: <message>`` for these and exits non-zero without a traceback.
"""

from __future__ import annotations


class GEError(Exception):
    """Base class of every error this project raises on purpose.

    ``hint`` is the "what to do" part; it is appended to the message.
    """

    exit_code = 2

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        self.detail = message
        self.hint = hint
        super().__init__(message if not hint else f"{message} ({hint})")


class ModelFileError(GEError):
    """A model file is missing, unreadable, of an unknown kind or malformed."""


class UnsupportedOpError(GEError):
    """A graph uses an op (or op version) that no registered plugin provides."""


class GraphError(GEError):
    """A graph is malformed: verification failed, or an IR rule was broken."""


class ShapeInferenceError(GEError):
    """Types or shapes of a node could not be inferred or are inconsistent."""


class PluginError(GEError):
    """A plugin failed to load, raised in a hook, or registered something invalid."""


class DuplicateRegistrationError(PluginError):
    """Two plugins registered the same name in the same registry."""


class PassError(GEError):
    """A pass raised or produced an invalid graph."""


class OptionError(GEError):
    """A compile option or pipeline config is unknown or has a bad value."""


class OmFormatError(GEError):
    """An offline model (.om) file is truncated, corrupted, hostile or of an unknown version."""


class InputError(GEError):
    """Inputs given to ``run`` do not match the model (names, dtypes, shapes)."""


class ExecutionError(GEError):
    """A kernel failed while running the model."""


class SecurityError(GEError):
    """An input tried to reach outside where it is allowed (paths, sizes)."""


class RunCancelledError(ExecutionError):
    """A run passed its deadline (``run(..., timeout=)``) and was cancelled at a node."""

    def inside(self, node_name: str, iteration: int) -> RunCancelledError:
        """The same cancellation seen from the loop node ``node_name`` that was running it."""
        return RunCancelledError(f"node '{node_name}', iteration {iteration}: {self.detail}", hint=self.hint)


def reraise_interrupt(e: BaseException) -> None:
    """Re-raise a real Ctrl-C (an exact ``KeyboardInterrupt``). Anything else plugin code raised
    (``SystemExit``, a custom ``BaseException``, a ``KeyboardInterrupt`` subclass) is that
    plugin's failure, to be reported like any exception: callers catch ``BaseException`` at
    every place plugin code runs and call this first."""
    if type(e) is KeyboardInterrupt:
        raise e
