"""Reading the small text files ATC's flags name (keep_dtype, modify_mixlist, insert_op_conf)."""

from __future__ import annotations

from typing import Any

from ge_core.errors import OptionError
from ge_core.options import read_regular_file


def read_text(path: Any, what: str, limit: int) -> str:
    """The UTF-8 text of the regular file ``path`` (at most ``limit`` bytes); else OptionError."""
    if not isinstance(path, str) or not path:
        raise OptionError(f"{what} must be a file path, not {path!r:.60}")
    raw = read_regular_file(path, f"{what} file", limit)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise OptionError(f"{what} file '{path}' is not UTF-8 text") from None
