"""A user's code named in the run config by a dotted path (reward.functions, env.name, metrics.sinks,
weight_sync.strategy, rollout.mode): split the path and import its module, so that every key reports a module that
cannot be imported, or that raises while importing, the same way: as a ValueError naming the key (the config's
`validate` turns it into a ConfigError before any actor starts).

    module_name, attr = split_dotted("pkg.module:Class")   # ("pkg.module", "Class"); "pkg.module.Class" too
    module = import_user_module(module_name, "env.name='pkg.module:Class'")
"""
from __future__ import annotations

import importlib
from types import ModuleType
from typing import Optional


def split_dotted(path: str) -> Optional[tuple[str, str]]:
    """(module, attribute) of "pkg.module:attr" (the attribute may be dotted) or "pkg.module.attr"; None for a
    name without a module part."""
    if ":" in path:
        module, attr = path.split(":", 1)
        return module, attr
    if "." in path:
        module, attr = path.rsplit(".", 1)
        return module, attr
    return None


def import_user_module(module_name: str, where: str, hint: str = "") -> ModuleType:
    """Import `module_name` for the config value `where` (e.g. "env.name='pkg.mod:Env'").

    Raises ValueError "<where>: cannot import module '<module_name>' (<error>)[: <hint>]" for an ImportError (a
    missing module or one of its imports; `hint`: what else the key accepts), and "<where>: importing '<module_name>' raised <Type>: <error>" for anything else its
    code raised while importing (chained, so the traceback is kept)."""
    try:
        return importlib.import_module(module_name)
    except ImportError as e:
        tail = f": {hint}" if hint else ""
        error = ValueError(f"{where}: cannot import module {module_name!r} ({e}){tail}")
        if e.name is not None and module_name.startswith(e.name):
            raise error from None  # the module itself (or its package) is missing: nothing more to show
        raise error from e  # an import inside the user's module failed: keep its traceback
    except Exception as e:  # noqa: BLE001 - whatever the user's module raised while importing
        raise ValueError(f"{where}: importing {module_name!r} raised {type(e).__name__}: {e}") from e
