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
