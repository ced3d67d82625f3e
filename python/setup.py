"""Builds Ekka's tracer runtime against the torch of the environment it is
installed into, the convention of torch C++ extensions:

    pip install --no-build-isolation EKKA_SRC/python

(`--no-build-isolation`, so that the build sees this environment's torch.)
The runtime goes into EKKA_SRC's build directory as `torch-VERSION/`
(or $EKKA_BUILD_DIR's), where ekka-trace finds it for every program that
runs this torch, and into the installed package (`ekka/_runtime/`). It
needs cmake, ninja and LLVM 19's headers and static Support library
(Debian's llvm-19-dev), as Ekka's own build does. EKKA_CUDA=OFF leaves out
the runtime's CUDA statistics kernel (a CPU-only torch has none anyway).
"""
import os
import shutil
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)


class BuildRuntime(build_py):
    def run(self):
        super().run()
        try:
            import torch
        except ImportError:
            # An editable install that registers the vLLM plugin only, or a
            # build isolated from the environment's torch: no runtime.
            print("ekka: no torch to build the tracer's runtime against: not built (pip "
                  "install --no-build-isolation in an environment with torch builds it)",
                  file=sys.stderr)
            return
        version = str(torch.__version__)
        build_dir = os.path.join(os.environ.get("EKKA_BUILD_DIR", os.path.join(SRC, "build")),
                                 f"torch-{version}")
        if not os.path.exists(os.path.join(build_dir, "build.ninja")):
            configure = ["cmake", "-S", SRC, "-B", build_dir, "-G", "Ninja",
                         "-DCMAKE_BUILD_TYPE=Release", "-DEKKA_TRACER_ONLY=ON",
                         f"-DEKKA_CUDA={os.environ.get('EKKA_CUDA', 'ON')}",
                         f"-DEKKA_PYTHON={sys.executable}"]
            if shutil.which("ccache"):
                configure += ["-DCMAKE_CXX_COMPILER_LAUNCHER=ccache",
                              "-DCMAKE_C_COMPILER_LAUNCHER=ccache"]
            subprocess.check_call(configure)
        subprocess.check_call(["cmake", "--build", build_dir])
        runtime = os.path.join(self.build_lib, "ekka", "_runtime")
        os.makedirs(runtime, exist_ok=True)
        for name in ("libekka_runtime.so", "libekka_runtime.torch-version"):
            shutil.copy2(os.path.join(build_dir, "lib", name), runtime)


setup(cmdclass={"build_py": BuildRuntime})
