"""ATC's gear flags: ``--dynamic_batch_size``, ``--dynamic_image_size``, ``--dynamic_dims``.

Each flag lists gears; a gear gives the ``-1`` dims of ``--input_shape`` their values, and atc
compiles one static model per gear into one .om (:mod:`ge_atc.gear_model`). GE's rules, from its
ATC pages and its source (ge/ir_build/atc_ir_common.cc: CheckDynamicInputParamValid and the
checks it calls; ge/graph/preprocess/multi_batch_options.cc: CheckDynamicParams), each refused
here with an OptionError naming the flag:

* the three flags are mutually exclusive, and each needs ``--input_shape`` with ``-1`` dims (a
  shape range ``1~8`` is ``--input_shape_range``'s, which GE does not combine with gears);
* ``--dynamic_batch_size="1,2,4,8"``: only the batch dim (the first) may be ``-1``; every input
  whose batch is ``-1`` takes the gear's value;
* ``--dynamic_image_size="224,224;320,320"``: an image input is 4-D with ``-1`` exactly at its
  height and width (of ``--input_format`` NCHW, the default, or NHWC); each gear is two values;
* ``--dynamic_dims="1,16;2,32"``: each gear gives a value to every ``-1`` of ``--input_shape``,
  in order, across inputs; ``--input_format`` is ND (GE requires it; here ND is assumed when it
  is absent and another format is refused); each ``--input_shape`` entry has 1 to 4 dims;
* 2 to 100 gears, every value a positive integer (digits only), no duplicate gear, the same
  number of values in every gear.
"""

from __future__ import annotations

from typing import Any

from ge_core.errors import OptionError

from .gear_model import FLAGS, MAX_GEARS, MIN_GEARS, GearTable

EXAMPLES = {"dynamic_batch_size": ('--input_shape="x:-1,3,224,224"', '--dynamic_batch_size="1,2,4,8"'),
            "dynamic_image_size": ('--input_shape="x:1,3,-1,-1"', '--dynamic_image_size="224,224;320,320"'),
            "dynamic_dims": ('--input_shape="x:-1,16;y:-1,-1"', '--dynamic_dims="1,1,8;2,2,16"')}


def gear_flag(args: Any) -> tuple[str, str] | None:
    """The gear flag given (name, value), or None; OptionError for more than one."""
    given = [(f, getattr(args, f)) for f in FLAGS if getattr(args, f, None) is not None]
    if len(given) > 1:
        raise OptionError(f"atc {' and '.join('--' + f for f, _ in given)} cannot be used together",
                          hint="GE takes one of --dynamic_batch_size, --dynamic_image_size and --dynamic_dims")
    return given[0] if given else None


def _error(flag: str, what: str) -> OptionError:
    shape, gears = EXAMPLES[flag]
    return OptionError(f"atc --{flag}: {what}", hint=f"for example {shape} {gears}")


def _input_shape(flag: str, text: Any) -> list[tuple[str, list[int]]]:
    """--input_shape as (name, dims) in its order; -1 marks a gear dim."""
    if not text or not str(text).strip():
        raise _error(flag, "needs --input_shape with -1 at the dims the gears set")
    entries = []
    for part in str(text).split(";"):
        if not part.strip():
            continue
        name, sep, dims = part.strip().rpartition(":")
        if not sep or not name.strip():
            raise _error(flag, f"--input_shape entry '{part.strip()}' must look like name:d1,d2,...")
        out = []
        for d in dims.split(","):
            d = d.strip()
            if "~" in d:
                raise _error(flag, f"--input_shape '{part.strip()}' holds the range '{d}': a shape range cannot be "
                             "combined with gears (GE: --input_shape_range and the gear flags are exclusive)")
            if not (d.isdigit() or d == "-1"):
                raise _error(flag, f"--input_shape '{part.strip()}': dim '{d}' is not -1 or a non-negative integer")
            out.append(int(d))
        entries.append((name.strip(), out))
    if not any(-1 in dims for _, dims in entries):
        raise _error(flag, f"--input_shape=\"{text}\" has no -1 dim: the gears set the -1 dims")
    return entries


