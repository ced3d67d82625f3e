# Put first on PYTHONPATH by ekka-trace: every Python process the traced
# program starts installs Ekka's module hooks. torch is imported only when the
# program itself uses it.
import os
import sys

# Once per process: a sitecustomize that imports the next one may run this
# file again.
if os.environ.get("EKKA_TRACE_DIR") and not sys.__dict__.get("_ekka_sitecustomize_ran"):
    def _could_not(error):  # never breaks the traced program
        print(f"ekka-trace: error: could not install hooks: {error}", file=sys.stderr)

    def _install(torch):
        """Installs the hooks right after the program imports torch."""
        try:
            import ekka.trace
            ekka.trace.install_from_environment()
        except Exception as e:
            _could_not(e)

    try:
        from ekka._imports import when_imported
        when_imported("torch", _install)
    except Exception as e:
        _could_not(e)


def _run_theirs():
    """This file shadows any other sitecustomize (ekka-trace puts its
    directory first on PYTHONPATH): the next one on sys.path, the
    environment's or the program's own, runs too, as Python would have run
    it, and is then the `sitecustomize` module. An error in it is said as
    Python's site says one and does not stop the program. A sitecustomize
    that imports the next one itself (ddtrace's does) finds this one again:
    each file runs once, so this one then runs the one after."""
    import importlib.machinery
    import importlib.util

    ran = sys.__dict__.setdefault("_ekka_sitecustomize_ran", set())
    ran.add(os.path.realpath(__file__))
    for entry in list(sys.path):
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", [entry])
        if spec is None or spec.loader is None or not spec.origin:
            continue
        origin = os.path.realpath(spec.origin)
        if origin in ran:
            continue
        ran.add(origin)
        module = importlib.util.module_from_spec(spec)
        before = sys.modules.get("sitecustomize")
        sys.modules["sitecustomize"] = module
        try:
            spec.loader.exec_module(module)
        except Exception as error:
            if before is not None:
                sys.modules["sitecustomize"] = before
            print(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n"
                  f"{type(error).__name__}: {error}", file=sys.stderr)
        return


_run_theirs()
