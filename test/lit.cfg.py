# lit configuration for Ekka's tool tests: each RUN line is a user's command,
# each CHECK line what the user expects to see.
import os

import lit.formats

config.name = "Ekka"
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".test"]
config.excludes = ["Inputs"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.ekka_obj_root, "test")

# Ekka's tools first, then LLVM's FileCheck, not and count.
config.environment["PATH"] = os.pathsep.join(
    [config.ekka_tools_dir, config.llvm_tools_dir, config.environment.get("PATH", "")])
# Progress bars only on a terminal; never inside lit.
config.environment["EKKA_PROGRESS"] = "0"
config.substitutions.append(("%python", config.python_executable))
# Where the build found Python's headers, the shim's module calls take the
# runtime's Python binding (binding.test compares it with torch.ops).
if getattr(config, "ekka_python_binding", False):
    config.available_features.add("python-binding")
config.substitutions.append(("%ekka-python", os.path.join(config.ekka_src_root, "python")))
config.substitutions.append(
    ("%ekka-runtime", os.path.join(config.ekka_obj_root, "lib", "libekka_runtime.so")))
# One side of a zoo case (utils/zoo/run_side.py), with the engine's kernels
# from this build.
config.substitutions.append(
    ("%zoo-side", "env EKKA_BUILD_DIR={1} {2} {0}/run_side.py".format(
        os.path.join(config.ekka_src_root, "utils", "zoo"), config.ekka_obj_root,
        config.python_executable)))
config.substitutions.append(
    ("%native-program", os.path.join(config.ekka_obj_root, "test", "bin", "ekka-native-program")))
config.substitutions.append(
    ("%native-indirect-program",
     os.path.join(config.ekka_obj_root, "test", "bin", "ekka-native-indirect-program")))
config.substitutions.append(
    ("%foreign-program", os.path.join(config.ekka_obj_root, "test", "bin", "ekka-foreign-program")))
config.substitutions.append(("%zoo-dir", os.path.join(config.ekka_src_root, "utils", "zoo")))
config.substitutions.append(
    ("%expect-exit", os.path.join(config.ekka_src_root, "utils", "lit", "expect-exit")))

# Chrome trace-event JSON checked against the format's rules and its trace.
config.substitutions.append(
    ("%check-trace-events", "{0} {1}".format(
        config.python_executable,
        os.path.join(config.ekka_src_root, "utils", "lit", "check-trace-events.py"))))
# A report as a person sees it, in headless Chromium (Debian's
# chromium-headless-shell, which utils/install-deps installs).
config.substitutions.append(
    ("%html-in-browser", "{0} {1}".format(
        config.python_executable,
        os.path.join(config.ekka_src_root, "utils", "lit", "html-in-browser.py"))))

# The real vLLM (utils/install-vllm, which utils/build runs): its Python,
# and the suite's own programs, test/vllm.
vllm_python_file = os.path.join(config.ekka_obj_root, "vllm-python")
if os.path.exists(vllm_python_file):
    with open(vllm_python_file) as f:
        vllm_python = f.read().strip()
    if os.access(vllm_python, os.X_OK):
        config.available_features.add("vllm")
        config.substitutions.append(("%vllm-python", vllm_python))
config.substitutions.append(("%vllm-dir", os.path.join(config.ekka_src_root, "utils", "vllm")))

# A test that hangs (a traced program waiting forever) fails on its own,
# with its name, instead of stalling the whole suite until ctest's timeout.
try:
    import psutil  # noqa: F401  lit needs it to kill a test's process tree
    config.maxIndividualTestTime = 300
except ImportError:
    lit_config.warning("psutil is missing: no per-test timeout")
