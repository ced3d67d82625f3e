# Finds every dependency Ekka builds with and exposes each as a target:
#   Ekka::LLVM         LLVM support libraries (shared libLLVM)
#   Ekka::ClangTooling Clang libTooling (shared libclang-cpp)
#   Ekka::TreeSitter   the tree-sitter runtime and the Python grammar (from
#                      the C sources of their PyPI sdists)
#   SQLite::SQLite3    SQLite
#   Ekka::Torch        LibTorch from the torch wheel of EKKA_PYTHON (one ABI
#                      with the Python side)
#   Ekka::CUPTIHeaders CUPTI headers (the library is loaded at run time)
# With EKKA_TRACER_ONLY, only what ekka-trace and its runtime need: LLVM's
# headers and static Support library, SQLite, LibTorch, CUPTI headers.
# utils/install-deps installs all of them from Debian's packages and PyPI.

set(EKKA_LLVM_ROOT "/usr/lib/llvm-19" CACHE PATH
    "Root of the LLVM/Clang installation (Debian: /usr/lib/llvm-19)")

if(EKKA_TRACER_ONLY)
  # Only LLVM's headers and its static Support library, found by path: a
  # serving container (or the GPU machine) may have nothing more of LLVM
  # than a copy of these. Everything links Support statically.
  foreach(f include/llvm/Support/raw_ostream.h lib/libLLVMSupport.a lib/libLLVMDemangle.a)
    if(NOT EXISTS "${EKKA_LLVM_ROOT}/${f}")
      message(FATAL_ERROR "EKKA_TRACER_ONLY: ${EKKA_LLVM_ROOT}/${f} not found")
    endif()
  endforeach()
  message(STATUS "Ekka: tracer only, LLVM Support from ${EKKA_LLVM_ROOT}")
  add_library(Ekka::LLVMHeaders INTERFACE IMPORTED)
  target_include_directories(Ekka::LLVMHeaders SYSTEM INTERFACE ${EKKA_LLVM_ROOT}/include)
  target_compile_definitions(Ekka::LLVMHeaders INTERFACE
    _GNU_SOURCE __STDC_CONSTANT_MACROS __STDC_FORMAT_MACROS __STDC_LIMIT_MACROS)
  set(LLVM_LIBRARY_DIR ${EKKA_LLVM_ROOT}/lib)
else()
  # Debian's ClangConfigVersion refuses find_package(Clang 19) because it calls
  # itself 19.1, so both are found by path, without a version.
  find_package(LLVM REQUIRED CONFIG
    PATHS ${EKKA_LLVM_ROOT}/lib/cmake/llvm NO_DEFAULT_PATH)
  find_package(Clang REQUIRED CONFIG
    PATHS ${EKKA_LLVM_ROOT}/lib/cmake/clang NO_DEFAULT_PATH)
  message(STATUS "Ekka: LLVM ${LLVM_PACKAGE_VERSION} in ${LLVM_INSTALL_PREFIX}")

  # Headers only: what Support and Trace compile against. Who links which LLVM
  # is decided at the final link: tools take the shared libLLVM that
  # libclang-cpp needs anyway; the runtime, which lives inside somebody else's
  # Python process next to Triton's own LLVM, takes the static LLVMSupport with
  # its symbols hidden (Ekka::LLVMSupportStatic).
  add_library(Ekka::LLVMHeaders INTERFACE IMPORTED)
  target_include_directories(Ekka::LLVMHeaders SYSTEM INTERFACE ${LLVM_INCLUDE_DIRS})
  target_compile_definitions(Ekka::LLVMHeaders INTERFACE ${LLVM_DEFINITIONS_LIST})

  add_library(Ekka::LLVM INTERFACE IMPORTED)
  if(TARGET LLVM)
    target_link_libraries(Ekka::LLVM INTERFACE Ekka::LLVMHeaders LLVM)
  else()
    llvm_map_components_to_libnames(ekka_llvm_libs support demangle option)
    target_link_libraries(Ekka::LLVM INTERFACE Ekka::LLVMHeaders ${ekka_llvm_libs})
  endif()

  add_library(Ekka::ClangTooling INTERFACE IMPORTED)
  target_include_directories(Ekka::ClangTooling SYSTEM INTERFACE ${CLANG_INCLUDE_DIRS})
  if(TARGET clang-cpp)
    target_link_libraries(Ekka::ClangTooling INTERFACE clang-cpp Ekka::LLVM)
  else()
    target_link_libraries(Ekka::ClangTooling INTERFACE
      clangTooling clangFrontend clangIndex clangAST clangBasic Ekka::LLVM)
  endif()
  # Clang's own headers (stddef.h, CUDA builtins) that a parse needs.
  set(EKKA_CLANG_RESOURCE_DIR "${LLVM_LIBRARY_DIR}/clang/${LLVM_VERSION_MAJOR}")
  if(NOT EXISTS "${EKKA_CLANG_RESOURCE_DIR}/include/stddef.h")
    message(FATAL_ERROR "Clang resource directory not found at ${EKKA_CLANG_RESOURCE_DIR}")
  endif()
