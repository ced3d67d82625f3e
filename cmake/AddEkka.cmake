# Helpers in the spirit of LLVM's add_llvm_library / add_llvm_tool.

# add_ekka_library(NAME SOURCES... [LINK libs...])
#   One static library per component, public headers in include/ekka/<Component>.
function(add_ekka_library name)
  cmake_parse_arguments(ARG "" "" "LINK" ${ARGN})
  add_library(${name} STATIC ${ARG_UNPARSED_ARGUMENTS})
  target_include_directories(${name} PUBLIC
    ${PROJECT_SOURCE_DIR}/include ${PROJECT_BINARY_DIR}/include)
  target_compile_options(${name} PRIVATE -Wall -Wextra -Wno-unused-parameter)
  set_target_properties(${name} PROPERTIES POSITION_INDEPENDENT_CODE ON)
  if(ARG_LINK)
    target_link_libraries(${name} PUBLIC ${ARG_LINK})
  endif()
endfunction()

# add_ekka_tool(NAME SOURCES... [LINK libs...])
function(add_ekka_tool name)
  cmake_parse_arguments(ARG "" "" "LINK" ${ARGN})
  add_executable(${name} ${ARG_UNPARSED_ARGUMENTS})
  target_compile_options(${name} PRIVATE -Wall -Wextra -Wno-unused-parameter)
  target_link_libraries(${name} PRIVATE ${ARG_LINK})
endfunction()

# add_ekka_unittest(NAME SOURCES... [LINK libs...])
function(add_ekka_unittest name)
  cmake_parse_arguments(ARG "" "" "LINK" ${ARGN})
  add_executable(${name} ${ARG_UNPARSED_ARGUMENTS})
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY
    ${PROJECT_BINARY_DIR}/unittests)
  target_link_libraries(${name} PRIVATE ${ARG_LINK} GTest::gtest GTest::gtest_main)
  # A case that hangs fails at 120 s (the slowest takes 3 s under ASan),
  # where it held the run for ever.
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60
    PROPERTIES LABELS unittest TIMEOUT 120)
endfunction()
