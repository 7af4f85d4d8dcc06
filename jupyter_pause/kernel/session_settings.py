"""The built-in session settings, registered in the order a restore applies them.

environment (working directory, ``sys.path``, environment variables) -> imports -> IPython
(extensions, ``%config``) -> libraries (torch, numpy, pandas, warnings, matplotlib) ->
[the variables] -> magics the notebook registered.

A library's settings are captured only when the notebook imported it (never imported here
for that); applying sets only what differs from the restoring kernel, so nothing is touched
needlessly.
"""

from __future__ import annotations

import importlib
import os
import sys
import types
import warnings
from typing import Any

from traitlets.config import Application, Config

from . import shown_warnings
from .capture import Import
from .session import Outcome, SessionContext, SessionSetting, register

# -- environment ------------------------------------------------------------------------------


def _capture_cwd(context: SessionContext) -> dict[str, str | None]:
    """The working directory, relative to the notebook's folder when it is that folder or
    under it (a moved or copied notebook works in its own folder again), else absolute."""
    cwd = os.getcwd()
    home = context.baseline.home
    inside = bool(home) and os.path.commonpath([cwd, home]) == home
    return {"path": cwd, "relative": os.path.relpath(cwd, home) if inside else None}


def _apply_cwd(state: str | dict[str, str | None], context: SessionContext) -> None:
    if isinstance(state, str):  # a checkpoint from before working directories were relative
        state = {"path": state, "relative": None}
    relative, home = state["relative"], context.baseline.home
    if relative is not None and home:
        wanted = os.path.normpath(os.path.join(home, relative))
        where = f"{relative} in the notebook's folder {home}"
    else:
        wanted = where = str(state["path"])
    if os.getcwd() != wanted:
        if not os.path.isdir(wanted):
            raise FileNotFoundError(f"{where} no longer exists; the kernel stays in {os.getcwd()}")
        os.chdir(wanted)


def _capture_sys_path(context: SessionContext) -> list[str]:
    return [entry for entry in sys.path if isinstance(entry, str)]


def _apply_sys_path(saved: list[str], context: SessionContext) -> Outcome:
    """Entries the restoring kernel lacks go back where they were (a notebook's ``src/``
    inserted first stays first); its own extra entries stay."""
    added = []
    for index, entry in enumerate(saved):
        if entry not in sys.path:
            sys.path.insert(min(index, len(sys.path)), entry)
            added.append(entry)
    if added:
        importlib.invalidate_caches()
    return ([f"sys.path (+{len(added)})"] if added else ["sys.path"]), {}


#: Set per process by whoever starts the kernel, never carried over: the session's identity
#: (Jupyter), the admin's policy (this extension) and the GPUs the resumed kernel was given.
_LAUNCH_ONLY = ("JPY_", "JUPYTER_PAUSE_", "CUDA_VISIBLE_DEVICES")


def _capture_environ(context: SessionContext) -> dict[str, Any] | None:
    before = context.baseline.environ
    changed = {
        key: value
        for key, value in os.environ.items()
        if before.get(key) != value and not key.startswith(_LAUNCH_ONLY)
    }
    removed = sorted(key for key in before if key not in os.environ)
    removed = [key for key in removed if not key.startswith(_LAUNCH_ONLY)]
    return {"set": changed, "removed": removed} if changed or removed else None


def _apply_environ(state: dict[str, Any], context: SessionContext) -> Outcome:
    for key, value in state["set"].items():
        os.environ[key] = value
    for key in state["removed"]:
        os.environ.pop(key, None)
    names = sorted(state["set"]) + [f"-{key}" for key in state["removed"]]
    return [f"environment variables ({', '.join(names)})"], {}


register(SessionSetting("working directory", "environment", _capture_cwd, _apply_cwd))
register(SessionSetting("sys.path", "environment", _capture_sys_path, _apply_sys_path))
register(SessionSetting("environment variables", "environment", _capture_environ, _apply_environ))

# -- imports ----------------------------------------------------------------------------------


def _capture_imports(context: SessionContext) -> list[Import] | None:
    return list(context.imports) or None