endif()

add_library(Ekka::LLVMSupportStatic INTERFACE IMPORTED)
target_link_libraries(Ekka::LLVMSupportStatic INTERFACE Ekka::LLVMHeaders
  ${LLVM_LIBRARY_DIR}/libLLVMSupport.a ${LLVM_LIBRARY_DIR}/libLLVMDemangle.a)
target_link_options(Ekka::LLVMSupportStatic INTERFACE "-Wl,--exclude-libs,ALL")
if(EKKA_TRACER_ONLY)
  add_library(Ekka::LLVM INTERFACE IMPORTED)
  target_link_libraries(Ekka::LLVM INTERFACE Ekka::LLVMSupportStatic)
endif()

if(NOT EKKA_TRACER_ONLY)
# --- tree-sitter ---------------------------------------------------------------
# The runtime (tree-sitter 0.23) and the Python grammar (tree-sitter-python
# 0.23.6, ABI 14), both compiled from the C sources their PyPI sdists ship;
# utils/install-deps lays them out under EKKA_TREE_SITTER_SRC.
set(EKKA_TREE_SITTER_SRC "" CACHE PATH
    "tree-sitter sources: runtime/ (lib.c) and grammar/ (src/parser.c); utils/install-deps fetches them")
if(NOT EXISTS "${EKKA_TREE_SITTER_SRC}/runtime/src/lib.c" OR
   NOT EXISTS "${EKKA_TREE_SITTER_SRC}/grammar/src/parser.c")
  message(FATAL_ERROR "EKKA_TREE_SITTER_SRC='${EKKA_TREE_SITTER_SRC}' does not hold "
                      "runtime/src/lib.c and grammar/src/parser.c; run utils/install-deps")
endif()
set(ekka_ts_runtime ${EKKA_TREE_SITTER_SRC}/runtime)
set(ekka_ts_grammar ${EKKA_TREE_SITTER_SRC}/grammar/src)
# The grammar includes tree_sitter/parser.h; the runtime of the same
# generation has it in src/.
file(MAKE_DIRECTORY ${CMAKE_BINARY_DIR}/tree-sitter/tree_sitter)
foreach(h parser.h array.h alloc.h ts_assert.h)
  configure_file(${ekka_ts_runtime}/src/${h} ${CMAKE_BINARY_DIR}/tree-sitter/tree_sitter/${h} COPYONLY)
endforeach()
add_library(ekka_tree_sitter STATIC
  ${ekka_ts_runtime}/src/lib.c ${ekka_ts_grammar}/parser.c ${ekka_ts_grammar}/scanner.c)
target_include_directories(ekka_tree_sitter PRIVATE
  ${CMAKE_BINARY_DIR}/tree-sitter ${ekka_ts_runtime}/src ${ekka_ts_runtime}/include)
target_include_directories(ekka_tree_sitter SYSTEM PUBLIC ${ekka_ts_runtime}/include)
target_compile_definitions(ekka_tree_sitter PRIVATE _DEFAULT_SOURCE _POSIX_C_SOURCE=200112L)
set_target_properties(ekka_tree_sitter PROPERTIES POSITION_INDEPENDENT_CODE ON C_STANDARD 11)
target_compile_options(ekka_tree_sitter PRIVATE -O3 -w)
add_library(Ekka::TreeSitter ALIAS ekka_tree_sitter)

endif()

# --- SQLite ----------------------------------------------------------------------
find_package(SQLite3 REQUIRED)
find_package(Threads REQUIRED)
if(SQLite3_LIBRARY MATCHES "\\.a$")
  # A static libsqlite3 (the GPU machine's kit) needs what it links itself.
  set_property(TARGET SQLite::SQLite3 APPEND PROPERTY
    INTERFACE_LINK_LIBRARIES ${CMAKE_DL_LIBS} m Threads::Threads)
endif()

# --- GoogleTest --------------------------------------------------------------------
if(NOT EKKA_TRACER_ONLY)
  find_package(GTest REQUIRED)
  include(GoogleTest)
endif()

# --- Python, LibTorch ------------------------------------------------------------
set(EKKA_PYTHON "python3" CACHE FILEPATH
    "Python interpreter whose torch wheel provides LibTorch")
execute_process(
  COMMAND ${EKKA_PYTHON} -c "import os, torch; print(os.path.dirname(torch.__file__)); print(int(torch.compiled_with_cxx11_abi())); print(torch.__version__)"
  OUTPUT_VARIABLE ekka_torch_out RESULT_VARIABLE ekka_torch_rc ERROR_QUIET
  OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT ekka_torch_rc EQUAL 0)
  message(FATAL_ERROR "EKKA_PYTHON=${EKKA_PYTHON} cannot import torch; run utils/install-deps")
