"""GE's fusion switch file: which fusion patterns and passes run, by name.

ATC users pass it as the ``fusion_switch_file`` compile option. This plugin registers the
reader of that option (``ge_register_options``'s ``read=``), which sets this plugin's option
``fusion_switches`` (name -> on/off, ``"ALL"`` the default); passes and rewrite rules read it
through ``options.getoption`` (:func:`switch_enabled`, ``PassContext.switch_enabled``).
"""

from __future__ import annotations

import json
from typing import Any

from ge_core.errors import OptionError
from ge_core.options import read_regular_file
from ge_core.registry import close_matches

#: Largest fusion switch file read.
MAX_SWITCH_BYTES = 1 << 20
SECTIONS = ("GraphFusion", "UBFusion")
#: The option holding the switches.
SWITCHES = "fusion_switches"


def parse_fusion_switch_file(path: str) -> dict[str, bool]:
    """Read GE's fusion switch JSON: ``{"Switch": {"GraphFusion": {"NAME": "off", "ALL": "on"},
    "UBFusion": {...}}}`` -> ``{"NAME": False, "ALL": True}``."""
    raw = read_regular_file(path, "fusion switch file", MAX_SWITCH_BYTES)
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise OptionError(f"fusion switch file '{path}' is not valid JSON: {e}") from None
    if not isinstance(data, dict) or not isinstance(data.get("Switch"), dict):
        raise OptionError(
            f"fusion switch file '{path}' has no \"Switch\" object",
            hint='expected {"Switch": {"GraphFusion": {"NAME": "off"}, "UBFusion": {...}}}',
        )
    out: dict[str, bool] = {}
    for section, table in data["Switch"].items():
        if section not in SECTIONS:
            raise OptionError(
                f"fusion switch file '{path}': unknown section '{section}'{close_matches(section, list(SECTIONS))}"
            )
        if not isinstance(table, dict):
            raise OptionError(f"fusion switch file '{path}': \"{section}\" must be an object of NAME: on/off")
        for name, state in table.items():
            s = str(state).strip().lower()
            if s not in ("on", "off"):
                raise OptionError(f"fusion switch file '{path}': {section}.{name} must be \"on\" or \"off\", not {state!r}")
            out[name] = s == "on"
    return out


def read_switch_option(path: Any) -> dict[str, Any]:
    """The reader of option ``fusion_switch_file``: the options its file sets."""
    return {SWITCHES: parse_fusion_switch_file(path)}


def check_switches(value: Any) -> dict[str, Any]:
    """The reader of option ``fusion_switches``: OptionError unless it maps names to true/false."""
    if not isinstance(value, dict) or not all(isinstance(a, str) and isinstance(b, bool) for a, b in value.items()):
        raise OptionError(f"{SWITCHES} must map switch names to true/false, not {value!r:.60}")
    return {}


def switch_enabled(options: Any, name: str, default: bool = True) -> bool:
    """Whether the switches of ``options`` leave the pattern or pass ``name`` on."""
    switches = options.getoption(SWITCHES) or {}
    return bool(switches.get(name, switches.get("ALL", default)))