def _apply_imports(imports: list[Import], context: SessionContext) -> Outcome:
    """Import again in the original order; a module that no longer imports is named."""
    restored, failed = [], {}
    for imp in imports:
        try:
            value: Any = importlib.import_module(imp.module)
            for part in (imp.attribute or "").split(".") if imp.attribute else ():
                value = getattr(value, part)
        except Exception as err:  # ImportError, or any error the module raised on import
            failed[imp.statement()] = f"{type(err).__name__}: {err}"
            continue
        context.namespace[imp.name] = value
        restored.append(imp.name)
    return restored, failed


register(SessionSetting("imports", "imports", _capture_imports, _apply_imports))

# -- IPython ----------------------------------------------------------------------------------


def _capture_extensions(context: SessionContext) -> list[str] | None:
    manager = getattr(context.shell, "extension_manager", None)
    if manager is None:
        return None
    own = context.baseline.extensions | {"jupyter_pause"}
    return sorted(name for name in manager.loaded if name not in own) or None


def _apply_extensions(names: list[str], context: SessionContext) -> Outcome:
    manager = context.shell.extension_manager
    restored, failed = [], {}
    for name in names:
        if name in manager.loaded:
            continue
        try:
            answer = manager.load_extension(name)
        except Exception as err:
            failed[f"extension {name}"] = f"{type(err).__name__}: {err}"
            continue
        if answer == "no load function":
            failed[f"extension {name}"] = "it has no load_ipython_extension function"
        else:
            restored.append(f"extension {name}")
    return restored, failed


_AUTORELOAD_FLAGS = ("enabled", "check_all", "autoload_obj")


def _autoreloader(shell: Any) -> Any:
    magics = getattr(getattr(shell, "magics_manager", None), "registry", {}).get("AutoreloadMagics")
    return getattr(magics, "_reloader", None)


def _capture_autoreload(context: SessionContext) -> dict[str, bool] | None:
    reloader = _autoreloader(context.shell)
    if reloader is None:
        return None
    return {flag: bool(getattr(reloader, flag, False)) for flag in _AUTORELOAD_FLAGS}


def _apply_autoreload(flags: dict[str, bool], context: SessionContext) -> None:
    reloader = _autoreloader(context.shell)
    if reloader is None:
        raise RuntimeError("the autoreload extension did not load")
    for flag, value in flags.items():
        setattr(reloader, flag, value)


