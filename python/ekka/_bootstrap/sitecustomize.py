# Put first on PYTHONPATH by ekka-trace: every Python process the traced
# program starts installs Ekka's module hooks. torch is imported only when the
# program itself uses it.
import os
import sys

if os.environ.get("EKKA_TRACE_DIR"):
    def _install(torch):
        """Installs the hooks right after the program imports torch."""
        try:
            import ekka.trace
            ekka.trace.install_from_environment()
        except Exception as e:  # never break the traced program
            print(f"ekka-trace: error: could not install hooks: {e}", file=sys.stderr)

    try:
        from ekka._imports import when_imported
        when_imported("torch", _install)
    except Exception as e:
        print(f"ekka-trace: error: could not install hooks: {e}", file=sys.stderr)


def _run_theirs():
    """This file shadows any other sitecustomize (ekka-trace puts its
    directory first on PYTHONPATH): the next one on sys.path, the
    environment's or the program's own, runs too, as Python would have run
    it, and is then the `sitecustomize` module. An error in it is said as
    Python's site says one and does not stop the program."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    ours = sys.modules.get("sitecustomize")
    sys.modules["sitecustomize"] = module
    try:
        spec.loader.exec_module(module)
    except Exception as error:
        sys.modules["sitecustomize"] = ours
        print(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n"
              f"{type(error).__name__}: {error}", file=sys.stderr)


_run_theirs()
