# Put first on PYTHONPATH by ekka-trace: every Python process the traced
# program starts installs Ekka's module hooks. torch is imported only when the
# program itself uses it.
import os
import sys

if os.environ.get("EKKA_TRACE_DIR"):
    class _EkkaFinder:
        """Installs the hooks right after the program imports torch."""

        def find_spec(self, name, path=None, target=None):
            if name != "torch":
                return None
            sys.meta_path.remove(self)
            import importlib.util
            spec = importlib.util.find_spec("torch")
            if spec is None or spec.loader is None:
                return spec
            loader = spec.loader
            original = loader.exec_module

            def exec_module(module):
                original(module)
                try:
                    import ekka.trace
                    ekka.trace.install_from_environment()
                except Exception as e:  # never break the traced program
                    print(f"ekka-trace: error: could not install hooks: {e}", file=sys.stderr)

            loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _EkkaFinder())
