"""Import a user's modules that register density families (or methods) before a command runs.

A family written with :func:`ccu.register_density` exists only in the process that imported its
module. ``ccu ... --plugin MODULE`` (repeatable), the workflow's config key ``plugins`` and
``ccu compare-densities --plugin`` import such modules first, so that ``CCU-<name>`` trains,
loads and is attacked from the command line too. ``MODULE`` is a module name importable from the
current directory or ``PYTHONPATH`` (``my_densities``, ``pkg.densities``) or the path of a
``.py`` file (``densities/studentt.py``).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType


class PluginError(ValueError):
    """A plugin could not be imported (the message is one line and names it)."""


class PluginNotFoundError(PluginError, FileNotFoundError):
    """A plugin's file or module does not exist."""


def _looks_like_path(spec: str) -> bool:
    return spec.endswith(".py") or os.sep in spec or (os.altsep or os.sep) in spec


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def load_plugin(spec: str) -> ModuleType:
    """Import one plugin (a module name or a ``.py`` path); its decorators register its
    families. Importing the same plugin twice returns the module imported first."""
    if not isinstance(spec, str) or not spec.strip():
        raise PluginError(f"--plugin needs a module name or a .py file; got {spec!r}.")
    spec = spec.strip()
    if _looks_like_path(spec):
        path = Path(spec).expanduser().resolve()
        if not path.is_file():
            raise PluginNotFoundError(f"plugin file {spec} does not exist.")
        name = f"ccu_plugin_{path.stem}_{abs(hash(str(path))):x}"
        if name in sys.modules:
            return sys.modules[name]
        loader = importlib.util.spec_from_file_location(name, path)
        if loader is None or loader.loader is None:
            raise PluginError(f"plugin {spec} is not a Python file that can be imported.")
        module = importlib.util.module_from_spec(loader)
        sys.modules[name] = module
        try:
            loader.loader.exec_module(module)
        except Exception as exc:
            del sys.modules[name]
            raise PluginError(f"plugin {spec} failed to import: {_one_line(exc)}") from exc
        return module
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:  # the console script does not add it
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(spec)
    except ModuleNotFoundError as exc:
        if exc.name and spec.split(".")[0] == exc.name.split(".")[0]:
            raise PluginNotFoundError(
                f"plugin {spec!r}: no module of that name in the current directory or on "
                "PYTHONPATH (or pass the path of a .py file)."
            ) from exc
        raise PluginError(f"plugin {spec} failed to import: {_one_line(exc)}") from exc
    except Exception as exc:
        raise PluginError(f"plugin {spec} failed to import: {_one_line(exc)}") from exc


def load_plugins(specs) -> list[ModuleType]:
    """:func:`load_plugin` for each of ``specs`` (None or empty: nothing), in order."""
    if specs is None:
        return []
    if isinstance(specs, str):
        specs = [specs]
    return [load_plugin(s) for s in specs]


def code_identity(classes) -> list[dict] | None:
    """What identifies the code of a run's classes that live outside the ``ccu`` package (a
    plug-in's method, a user's density family): per class its name, the file it came from (its
    name, no machine path) and the sha256 of that file's source (of the class's own source when
    it was defined in a notebook cell). None when every class is the library's own (its
    version identifies it). A run records this in its config (:data:`ccu.store.results.PLUGIN_CODE`),
    so a run of edited plug-in code never reuses results of other code. The sha256 also covers
    the code the class leans on (:func:`_code_it_uses`): its base classes outside ``ccu`` and
    the modules loaded from its file's folder (a helper module beside the plug-in), whose
    names ``uses`` lists."""
    import hashlib
    import inspect

    out = []
    for cls in classes:
        module = getattr(cls, "__module__", "") or ""
        if module == "ccu" or module.startswith("ccu."):
            continue
        try:
            path = inspect.getsourcefile(cls)
            source = Path(path).read_bytes() if path and Path(path).is_file() else None
        except (TypeError, OSError):
            path, source = None, None
        if source is None:  # a notebook cell: the class's own source
            try:
                source = inspect.getsource(cls).encode()
            except (TypeError, OSError):
                source = repr(sorted(vars(cls))).encode()  # at least its attributes' names
        digest = hashlib.sha256(source)
        uses = _code_it_uses(cls, path)
        for other in uses:
            try:
                code = other.read_bytes()
            except OSError:  # removed since: what ran is not there to read
                code = b"(gone)"
            digest.update(b"\0" + other.name.encode() + b"\0" + code)
        record = {
            "class": cls.__qualname__,
            "file": Path(path).name if path else module,
            "sha256": digest.hexdigest(),
        }
        if uses:
            record["uses"] = [other.name for other in uses]
        out.append(record)
    return out or None


def _code_it_uses(cls, path) -> list[Path]:
    """The files besides ``path`` (``cls``'s own) whose code ``cls`` runs: the files of its base
    classes outside ``ccu``, and the modules loaded from ``path``'s folder (not installed
    packages), in sorted order. Written here: no library names the code a class depends on."""
    import inspect
    import sys

    own = Path(path).resolve() if path else None
    found = set()
    for base in cls.__mro__[1:]:
        module = getattr(base, "__module__", "") or ""
        if module in ("builtins", "ccu") or module.startswith(("ccu.", "torch")):
            continue
        try:
            where = inspect.getsourcefile(base)
        except (TypeError, OSError):
            continue
        if where and Path(where).is_file() and "site-packages" not in where:
            found.add(Path(where).resolve())
    if own is not None:
        for mod in list(sys.modules.values()):
            where = getattr(mod, "__file__", None)
            real = where and Path(where).is_absolute() and where.endswith(".py")  # not "<...>"
            if real and Path(where).resolve().parent == own.parent:
                found.add(Path(where).resolve())
    found.discard(own)
    return sorted(f for f in found if f.is_file())  # a module whose file is gone: nothing to read
