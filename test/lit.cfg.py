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

# A sanitized build (EKKA_SANITIZE, utils/run-tests --sanitize): Ekka's code
# has ASan and UBSan, Python and the other programs a test runs have not.
# ASan's runtime must be the first library a process loads, so it is
# preloaded into every one (with the C++ library, see CMakeLists.txt): a
# Python that loads Ekka's runtime then finds it there. Options, added to
# those of the environment (lit passes ASAN_OPTIONS, LSAN_OPTIONS and
# UBSAN_OPTIONS through; utils/run-tests --sanitize sets them):
# - detect_leaks=0: CPython and torch leave thousands of blocks unreachable
#   at exit, which LeakSanitizer cannot tell from Ekka's through their
#   frameless stacks, and Ekka's tools pass their environment on to the
#   Pythons they start (the unittests keep leak detection);
# - verify_asan_link_order=0: ekka-trace preloads its runtime ahead of an
#   inherited LD_PRELOAD (a C++ program's tracing, native.test), so ASan's
#   runtime comes second; it is still loaded before anything that
#   allocates, and the runtime defines no function ASan intercepts.
# `UNSUPPORTED: asan` marks a test that cannot run so, with its reason.
if config.ekka_sanitize_preload:
    config.available_features.add("asan")
    config.environment["LD_PRELOAD"] = os.pathsep.join(
        p for p in [config.ekka_sanitize_preload, config.environment.get("LD_PRELOAD")] if p)
    config.environment["ASAN_OPTIONS"] = ":".join(
        o for o in [config.environment.get("ASAN_OPTIONS"), "detect_leaks=0",
                    "verify_asan_link_order=0"] if o)

# `%no-asan-segv-handler COMMAND`: COMMAND's processes take SIGSEGV as a
# plain build's do (the kernel's default action, exit 139), not through
# ASan's handler (a report and an abort, exit 134): for a test of a crash
# in the traced program's own code, not in Ekka's. Empty unless sanitized.
config.substitutions.append(
    ("%no-asan-segv-handler",
     "env ASAN_OPTIONS=" + config.environment["ASAN_OPTIONS"] + ":handle_segv=0"
     if config.ekka_sanitize_preload else ""))

config.substitutions.append(("%python", config.python_executable))
# Where the build found Python's headers, the shim's module calls take the
# runtime's Python binding (binding.test compares it with torch.ops).
if getattr(config, "ekka_python_binding", False):
    config.available_features.add("python-binding")
config.substitutions.append(("%ekka-python", os.path.join(config.ekka_src_root, "python")))
# chmod 000 stops everyone but root: what an unreadable file does is checked
# where it is unreadable (`%if non-root`).
if os.geteuid() != 0:
    config.available_features.add("non-root")
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
# No raw ESC or BEL in the files named: what came from hostile input left
# Ekka escaped.
config.substitutions.append(
    ("%no-control-bytes", "{0} {1}".format(
        config.python_executable,
        os.path.join(config.ekka_src_root, "utils", "lit", "no-control-bytes.py"))))

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
    # Three times as long with the sanitizers, which slow Ekka's code and
    # Python's allocations.
    config.maxIndividualTestTime = 900 if "asan" in config.available_features else 300
except ImportError:
    lit_config.warning("psutil is missing: no per-test timeout")
