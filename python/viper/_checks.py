"""Argument checks of the public Python API, run before anything reaches the extension.

Each check takes the public callable's name (`owner`, e.g. "Publisher.publish()"), the argument's
name and its value, and returns the value (converted: int, float, str) or raises one line that
names all three and the rule:

  TypeError             the value has the wrong type ("expected an int, got str")
  InvalidArgumentError  the value has the right type but breaks the rule; it subclasses ValueError

Values are shown by a short repr (a tensor or a long string is cut), never in full.
"""
from __future__ import annotations

import math
import numbers
import os
import re
from collections.abc import Mapping
from typing import Any, Optional

from ._viper import InvalidArgumentError

INT64_MAX = 2**63 - 1
MAX_SECONDS = 9.0e9          # what the extension converts to nanoseconds without overflow
MAX_PATH_BYTES = 4095
MAX_TEXT_BYTES = 1024
MAX_MODEL_BYTES = 128
_MODEL = re.compile(r"[A-Za-z0-9._-]+")
_HOST = re.compile(r"[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\]")


def shown(value: Any, limit: int = 60) -> str:
    """A short repr of `value` for messages: cut after `limit` characters, one line."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 (a broken __repr__ must not hide the real error)
        text = f"<{type(value).__name__}>"
    text = text.replace("\n", "\\n")
    if len(text) > limit:
        text = f"{text[:limit]}... ({type(value).__name__}, {len(text)} characters)"
    return text


def _type_error(owner: str, name: str, value: Any, expected: str) -> TypeError:
    return TypeError(f"{owner}: {name}={shown(value)}: expected {expected}, got {type(value).__name__}")


def _value_error(owner: str, name: str, value: Any, rule: str) -> InvalidArgumentError:
    return InvalidArgumentError(f"{owner}: {name}={shown(value)}: must be {rule}")


def integer(owner: str, name: str, value: Any, lo: int = 0, hi: int = INT64_MAX) -> int:
    """An int (or numpy integer; not a bool) with lo <= value <= hi."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise _type_error(owner, name, value, "an int")
    v = int(value)
    if not lo <= v <= hi:
        raise _value_error(owner, name, v, f"an int from {lo} to {hi}")
    return v


def index(owner: str, name: str, value: Any, size: int) -> int:
    """An index into `size` items: an int (TypeError otherwise) from 0 to size - 1 (IndexError otherwise,
    as a sequence raises it)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise _type_error(owner, name, value, "an int")
    v = int(value)
    if not 0 <= v < size:
        raise IndexError(f"{owner}: {name}={shown(v)}: must be from 0 to {size - 1} (there are {size})")
    return v


def number(owner: str, name: str, value: Any, lo: float = -math.inf, hi: float = math.inf,
           lo_open: bool = False) -> float:
    """A finite real number (int or float; not a bool) with lo <= value <= hi (lo < value if lo_open)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise _type_error(owner, name, value, "a number")
    v = float(value)
    low_ok = v > lo if lo_open else v >= lo
    if not math.isfinite(v) or not low_ok or v > hi:
        low = f"above {lo:g}" if lo_open else f"at least {lo:g}"
        rule = "a finite number" + ("" if lo == -math.inf else f" {low}") + ("" if hi == math.inf else f" and at most {hi:g}")
        raise _value_error(owner, name, value, rule)
    return v


def optional_number(owner: str, name: str, value: Any, **limits: Any) -> Optional[float]:
    return None if value is None else number(owner, name, value, **limits)


def seconds(owner: str, name: str, value: Any, lo_open: bool = False) -> float:
    """A duration: a finite number of seconds, 0 (or above, if lo_open) to MAX_SECONDS."""
    return number(owner, name, value, 0.0, MAX_SECONDS, lo_open=lo_open)


def optional_seconds(owner: str, name: str, value: Any, lo_open: bool = False) -> Optional[float]:
    return None if value is None else seconds(owner, name, value, lo_open=lo_open)


def boolean(owner: str, name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise _type_error(owner, name, value, "a bool")
    return value


def utf8(owner: str, name: str, value: str) -> str:
    """A str that UTF-8 can encode: no lone surrogate (which Python strings may hold, e.g. from
    os.fsdecode of undecodable bytes, and the C++ side cannot take)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise _value_error(owner, name, value, f"valid Unicode text (a lone surrogate at position {e.start})") from None
    return value


def text(owner: str, name: str, value: Any, max_bytes: int = MAX_TEXT_BYTES, allow_empty: bool = False) -> str:
    """A str (not bytes) of at most max_bytes UTF-8 bytes, without NUL."""
    if not isinstance(value, str):
        raise _type_error(owner, name, value, "a str")
    utf8(owner, name, value)
    size = len(value.encode("utf-8"))
    if (not value and not allow_empty) or size > max_bytes or "\0" in value:
        raise _value_error(owner, name, value, f"a str of {0 if allow_empty else 1}-{max_bytes} bytes without NUL"
                           + (f" (it has {size})" if size > max_bytes else ""))
    return value


def model_name(owner: str, name: str, value: Any, allow_empty: bool = False) -> str:
    """A model name: 1-128 bytes of [A-Za-z0-9._-], not starting with '.'."""
    if not isinstance(value, str):
        raise _type_error(owner, name, value, "a str")
    if allow_empty and value == "":
        return value
    if not (0 < len(value) <= MAX_MODEL_BYTES and _MODEL.fullmatch(value) and not value.startswith(".")):
        raise _value_error(owner, name, value, f"a model name: 1-{MAX_MODEL_BYTES} characters of [A-Za-z0-9._-], "
                           "not starting with '.'")
    return value


def address(owner: str, name: str, value: Any) -> str:
    """HOST:PORT: a host name or IP address ([IPv6] in brackets), then a port 0-65535."""
    if not isinstance(value, str):
        raise _type_error(owner, name, value, "a str 'HOST:PORT'")
    host, colon, port = value.rpartition(":")
    ok = (bool(colon) and 0 < len(host) <= 253 and _HOST.fullmatch(host) is not None and port.isdigit()
          and port.isascii() and len(port) <= 5 and int(port) <= 65535)
    if not ok:
        raise _value_error(owner, name, value, "'HOST:PORT' (a host name or IP address, then a port 0-65535)")
    return value


def path(owner: str, name: str, value: Any) -> str:
    """A str or os.PathLike naming a path: 1-4095 bytes, without NUL."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise _type_error(owner, name, value, "a str or os.PathLike path")
    size = len(value.encode("utf-8", "surrogateescape"))
    if not value or size > MAX_PATH_BYTES or "\0" in value:
        raise _value_error(owner, name, value, f"a path of 1-{MAX_PATH_BYTES} bytes without NUL")
    return value


def mapping(owner: str, name: str, value: Any, expected: str = "a mapping name -> numpy array or torch tensor"):
    if not isinstance(value, Mapping):
        raise _type_error(owner, name, value, expected)
    return value


def metadata(owner: str, values: Mapping[str, Any]) -> dict:
    """Extra keyword arguments that become string metadata: str, int, float or bool values."""
    for key, value in values.items():
        text(owner, key, key, max_bytes=MAX_TEXT_BYTES)
        if isinstance(value, str):
            text(owner, key, value, max_bytes=1 << 20, allow_empty=True)
        elif not isinstance(value, (numbers.Real, bool)):
            raise _type_error(owner, key, value, "metadata: a str, int, float or bool")
    return dict(values)
