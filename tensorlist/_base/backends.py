"""The one rule for "is this a URL", and the registry of URL backends.

``reader`` and ``writer`` must not import the adapters that serve URLs
(``remote``), or data would flow both ways. Instead the adapter registers its
handlers here when it is imported, the package facade names it as a
*provider* (:func:`provide`), and the core asks :func:`dispatch` for the
handler of an operation: the first URL imports the provider, so that local
files never pay for it. Imports nothing of ours by name.
"""
from __future__ import annotations

from typing import Callable, Dict, List

__all__ = ["is_url", "is_remote", "local_path", "localize", "filesystem", "register", "provide", "dispatch"]

# RFC 3986 scheme (``[A-Za-z][A-Za-z0-9+.-]*``), then "://": "s3://b/k", "memory://x",
# "file:///tmp/x". A Windows drive ("C:\\x") has no "//", a relative path no scheme.
# Checked by hand rather than with ``re``: compiling the pattern cost 0.1 to 0.3 ms of every import.
_LETTERS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
_SCHEME = _LETTERS | frozenset("0123456789+.-")

_HANDLERS: Dict[str, Callable] = {}
#: modules that register handlers when imported, imported by the first dispatch that finds none
_PROVIDERS: List[str] = []


def is_url(path) -> bool:
    """Whether ``path`` is a URL (``scheme://...``) rather than a local path.

    >>> is_url("s3://bucket/model.tl"), is_url("memory://x"), is_url("runs/model.tl")
    (True, True, False)
    """
    if not isinstance(path, str):
        return False
    end = path.find("://")  # the first: a scheme holds no ":", so a match ends there or nowhere
    return end > 0 and path[0] in _LETTERS and all(c in _SCHEME for c in path[1:end])


def local_path(path) -> "str | None":
    """The local path of a ``file://`` URL (``file:///tmp/m.tl`` -> ``/tmp/m.tl``), else None.

    Such URLs are read and written by the local reader and writer themselves,
    so a local file gets the same confinement, file-type checks and caps
    whatever the spelling of its name.

    >>> local_path("file:///data/m.tl"), local_path("s3://b/m.tl"), local_path("m.tl")
    ('/data/m.tl', None, None)
    """
    if not isinstance(path, str) or not path[:7].lower() == "file://":
        return None
    rest = path[7:]
    if rest.startswith("localhost/"):  # RFC 8089: file://localhost/path
        rest = rest[len("localhost"):]
    return rest or "/"


def localize(path):
    """``path`` itself, or the local path of a ``file://`` URL."""
    local = local_path(path)
    return path if local is None else local


def is_remote(path) -> bool:
    """A URL that a registered backend serves (any scheme but ``file``)."""
    return is_url(path) and local_path(path) is None


def filesystem(url: str, storage_options: "dict | None" = None):
    """``(fsspec filesystem, path inside it)`` for a URL: the one place an address becomes a filesystem.

    fsspec is imported here, on first use, so that local files never need it.

    Raises:
        ImportError: fsspec, or the package serving the URL's scheme (s3fs,
            gcsfs...), is missing; the message names the URL.
        ValueError: fsspec cannot make sense of the URL.
    """
    try:
        import fsspec
    except ImportError as e:
        raise ImportError(f"{url}: remote URLs need fsspec: pip install 'tensorlist[remote]'") from e
    try:
        return fsspec.core.url_to_fs(url, **(storage_options or {}))
    except ImportError as e:
        raise ImportError(f"{url}: {e}") from None


def register(operation: str, handler: Callable) -> None:
    """Makes ``handler`` serve ``operation`` (``"reader"``, ``"writer"``, ``"save"``...) for URLs."""
    _HANDLERS[operation] = handler


def provide(module: str) -> None:
    """Names a module (``"tensorlist.remote"``) that registers handlers when imported, on the first dispatch."""
    if module not in _PROVIDERS:
        _PROVIDERS.append(module)


def dispatch(operation: str, url: str) -> Callable:
    """The registered handler of ``operation`` for ``url``, importing the providers first if none is.

    Raises:
        ImportError: no backend serves URLs (``tensorlist.remote`` failed to import).
    """
    handler = _HANDLERS.get(operation)
    if handler is None and _PROVIDERS:
        import importlib

        for module in list(_PROVIDERS):  # a concurrent dispatch waits on the import lock, then finds it imported
            try:
                importlib.import_module(module)
            except ImportError as e:
                raise ImportError(f"{url}: the URL backend {module} cannot be imported: {e}") from e
        handler = _HANDLERS.get(operation)
    if handler is None:
        raise ImportError(f"{url}: no URL backend is registered for {operation!r} "
                          "(tensorlist.remote serves URLs: pip install 'tensorlist[remote]')")
    return handler
