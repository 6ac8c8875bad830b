"""GE for Python: a graph compiler and executor for deep-learning models.

The core knows graphs, registries and hooks; frontends, op sets, passes, planners and backends
are plugins found through the ``ge.plugins`` entry-point group.

>>> import ge_core as ge
>>> model = ge.compile(ge.load("model.onnx"), {"soc_version": "cpu"})   # doctest: +SKIP
>>> outputs = model.run({"x": x})                                         # doctest: +SKIP
"""

from .api import compile, load, load_om, quantize  # noqa: E402
from .errors import (  # noqa: E402
    DuplicateRegistrationError,
    ExecutionError,
    GEError,
    GraphError,
    InputError,
    ModelFileError,
    OmFormatError,
    OptionError,
    PassError,
    PluginError,
    RunCancelledError,
    SecurityError,
    ShapeInferenceError,
    UnsupportedOpError,
)
from .hookspecs import hookimpl, hookspec  # noqa: E402
from .ir import Graph, Node, TensorType, Value  # noqa: E402
from .kernel import KernelSpec  # noqa: E402
from .model import AsyncRunner, CompiledModel, NodeArg  # noqa: E402
from .ops import OpDef, OpKind  # noqa: E402
from .options import CompileOptions  # noqa: E402
from .passes import Pass, PassContext, graph_pass  # noqa: E402
from .plugins import get_host  # noqa: E402
from .version import __version__  # noqa: E402

__all__ = [
    "__version__", "load", "compile", "quantize", "load_om", "CompiledModel", "AsyncRunner", "NodeArg", "CompileOptions",
    "Graph", "Node", "Value", "TensorType", "OpDef", "OpKind", "KernelSpec", "Pass", "PassContext",
    "graph_pass", "hookimpl", "hookspec", "get_host",
    "GEError", "ModelFileError", "UnsupportedOpError", "GraphError", "ShapeInferenceError", "PluginError",
    "DuplicateRegistrationError", "PassError", "OptionError", "OmFormatError", "InputError",
    "ExecutionError", "RunCancelledError", "SecurityError",
]