def _plain(value: Any) -> bool:
    """Values %config can hold that mean the same in another process."""
    if isinstance(value, str | int | float | bool | type(None)):
        return True
    if isinstance(value, list | tuple | set | frozenset):
        return all(_plain(item) for item in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return False


#: Config that describes where this kernel's own files are, not how the notebook runs.
_NOT_CARRIED = {("Checkpointer", "store_root")}


def _capture_config(context: SessionContext) -> dict[str, dict[str, Any]] | None:
    """What ``%config`` (and the kernel's config files) set on the shell's configurables.

    ``%config Class.trait = value`` merges into every configurable's ``config``; the sections
    naming a configurable's own class (or a base) with plain values are what to carry over.
    """
    configurables = getattr(context.shell, "configurables", None)
    if not configurables:
        return None
    saved: dict[str, dict[str, Any]] = {}
    for configurable in configurables:
        if isinstance(configurable, Application):
            continue  # the kernel app: its connection file and ports belong to this process
        traits = configurable.class_traits(config=True)
        for cls in type(configurable).__mro__:
            if cls.__name__ not in configurable.config:
                continue
            for trait, value in configurable.config[cls.__name__].items():
                if trait in traits and _plain(value) and (cls.__name__, trait) not in _NOT_CARRIED:
                    saved.setdefault(cls.__name__, {})[trait] = value
    return saved or None


def _apply_config(saved: dict[str, dict[str, Any]], context: SessionContext) -> Outcome:
    config = Config(saved)
    changed: set[str] = set()
    failed = {}
    for configurable in context.shell.configurables:
        if isinstance(configurable, Application):
            continue
        names = {cls.__name__ for cls in type(configurable).__mro__}
        for cls, traits in saved.items():
            if cls in names:
                changed.update(
                    f"%config {cls}.{trait}"
                    for trait, value in traits.items()
                    if getattr(configurable, trait, value) != value
                )
        try:
            configurable.update_config(config)
        except Exception as err:  # one configurable refusing a value spoils nothing else
            failed[f"%config {type(configurable).__name__}"] = f"{type(err).__name__}: {err}"
    context.shell.config.merge(config)  # configurables made later (InlineBackend) read it
    return sorted(changed), failed


register(SessionSetting("extensions", "settings", _capture_extensions, _apply_extensions))
register(SessionSetting("autoreload mode", "settings", _capture_autoreload, _apply_autoreload))
register(SessionSetting("%config", "settings", _capture_config, _apply_config))

# -- libraries --------------------------------------------------------------------------------


def _set_changed(
    labels_prefix: str, wanted: dict[str, Any], current: dict[str, Any], setter: Any
) -> Outcome:
    """Apply ``setter(name, value)`` for each value that differs; report each failure.

    A name missing from ``current`` (which may hold only what differs from the defaults) is
    set whatever its value: ``None`` is a value (pandas ``display.max_rows``), not "missing".
    """
    failed = {}
    for name, value in wanted.items():
        if name in current and current[name] == value:
            continue
        try:
            setter(name, value)
        except Exception as err:
            failed[f"{labels_prefix} {name}"] = f"{type(err).__name__}: {err}"
    return [labels_prefix], failed


def _torch_state(torch: Any) -> dict[str, Any]:
    cudnn = torch.backends.cudnn
    options = torch._tensor_str.PRINT_OPTS  # what torch.set_printoptions sets
    return {
        "default_device": str(torch.get_default_device()),
        "printoptions": {
            name: getattr(options, name)
            for name in ("precision", "threshold", "edgeitems", "linewidth", "sci_mode")
        },
        "default_dtype": str(torch.get_default_dtype()).removeprefix("torch."),
        "grad_enabled": torch.is_grad_enabled(),
        "deterministic": (
            torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(),
        ),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cudnn.benchmark": cudnn.benchmark,
        "cudnn.deterministic": cudnn.deterministic,
        "cudnn.enabled": cudnn.enabled,
    }


def _imported(name: str, needs: str) -> Any:
    """The library when the notebook imported it: never imported here just to read settings
    (a half-initialised module, imported while its own import fails, lacks ``needs``)."""
    module = sys.modules.get(name)
    return module if module is not None and hasattr(module, needs) else None


def _capture_torch(context: SessionContext) -> dict[str, Any] | None:
    torch = _imported("torch", "get_default_dtype")
    return None if torch is None else _torch_state(torch)


def _apply_torch(state: dict[str, Any], context: SessionContext) -> Outcome:
    import torch

    def put(name: str, value: Any) -> None:
        if name == "default_device":
            torch.set_default_device(None if value == "cpu" else value)
        elif name == "printoptions":
            torch.set_printoptions(**value)
        elif name == "default_dtype":
            torch.set_default_dtype(getattr(torch, value))
        elif name == "grad_enabled":
            torch.set_grad_enabled(value)
        elif name == "deterministic":
            torch.use_deterministic_algorithms(value[0], warn_only=value[1])
        elif name == "float32_matmul_precision":
            torch.set_float32_matmul_precision(value)
        else:
            setattr(torch.backends.cudnn, name.removeprefix("cudnn."), value)

    return _set_changed("torch", state, _torch_state(torch), put)


def _capture_numpy(context: SessionContext) -> dict[str, Any] | None:
    numpy = _imported("numpy", "get_printoptions")
    return None if numpy is None else {"print": numpy.get_printoptions(), "errors": numpy.geterr()}


def _apply_numpy(state: dict[str, Any], context: SessionContext) -> Outcome:
    import numpy

    restored, failed = [], {}
    for label, wanted, current, setter in (
        ("numpy print options", state["print"], numpy.get_printoptions(), numpy.set_printoptions),
        ("numpy error handling", state["errors"], numpy.geterr(), numpy.seterr),
    ):
        if wanted == current:
            restored.append(label)
            continue
        try:
            setter(**wanted)
        except Exception as err:
            failed[label] = f"{type(err).__name__}: {err}"
        else:
            restored.append(label)
    return restored, failed


def _pandas_changed(pandas: Any) -> dict[str, Any]:
    from pandas._config import config  # the public API lists options only by printing them

    changed = {}
    for key, option in config._registered_options.items():
        if key in config._deprecated_options:
            continue
        value = pandas.get_option(key)
        if value is not option.defval:
            try:
                different = bool(value != option.defval)
            except Exception:  # a value with an unusual __eq__: carry it over to be sure
                different = True
            if different:
                changed[key] = value
    return changed


def _capture_pandas(context: SessionContext) -> dict[str, Any] | None:
    pandas = _imported("pandas", "get_option")
    return None if pandas is None else (_pandas_changed(pandas) or None)


def _apply_pandas(options: dict[str, Any], context: SessionContext) -> Outcome:
    import pandas

    return _set_changed("pandas options", options, _pandas_changed(pandas), pandas.set_option)


def _capture_warnings(context: SessionContext) -> list[Any]:
    return [(*entry[:2], _category_by_name(entry[2]), *entry[3:]) for entry in warnings.filters]


def _category_by_name(category: Any) -> Any:
    """A library's warning category as (module, qualified name): unpickling the class would
    import its module, and libraries add filters of their own when imported (sympy, which
    torch's optimizers import on first use, adds one), so a restore would import sympy
    (0.5-1.5 s here) just to set a filter that sympy sets again when it is imported."""
    module = getattr(category, "__module__", "builtins")
    if module in ("builtins", "__main__"):
        return category
    return (module, category.__qualname__)


def _category(category: Any) -> type | None:
    """The class a filter names; None when its module is not imported (its own import adds
    its filters again) or no longer has it."""
    if not isinstance(category, tuple):
        return category
    found: Any = sys.modules.get(category[0])
    for part in category[1].split("."):
        found = getattr(found, part, None)
    return found if isinstance(found, type) else None


def _apply_warnings(entries: list[Any], context: SessionContext) -> None:
    filters = [
        (*entry[:2], category, *entry[3:])
        for entry in entries
        if (category := _category(entry[2])) is not None
    ]
    if warnings.filters != filters:
        warnings.filters[:] = filters
        mutated = getattr(warnings, "_filters_mutated", None)
        if mutated is not None:  # the C module caches the filters until told
            mutated()


def _matplotlib_state(matplotlib: Any) -> dict[str, Any]:
    params = matplotlib.rcParams
    original = matplotlib.rcParamsOrig
    # "backend" is read without resolving it (that would import pyplot and pick one).
    changed = {
        key: params[key] for key in params if key != "backend" and params[key] != original[key]
    }
    return {"backend": params._get_backend_or_none(), "rc": changed}


def _capture_matplotlib(context: SessionContext) -> dict[str, Any] | None:
    matplotlib = _imported("matplotlib", "rcParamsOrig")
    return None if matplotlib is None else _matplotlib_state(matplotlib)


def _apply_matplotlib(state: dict[str, Any], context: SessionContext) -> Outcome:
    import matplotlib

    failed = {}
    backend = state["backend"]
    if backend is not None and matplotlib.rcParams._get_backend_or_none() != backend:
        try:
            matplotlib.use(backend)
        except Exception as err:
            failed["matplotlib backend"] = f"{type(err).__name__}: {err}"
    current = _matplotlib_state(matplotlib)["rc"]
    _labels, rc_failed = _set_changed(
        "matplotlib rcParams", state["rc"], current, matplotlib.rcParams.__setitem__
    )
    failed.update(rc_failed)
    return ["matplotlib"], failed


def _capture_sklearn(context: SessionContext) -> dict[str, Any] | None:
    """scikit-learn's global configuration (``set_config``: metadata routing, pandas output,
    ``assume_finite``...) as the notebook's thread sees it (cells run in the main thread)."""
    sklearn = _imported("sklearn", "get_config")
    return None if sklearn is None else dict(sklearn.get_config())


def _apply_sklearn(config: dict[str, Any], context: SessionContext) -> Outcome:
    import sklearn

    def put(name: str, value: Any) -> None:
        sklearn.set_config(**{name: value})

    return _set_changed("scikit-learn config", config, dict(sklearn.get_config()), put)


#: JAX flags that describe this process's devices, not how the notebook computes.
_JAX_NOT_CARRIED = frozenset({"jax_platforms", "jax_platform_name", "jax_default_device"})


def _jax_flags(jax: Any) -> dict[str, Any]:
    """The ``jax.config`` flags (``jax_enable_x64``, matmul precision...), global values. JAX
    does not say which the notebook set (defaults come from the environment too): all are
    carried, and a restore sets those that differ."""
    flags = {}
    for name, holder in jax.config._value_holders.items():
        if name in _JAX_NOT_CARRIED or not hasattr(holder, "get_global"):
            continue
        value = holder.get_global()
        if _plain(value):
            flags[name] = value
    return flags


def _capture_jax(context: SessionContext) -> dict[str, Any] | None:
    jax = _imported("jax", "config")
    return None if jax is None else (_jax_flags(jax) or None)


def _apply_jax(flags: dict[str, Any], context: SessionContext) -> Outcome:
    import jax

    return _set_changed("jax.config", flags, _jax_flags(jax), jax.config.update)


def _tqdm_pandas(pandas: Any) -> Any:
    """The tqdm class ``tqdm.pandas()`` registered on pandas (``progress_apply``), if any."""
    function = getattr(pandas.DataFrame, "progress_apply", None)
    for cell in getattr(function, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:
            continue
        if isinstance(value, type) and value.__module__.startswith("tqdm"):
            return value
    return None


def _capture_tqdm(context: SessionContext) -> tuple[str, str] | None:
    pandas = _imported("pandas", "DataFrame")
    found = None if pandas is None else _tqdm_pandas(pandas)
    return None if found is None else (found.__module__, found.__qualname__)


def _apply_tqdm(name: tuple[str, str], context: SessionContext) -> Outcome:
    import pandas

    if _tqdm_pandas(pandas) is None:
        module = importlib.import_module(name[0])
        getattr(module, name[1]).pandas()
    return [f"tqdm.pandas() ({name[0]})"], {}


register(SessionSetting("scikit-learn config", "settings", _capture_sklearn, _apply_sklearn))
register(SessionSetting("jax.config", "settings", _capture_jax, _apply_jax))
register(SessionSetting("tqdm.pandas", "settings", _capture_tqdm, _apply_tqdm))
register(SessionSetting("torch", "settings", _capture_torch, _apply_torch))
register(SessionSetting("numpy", "settings", _capture_numpy, _apply_numpy))
register(SessionSetting("pandas options", "settings", _capture_pandas, _apply_pandas))
register(
    SessionSetting("warnings filters", "settings", _capture_warnings, _apply_warnings, quiet=False)
)
register(SessionSetting("matplotlib", "settings", _capture_matplotlib, _apply_matplotlib))

# -- after the variables ----------------------------------------------------------------------


def _capture_magics(context: SessionContext) -> list[tuple[str, str, Any]] | None:
    """Line and cell magics made from notebook functions (``@register_cell_magic``)."""
    manager = getattr(context.shell, "magics_manager", None)
    if manager is None:
        return None
    found = [
        (kind, name, function)
        for kind, table in manager.magics.items()
        for name, function in table.items()
        if isinstance(function, types.FunctionType) and function.__globals__ is context.namespace
    ]
    return found or None


def _apply_magics(magics: list[tuple[str, str, Any]], context: SessionContext) -> Outcome:
    labels = []
    for kind, name, function in magics:
        context.shell.register_magic_function(function, kind, name)
        labels.append(("%%" if kind == "cell" else "%") + name)
    return labels, {}


register(SessionSetting("magics", "settings", _capture_magics, _apply_magics, after_variables=True))


# -- last: nothing may change the warnings filters after it -----------------------------------


def _capture_shown(context: SessionContext) -> dict[str, Any] | None:
    return shown_warnings.capture()


def _apply_shown(state: dict[str, Any], context: SessionContext) -> Outcome:
    return [f"warnings already shown ({shown_warnings.apply(state)})"], {}


register(
    SessionSetting(
        "warnings already shown",
        "settings",
        _capture_shown,
        _apply_shown,
        after_variables=True,
        quiet=False,  # silencing would change the filters, and so forget what it restores
    )
)
