"""Code run right after a module's import: the shim installs its hooks
once the program has imported torch (sitecustomize), and registers what
Dynamo traces in place of the hooks in C once torch._dynamo is imported
(ekka.trace). Standard library only: every Python process that
ekka-trace starts imports this at its start."""
import sys


def when_imported(name, action):
    """Calls action(module) once the module `name` has run: now if it is
    imported, else right after its import. Asking whether it could be
    imported (importlib.util.find_spec, as transformers asks whether torch
    is there) changes nothing; the action runs once, when the module
    itself has run."""
    module = sys.modules.get(name)
    if module is not None:
        action(module)
    else:
        sys.meta_path.insert(0, _AfterImport(name, action))


class _AfterImport:
    """A finder for one module name: it answers with the spec the finders
    after it find, whose loader runs the module, then the action. Once the
    action has run it answers nothing; it stays on sys.meta_path (taking
    itself off while another thread walks the list could make that thread
    miss a finder)."""

    def __init__(self, name, action):
        self.name = name
        self.action = action
        self.done = False

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name or self.done:
            return None
        spec = None
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        loader = getattr(spec, "loader", None)
        original = getattr(loader, "exec_module", None)
        if original is None or getattr(original, "_ekka_after_import", False):
            return spec

        def exec_module(module):
            original(module)
            # A loader may serve other modules too (zipimport): only this one.
            if module.__name__ == self.name and not self.done:
                self.done = True
                self.action(module)

        exec_module._ekka_after_import = True
        try:
            loader.exec_module = exec_module
        except (AttributeError, TypeError):  # a loader that takes no attribute
            pass
        return spec