endif()
string(REPLACE "\n" ";" ekka_torch_out "${ekka_torch_out}")
list(GET ekka_torch_out 0 EKKA_TORCH_DIR)
list(GET ekka_torch_out 1 EKKA_TORCH_CXX11_ABI)
list(GET ekka_torch_out 2 EKKA_TORCH_VERSION)
message(STATUS "Ekka: LibTorch ${EKKA_TORCH_VERSION} from ${EKKA_TORCH_DIR}")
# An imported target of our own rather than TorchConfig.cmake: the latter
# insists on finding the CUDA toolkit that the wheel was built with, which need
# not be the one installed here. Ekka only needs the CPU libraries to link; the
# CUDA parts of torch load themselves at run time.
add_library(Ekka::Torch INTERFACE IMPORTED)
target_include_directories(Ekka::Torch SYSTEM INTERFACE
  ${EKKA_TORCH_DIR}/include ${EKKA_TORCH_DIR}/include/torch/csrc/api/include)
target_compile_definitions(Ekka::Torch INTERFACE
  _GLIBCXX_USE_CXX11_ABI=${EKKA_TORCH_CXX11_ABI})
target_link_libraries(Ekka::Torch INTERFACE
  ${EKKA_TORCH_DIR}/lib/libtorch.so ${EKKA_TORCH_DIR}/lib/libtorch_cpu.so
  ${EKKA_TORCH_DIR}/lib/libc10.so)
set_property(TARGET Ekka::Torch APPEND PROPERTY
  INTERFACE_LINK_OPTIONS "-Wl,-rpath,${EKKA_TORCH_DIR}/lib")

# --- CUPTI (headers only; libcupti is dlopen'ed at run time) -------------------
# Prefer the headers of the CUPTI wheel torch depends on, so that the runtime
# speaks the same CUPTI version as the libcupti it will load.
execute_process(
  COMMAND ${EKKA_PYTHON} -c "import glob, os, torch; d = os.path.dirname(os.path.dirname(torch.__file__)); print(';'.join(glob.glob(d + '/nvidia/*/include') + glob.glob(d + '/nvidia/cuda_cupti/include')))"
  OUTPUT_VARIABLE ekka_cupti_hints ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
find_path(CUPTI_INCLUDE_DIR cupti.h
  HINTS ${ekka_cupti_hints} /usr/local/cuda/include /usr/local/cuda/extras/CUPTI/include)
add_library(Ekka::CUPTIHeaders INTERFACE IMPORTED)
if(CUPTI_INCLUDE_DIR)
  set(EKKA_HAVE_CUPTI 1)
  message(STATUS "Ekka: CUPTI headers in ${CUPTI_INCLUDE_DIR}")
  target_include_directories(Ekka::CUPTIHeaders SYSTEM INTERFACE ${CUPTI_INCLUDE_DIR})
  # Some wheels' include/ lacks the CUDA headers' crt/ part (seen on a GPU
  # machine's image): take it from the toolkit then.
  if(NOT EXISTS "${CUPTI_INCLUDE_DIR}/crt/host_defines.h")
    find_program(EKKA_NVCC nvcc HINTS /usr/local/cuda/bin)
    get_filename_component(ekka_nvcc_dir "${EKKA_NVCC}" DIRECTORY)
    find_path(EKKA_CUDA_CRT_INCLUDE_DIR crt/host_defines.h
      HINTS ${ekka_cupti_hints} ${ekka_nvcc_dir}/../include /usr/local/cuda/include
            /usr/local/cuda/targets/x86_64-linux/include)
    if(EKKA_CUDA_CRT_INCLUDE_DIR)
      target_include_directories(Ekka::CUPTIHeaders SYSTEM INTERFACE ${EKKA_CUDA_CRT_INCLUDE_DIR})
    endif()
  endif()
  target_compile_definitions(Ekka::CUPTIHeaders INTERFACE EKKA_HAVE_CUPTI=1)
else()
  set(EKKA_HAVE_CUPTI 0)
  message(STATUS "Ekka: CUPTI headers not found; GPU kernel tracing is compiled out")
  target_compile_definitions(Ekka::CUPTIHeaders INTERFACE EKKA_HAVE_CUPTI=0)
endif()

# --- Test tools ------------------------------------------------------------------
if(NOT EKKA_TRACER_ONLY)
  find_program(EKKA_FILECHECK FileCheck HINTS ${LLVM_TOOLS_BINARY_DIR} NO_DEFAULT_PATH REQUIRED)
  get_filename_component(ekka_python_bin ${EKKA_PYTHON} DIRECTORY)
  find_program(EKKA_LIT lit HINTS ${ekka_python_bin} REQUIRED)
  find_program(EKKA_CTAGS NAMES ctags-universal universal-ctags ctags)
endif()