def _gear_values(flag: str, value: str, per_gear: int) -> list[tuple[int, ...]]:
    """The gears of the flag's value: ``1,2,4`` (batch) or ``a,b;c,d`` (the others)."""
    groups = [value.split(",")] if flag == "dynamic_batch_size" else [g.split(",") for g in value.split(";") if g.strip()]
    if flag == "dynamic_batch_size":
        groups = [[v] for v in groups[0] if v.strip()]  # GE drops a trailing comma
    gears: list[tuple[int, ...]] = []
    for group in groups:
        vals = [v.strip() for v in group]
        bad = [v for v in vals if not v.isdigit() or int(v) <= 0]
        if bad:
            raise _error(flag, f"'{bad[0]}' is not a positive integer (GE: every gear value is a positive integer)")
        if len(vals) != per_gear:
            raise _error(flag, f"the gear '{','.join(vals)}' has {len(vals)} value(s); each gear needs {per_gear} "
                         + ("(height and width)" if flag == "dynamic_image_size" else
                            "(one per -1 dim of --input_shape, in order)"))
        gears.append(tuple(int(v) for v in vals))
    if not MIN_GEARS <= len(gears) <= MAX_GEARS:
        raise _error(flag, f"{len(gears)} gear(s) given; GE takes {MIN_GEARS} to {MAX_GEARS}")
    for i, g in enumerate(gears):
        if g in gears[:i]:
            raise _error(flag, f"the gear '{','.join(map(str, g))}' is given twice (GE refuses duplicate gears)")
    return gears


def gear_plan(flag: str, value: str, input_shape: Any, input_format: str | None) -> tuple[GearTable, list[str]]:
    """The gear table of ``--<flag>=<value>`` with ``--input_shape``, and each gear's
    ``--input_shape`` (every -1 replaced by the gear's value), in gear order."""
    if not str(value).strip():
        raise _error(flag, "is empty: list the gears")
    entries = _input_shape(flag, input_shape)
    fmt = (input_format or "").upper()
    axes = {n: tuple(k for k, d in enumerate(dims) if d == -1) for n, dims in entries if -1 in dims}
    if flag == "dynamic_batch_size":
        odd = [n for n, ax in axes.items() if ax != (0,)]
        if odd:
            raise _error(flag, f"--input_shape of '{odd[0]}' has -1 beyond the batch dim (the first); only the batch "
                         "may be -1 with --dynamic_batch_size (use --dynamic_dims for other dims)")
        per_gear = 1
    elif flag == "dynamic_image_size":
        if fmt not in ("", "NCHW", "NHWC"):
            raise _error(flag, f"--input_format={input_format} has no height and width: use NCHW or NHWC")
        hw = (1, 2) if fmt == "NHWC" else (2, 3)
        dims_of = dict(entries)
        odd = [n for n, ax in axes.items() if len(dims_of[n]) != 4 or ax != hw]
        if odd:
            raise _error(flag, f"--input_shape of '{odd[0]}' is {dims_of[odd[0]]}: with --dynamic_image_size an input "
                         f"is 4-D ({fmt or 'NCHW'}) with -1 exactly at its height and width")
        per_gear = 2
    else:
        if fmt not in ("", "ND"):
            raise _error(flag, f"--input_format={input_format}: GE takes --dynamic_dims with --input_format=ND only")
        odd = [n for n, dims in entries if not 1 <= len(dims) <= 4]
        if odd:
            raise _error(flag, f"--input_shape of '{odd[0]}' has {len(dict(entries)[odd[0]])} dims; GE takes 1 to 4 "
                         "dims per input with --dynamic_dims")
        per_gear = sum(len(ax) for ax in axes.values())
    gears = _gear_values(flag, str(value), per_gear)
    shapes, texts = [], []
    for g in gears:
        it = iter(g)
        shape: dict[str, tuple[int, ...]] = {}
        for name, dims in entries:
            if flag == "dynamic_dims":
                shape[name] = tuple(next(it) if d == -1 else d for d in dims)
            else:  # every gear input takes the one batch value or the one height and width
                own = iter(g)
                shape[name] = tuple(next(own) if d == -1 else d for d in dims)
        shapes.append({n: s for n, s in shape.items() if n in axes})
        texts.append(";".join(f"{n}:{','.join(map(str, s))}" for n, s in shape.items()))
    table = GearTable(flag, axes, tuple(shapes))
    problem = table.problem()
    if problem:  # the checks above should have said it: a last guard, never a bad .om
        raise _error(flag, problem)
    return table, texts
