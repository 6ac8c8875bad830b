"""The fused ops' shared vocabulary: what the fusion plugin writes and a backend's kernels read.

``ge_fusion`` declares the fused ops (domain :data:`DOMAIN`) and writes them into graphs; a
backend (``ge_cpu``'s :mod:`ge_cpu.fused`) runs them. Plugins never import each other, so what
both sides must agree on lives here: the domain and op names, the attributes a fused Conv keeps,
the Attention op's layout attributes, and the *program format* of the elementwise ops.

A *program* is the body of a fused elementwise group, stored on the fused node as a JSON string
attribute (so a compiled ``.om`` carries it): a list of steps ``[op_type, [refs], {attrs}]``
evaluated in order. A ref is ``"a<k>"`` (kernel input ``k`` of the group), ``"y"`` (the result of
the anchor op, for an epilogue fused into a Conv or MatMul) or ``"t<j>"`` (the result of step
``j``); the last step's result is the program's result. :data:`PROGRAM_OPS` is the vocabulary of
ops a step may name, with each op's arity and attribute schema; :func:`loads` validates a program
against it (nothing else reaches a code generator).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Sequence
from typing import Any

#: The domain of the fused ops.
DOMAIN = "ge.fused"

#: The fused ops (declared by ge_fusion, run by a backend).
FUSED_CONV, FUSED_MATMUL, FUSED_ELEMWISE = "FusedConv", "FusedMatMul", "FusedElemwise"
ATTENTION, LAYER_NORM, RMS_NORM, SOFTMAX = "Attention", "LayerNorm", "RMSNorm", "Softmax"
GELU, SILU, ROTARY = "Gelu", "Silu", "Rotary"
FUSED_OPS = (ROTARY, FUSED_CONV, FUSED_MATMUL, FUSED_ELEMWISE, ATTENTION, LAYER_NORM, RMS_NORM, SOFTMAX, GELU, SILU)

#: The attributes (with their defaults) a FusedConv keeps of its Conv.
CONV_ATTRS = {"auto_pad": "NOTSET", "dilations": None, "group": 1, "kernel_shape": None, "pads": None,
              "strides": None}

#: the Attention op's layout attributes: ``perm_q``, ``perm_kt``, ``perm_v`` say which
#: transpose of input 0, 1, 2 is the operand Q, Kᵀ, V (the Transposes an exporter writes around
#: the heads, folded: the kernel reads the strided views), ``perm_out`` which transpose of
#: softmax(Q·Kᵀ)·V the output is; absent or empty: as given
ATTENTION_PERMS = ("perm_q", "perm_kt", "perm_v")

#: the Attention op's ``compute_dtype`` attribute: "" (the inputs' type) or "bfloat16" (both
#: products in bf16 with float32 sums, the softmax in float32: a precision mode's choice)
ATTENTION_COMPUTE = ("", "bfloat16")

#: the Attention op's fake-quant points of a quantised (QDQ) model, in the order the kernel
#: applies them: the scores Q·Kᵀ, the scaled scores, the masked scores, the probabilities after
#: softmax, the output; each ``[scale, lo, hi]`` (:func:`attention_quant`) or absent
ATTENTION_QUANTS = ("scores_quant", "scaled_quant", "masked_quant", "probs_quant", "out_quant")

#: the program step of a quantised model's fake-quant (:data:`ge_sdk.quant.FAKE_QUANT`)
FAKE_QUANT_STEP = "FakeQuant"

#: The environment switch that turns the compiled loops of fused programs off (``0``).
LOOPS_SWITCH = "GE_FUSION_JIT"
#: With compiled loops, a program of two or more steps always runs as one compiled loop (well
#: under 1 us a call against NumPy's 1-2 us per op); a single op from this many output elements.
LOOP_MIN_ELEMENTS = 1024


def attention_perm(node_or_attrs: Any, name: str, rank: int | None) -> list[int] | None:
    """The permutation ``name`` of an Attention node (its attrs), or None when absent, empty or
    the identity; raises ValueError when it is not a permutation of ``range(rank)``."""
    attrs = getattr(node_or_attrs, "attrs", node_or_attrs)
    p = attrs.get(name)
    if p is None or len(p) == 0:
        return None
    p = [int(x) for x in p]
    if sorted(p) != list(range(len(p))) or (rank is not None and len(p) != rank):
        raise ValueError(f"{name} {p} is not a permutation of the {rank if rank is not None else len(p)} axes")
    return None if p == list(range(len(p))) else p


def attention_quant(node_or_attrs: Any, name: str) -> tuple[float, float, float] | None:
    """The fake-quant ``name`` (of :data:`ATTENTION_QUANTS`) of an Attention node (its attrs) as
    ``(scale, lo, hi)``: ``clip(rint(x / scale), lo, hi) * scale`` in float32, lo and hi the
    integer range less the zero point; None when absent or empty; raises ValueError when it is
    not three numbers with a finite scale > 0 and lo <= 0 <= hi."""
    attrs = getattr(node_or_attrs, "attrs", node_or_attrs)
    q = attrs.get(name)
    if q is None or (isinstance(q, (list, tuple)) and len(q) == 0):
        return None
    try:
        if isinstance(q, (str, bytes)) or any(isinstance(x, (bool, str, bytes)) for x in q):
            raise TypeError
        s, lo, hi = (float(x) for x in q)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{name} must be [scale, lo, hi] numbers, not {str(q)[:60]}") from None
    if not (math.isfinite(s) and s > 0 and lo <= 0 <= hi):
        raise ValueError(f"{name} {[s, lo, hi]} needs a finite scale > 0 and lo <= 0 <= hi")
    return s, lo, hi


# ------------------------------------------------------------------------------------------------
# the program format
# ------------------------------------------------------------------------------------------------
Step = tuple[str, list[str], dict[str, Any]]

#: Bounds of a program read back from a model: steps, refs per step, characters of text.
MAX_STEPS = 4096
MAX_REFS = 1024
MAX_PROGRAM_CHARS = 1 << 20

_REF = re.compile(r"([at])(0|[1-9][0-9]{0,8})\Z", re.ASCII)


def dumps(steps: Sequence[Step]) -> str:
    """The attribute form of a program."""
    return json.dumps([[op, list(refs), dict(attrs)] for op, refs, attrs in steps], separators=(",", ":"))


# attribute types of the schema: each normalises a value or raises ValueError
def a_float(v: Any) -> float:
    """A number attribute (int or float, not bool) as a float."""
    if type(v) not in (int, float):
        raise ValueError(f"{type(v).__name__} {str(v)[:40]!r} is not a number")
    try:
        return float(v)
    except OverflowError:
        raise ValueError("the number is out of range") from None


def a_float_or_none(v: Any) -> float | None:
    """A number attribute or None (an absent bound)."""
    return None if v is None else a_float(v)


def a_choice(*allowed: str) -> Callable[[Any], str]:
    """An attribute that is one of the strings ``allowed``."""
    def check(v: Any) -> str:
        if isinstance(v, bytes):
            v = v.decode("utf-8", "replace")
        if not isinstance(v, str) or v not in allowed:
            raise ValueError(f"{str(v)[:40]!r} is not one of {', '.join(allowed)}")
        return v

    return check


class ProgramOp:
    """An op a program step may name: the number of operands (None: one or more) and the
    attribute schema: name -> a type check that returns the normalised value or raises
    ValueError. A step's attributes are exactly those the schema names (each optional: the
    generated forms have defaults)."""

    def __init__(self, arity: int | None = 1, attrs: dict[str, Callable[[Any], Any]] | None = None) -> None:
        self.arity = arity
        self.attrs: dict[str, Callable[[Any], Any]] = dict(attrs or {})

    def check_attrs(self, attrs: dict[str, Any], where: str) -> dict[str, Any]:
        """``attrs`` normalised by the schema; ValueError naming ``where`` on a bad one."""
        out: dict[str, Any] = {}
        for k, v in attrs.items():
            check = self.attrs.get(k) if isinstance(k, str) else None
            if check is None:
                shown = k[:40] if isinstance(k, str) else k
                raise ValueError(f"{where} has attribute {shown!r}; it takes "
                                 f"{', '.join(sorted(self.attrs)) or 'none'}")
            try:
                out[k] = check(v)
            except ValueError as e:
                raise ValueError(f"{where}, attribute {k}: {e}") from None
        return out


_UNARY = ("Neg", "Abs", "Exp", "Log", "Sqrt", "Tanh", "Sin", "Cos", "Reciprocal", "Identity", "Relu",
          "Round")

#: The ops a program may contain, in the order of the generators' table.
PROGRAM_OPS: dict[str, ProgramOp] = {
    **{op: ProgramOp(2) for op in ("Add", "Sub", "Mul", "Div", "Pow")},
    **{op: ProgramOp(None) for op in ("Sum", "Mean", "Max", "Min")},
    **{op: ProgramOp() for op in _UNARY},
    "LeakyRelu": ProgramOp(attrs={"alpha": a_float}),
    "Sigmoid": ProgramOp(),
    "Silu": ProgramOp(),
    "HardSigmoid": ProgramOp(attrs={"alpha": a_float, "beta": a_float}),
    "HardSwish": ProgramOp(),
    "Clip": ProgramOp(attrs={"min": a_float_or_none, "max": a_float_or_none}),
    "Erf": ProgramOp(),
    "Gelu": ProgramOp(attrs={"approximate": a_choice("none", "tanh")}),
    "Elu": ProgramOp(attrs={"alpha": a_float}),
    "Softplus": ProgramOp(),
    # a quantised model's fake-quant (ge_sdk.quant.FAKE_QUANT): clip(rint(x / scale), lo, hi) * scale,
    # lo and hi the integer range less the zero point
    "FakeQuant": ProgramOp(attrs={"scale": a_float, "lo": a_float, "hi": a_float}),
}


def supported(op_type: str) -> bool:
    """Whether a program step may name ``op_type``."""
    return op_type in PROGRAM_OPS


def _decode(text: Any) -> str:
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError("the program is not UTF-8 text") from None
    if not isinstance(text, str):
        raise ValueError(f"a fused program is a JSON string, not {type(text).__name__}")
    if len(text) > MAX_PROGRAM_CHARS:
        raise ValueError(f"the program is longer than {MAX_PROGRAM_CHARS} characters")
    return text


def loads(text: str, n_inputs: int | None = None, anchor: bool = False) -> list[Step]:
    """Parse and validate a program attribute; raises ValueError on a malformed one.

    Every step names an op of :data:`PROGRAM_OPS` with its arity, refs ``a<k>`` (``k < n_inputs``
    when given), ``t<j>`` (``j`` < the step's own index) or ``y`` (only with ``anchor``), and
    attributes from the op's own schema with values of the schema's types (returned normalised).
    Nothing else reaches a generator."""
    text = _decode(text)
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise ValueError(f"the program is not valid JSON ({type(e).__name__})") from None
    if not isinstance(raw, list):
        raise ValueError("a fused program is a list of steps")
    if not raw:
        raise ValueError("a fused program needs at least one step")
    if len(raw) > MAX_STEPS:
        raise ValueError(f"the program has {len(raw)} steps; at most {MAX_STEPS} are allowed")
    out: list[Step] = []
    for i, st in enumerate(raw):
        if not (isinstance(st, list) and len(st) == 3 and isinstance(st[0], str) and isinstance(st[1], list)
                and isinstance(st[2], dict)):
            raise ValueError(f"step {i} is not [op, [refs], {{attrs}}]")
        op, refs, attrs = st
        form = PROGRAM_OPS.get(op)
        if form is None:
            raise ValueError(f"step {i}: op {op[:40]!r} has no generated form")
        if len(refs) > MAX_REFS:
            raise ValueError(f"step {i} ({op}) has {len(refs)} operands; at most {MAX_REFS} are allowed")
        if form.arity is not None and len(refs) != form.arity:
            raise ValueError(f"step {i} ({op}) has {len(refs)} operands; it takes {form.arity}")
        if not refs:
            raise ValueError(f"step {i} ({op}) has no operands")
        for r in refs:
            _check_ref(r, i, n_inputs, anchor)
        out.append((op, list(refs), form.check_attrs(attrs, f"step {i} ({op})")))
    return out


def _check_ref(r: Any, i: int, n_inputs: int | None, anchor: bool) -> None:
    if r == "y":
        if not anchor:
            raise ValueError(f"step {i} reads y, but this program has no anchor op")
        return
    m = _REF.match(r) if isinstance(r, str) else None
    if m is None:
        shown = r[:40] if isinstance(r, str) else r
        raise ValueError(f"step {i} has a bad ref {shown!r} (refs are a<k>, t<j> or y)")
    k = int(m.group(2))
    if m.group(1) == "t" and k >= i:
        raise ValueError(f"step {i} reads {r}, which is not computed yet")
    if m.group(1) == "a" and n_inputs is not None and k >= n_inputs:
        raise ValueError(f"step {i} reads {r}, but the kernel has {n_inputs} input(s)")
