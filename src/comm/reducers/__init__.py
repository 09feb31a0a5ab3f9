"""The reduction algorithms of Table 1 and the neighbours' baselines, each a `Reducer` (src/comm/reducers/base.py);
`registry.make_reducer` builds one by name, `auto` picks one from the alpha-beta model.

Importing the package imports every module of it, so that each built-in reducer's `@register` has run before
anything reads the registry, whichever module was imported first."""
import importlib as _importlib
import pkgutil as _pkgutil

for _module in _pkgutil.iter_modules(__path__):
    _importlib.import_module(f"{__name__}.{_module.name}")
