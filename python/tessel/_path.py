"""Path arguments: local paths only, until tessel reads and writes object stores."""
from __future__ import annotations

import os

from tessel import _tessel


def local_path(value: str | os.PathLike, what: str) -> str:
    """`value` as a local path: itself, or the path of a file:///path URL. Any other URL (s3://,
    gs://, http(s)://, hf://, file://host/...) raises tessel.ArgumentError naming `what`, before
    anything is written."""
    if not isinstance(value, (str, os.PathLike)):
        raise _tessel.ArgumentError(f"{what}: {value!r} is not a path")
    return _tessel.local_path(os.fspath(value), what)


def is_url(value: object) -> bool:
    """True for a str that starts with a URL scheme ("s3://...")."""
    return isinstance(value, str) and _tessel.url_scheme(value) != ""
