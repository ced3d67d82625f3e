"""Code run right after a module's import: the shim installs its hooks
once the program has imported torch (sitecustomize), and registers what
Dynamo traces in place of the hooks in C once torch._dynamo is imported
(ekka.trace). Standard library only: every Python process that
ekka-trace starts imports this at its start."""
import sys
import threading

# The modules waited for: name -> the actions to run once it has run.
_pending = {}


def when_imported(name, action):
    """Calls action(module) once the module `name` has run: now if it is
    imported, else right after its import. Asking whether it could be
    imported (importlib.util.find_spec, as transformers asks whether torch
    is there) changes nothing; each action runs once, when the module
    itself has run."""
    module = sys.modules.get(name)
    if module is not None:
        action(module)
        return
    if name not in _pending:
        _pending[name] = []
        sys.meta_path.insert(0, _AfterImport(name))
    _pending[name].append(action)


def _ran(module):
    """A module waited for has run: its actions, once."""
    for action in _pending.pop(getattr(module, "__name__", None), ()):
        action(module)


class _AfterImport:
    """A finder for one module name: it answers with the spec the finders
    after it find, whose loader runs the module, then the actions waiting
    for it. Once they have run it answers nothing; it stays on
    sys.meta_path (taking itself off while another thread walks the list
    could make that thread miss a finder). While it asks the others, it
    answers nothing itself: a finder that asks importlib again, or another
    such finder for the same name, does not bring it back."""

    def __init__(self, name):
        self.name = name
        self.local = threading.local()

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name or fullname not in _pending or \
                getattr(self.local, "asking", False):
            return None
        self.local.asking = True
        try:
            spec = None
            for finder in list(sys.meta_path):
                find = getattr(finder, "find_spec", None)
                if finder is self or find is None:
                    continue
                spec = find(fullname, path, target)
                if spec is not None:
                    break
        finally:
            self.local.asking = False
        loader = getattr(spec, "loader", None)
        original = getattr(loader, "exec_module", None)
        # A loader patched already (one that serves several modules, as
        # zipimport does) runs the actions of whichever module it ran.
        if original is None or getattr(original, "_ekka_after_import", False):
            return spec

        def exec_module(module):
            original(module)
            _ran(module)

        exec_module._ekka_after_import = True
        try:
            loader.exec_module = exec_module
        except (AttributeError, TypeError):  # a loader that takes no attribute
            pass
        return spec
