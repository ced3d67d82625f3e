# A sitecustomize that runs the next one on sys.path itself, as ddtrace's
# bootstrap does: its directory off sys.path, its module out of
# sys.modules, `import sitecustomize`, then both back.
import os
import sys

os.environ["CHAIN"] = "ran"
here = os.path.dirname(os.path.abspath(__file__))
if here in sys.path:
    index = sys.path.index(here)
    del sys.path[index]
    mine = sys.modules.pop("sitecustomize")
    try:
        import sitecustomize  # noqa: F401
    except ImportError:
        sys.modules["sitecustomize"] = mine
    finally:
        sys.path.insert(index, here)
