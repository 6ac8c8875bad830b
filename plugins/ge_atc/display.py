"""``atc --mode=6`` (and ``--display_model_info=1``): the model info block ATC prints for an .om.

GE's layout (its --mode / --display_model_info pages)::

    ============ Display Model Info start ============
    Original Atc command line: atc --model=... --framework=5 --output=...
    system   info: atc_version[...], soc_version[...], framework_type[...].
    resource info: memory_size[N B], weight_size[N B], stream_num[N], event_num[N].
    ============ Display Model Info end   ============

``memory_size`` is the arena the run needs, ``weight_size`` the bytes of the weights; the command
line is what ``atc`` stored in the .om's report (``unknown`` for a model ``ge compile`` made).
"""

from __future__ import annotations

from typing import Any

from ge_core.options import FRAMEWORKS

_FRAMEWORK_IDS = {name: num for num, name in FRAMEWORKS.items()}


def model_info_text(info: dict[str, Any]) -> str:
    """The model info block of :func:`ge_sdk.omdesc.inspect_om`'s description of an .om."""
    report = _table(info, "report")
    model = _table(info, "model")
    atc, memory, streams = _table(report, "atc"), _table(report, "memory"), _table(report, "streams")
    fw = atc.get("framework")
    fw_text = f"{_FRAMEWORK_IDS[fw]}({fw})" if fw in _FRAMEWORK_IDS else str(fw or "unknown")
    producer = str(model.get("producer") or "unknown")
    lines = [
        "============ Display Model Info start ============",
        f"Original Atc command line: {atc.get('command_line') or 'unknown (not built by atc)'}",
        f"system   info: atc_version[{producer}], soc_version[{model.get('soc_version')}], "
        f"framework_type[{fw_text}].",
        f"resource info: memory_size[{int(memory.get('arena_bytes') or 0)} B], "
        f"weight_size[{int(memory.get('weights_bytes') or 0)} B], stream_num[{int(streams.get('count') or 1)}], "
        f"event_num[{int(streams.get('events') or 0)}].",
        *_gear_lines(info),
        "============ Display Model Info end   ============",
    ]
    return "\n".join(lines)


def _gear_lines(info: dict[str, Any]) -> list[str]:
    """A gear model's gears (memory_size above is the largest gear's arena)."""
    gears = _table(info, "gears")
    if not gears:
        return []
    listed = ", ".join(f"{g.get('label')}[{int(g.get('arena_bytes') or 0)} B]" for g in gears.get("list") or [])
    return [f"dynamic  info: --{gears.get('flag')} gears {listed}."]


def _table(d: dict[str, Any], key: str) -> dict[str, Any]:
    v = d.get(key)
    return v if isinstance(v, dict) else {}
