"""Hook implementations of the ``ge_streams`` plugin."""

from ge_core.errors import OptionError
from ge_core.hookspecs import RegisterOption, RegisterStreamAllocator, hookimpl
from ge_core.serialize import LIMITS

from .allocators import DEFAULT_MAX_STREAMS, allocate_critical_path, allocate_dependency, allocate_single


@hookimpl
def ge_register_stream_allocators(register: RegisterStreamAllocator) -> None:
    register("single", allocate_single)
    register("dependency", allocate_dependency)
    register("critical_path", allocate_critical_path)


def _int_reader(name: str, low: int, high: int):
    """The reader of an int option: OptionError naming it for an int outside ``low..high``."""

    def read(value):
        if isinstance(value, bool) or not isinstance(value, int):
            return {}  # (not an int: the options' type check names it)
        if not low <= value <= high:
            raise OptionError(f"option {name} must be an integer {low}..{high}, not {value!r:.40}",
                              hint=f"the default is {_DEFAULTS[name]}")
        return {}

    return read


_DEFAULTS = {"max_streams": DEFAULT_MAX_STREAMS, "max_stream_nodes": 0}


@hookimpl
def ge_register_options(register: RegisterOption) -> None:
    register("max_streams", DEFAULT_MAX_STREAMS, "most streams a multi-stream allocator opens",
             read=_int_reader("max_streams", 1, LIMITS.streams))
    register("max_stream_nodes", 0, "split a stream longer than this many nodes (0: no limit)",
             read=_int_reader("max_stream_nodes", 0, 1 << 31))
