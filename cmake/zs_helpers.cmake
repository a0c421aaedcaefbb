# Small helpers in the style of abseil's absl_cc_library / absl_cc_test.

set(ZS_WARNINGS -Wall -Wextra -Wno-unused-parameter)

# zs_cc_library(NAME name SRCS ... [HDRS ...] [DEPS ...] [COPTS ...])
# A static library. Only engine/include (installed as include/) is a public
# include path; the repository root, for the "engine/src/..." and
# "kernels/..." includes of the implementation, is private to the target.
function(zs_cc_library)
  cmake_parse_arguments(ZS "" "NAME" "SRCS;HDRS;DEPS;COPTS" ${ARGN})
  add_library(${ZS_NAME} STATIC ${ZS_SRCS} ${ZS_HDRS})
  target_include_directories(${ZS_NAME}
    PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/engine/include> $<INSTALL_INTERFACE:include>
    PRIVATE ${PROJECT_SOURCE_DIR})
  target_compile_options(${ZS_NAME} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${ZS_WARNINGS} ${ZS_COPTS}>)
  target_link_libraries(${ZS_NAME} PUBLIC ${ZS_DEPS})
  add_library(zeroshard::${ZS_NAME} ALIAS ${ZS_NAME})
endfunction()

# zs_cc_test(NAME name SRCS ... [DEPS ...] [LABELS ...] [ARGS ...])
# Builds a GoogleTest binary and registers it with ctest as one test.
function(zs_cc_test)
  cmake_parse_arguments(ZS "" "NAME;TIMEOUT" "SRCS;DEPS;LABELS;ARGS" ${ARGN})
  add_executable(${ZS_NAME} ${ZS_SRCS})
  # Tests may look inside: internal headers by their path from the root.
  target_include_directories(${ZS_NAME} PRIVATE ${PROJECT_SOURCE_DIR})
  target_compile_options(${ZS_NAME} PRIVATE ${ZS_WARNINGS})
  target_link_libraries(${ZS_NAME} PRIVATE ${ZS_DEPS} GTest::gtest GTest::gtest_main GTest::gmock)
  add_test(NAME ${ZS_NAME} COMMAND ${ZS_NAME} ${ZS_ARGS})
  if(NOT ZS_TIMEOUT)
    set(ZS_TIMEOUT 300)
  endif()
  set_tests_properties(${ZS_NAME} PROPERTIES TIMEOUT ${ZS_TIMEOUT})
  if(ZS_TEST_ENVIRONMENT)
    set_property(TEST ${ZS_NAME} APPEND PROPERTY ENVIRONMENT ${ZS_TEST_ENVIRONMENT})
  endif()
  if(ZS_LABELS)
    set_tests_properties(${ZS_NAME} PROPERTIES LABELS "${ZS_LABELS}")
  endif()
endfunction()

# zs_cc_binary(NAME name SRCS ... [DEPS ...])
# Tools, examples and benchmarks: the public API plus their own folder's
# headers by their path from the root ("examples/mlp/mlp.h").
function(zs_cc_binary)
  cmake_parse_arguments(ZS "" "NAME" "SRCS;DEPS" ${ARGN})
  add_executable(${ZS_NAME} ${ZS_SRCS})
  target_include_directories(${ZS_NAME} PRIVATE ${PROJECT_SOURCE_DIR})
  target_compile_options(${ZS_NAME} PRIVATE ${ZS_WARNINGS})
  target_link_libraries(${ZS_NAME} PRIVATE ${ZS_DEPS})
endfunction()

# Sanitizer builds (ZS_SANITIZE) and the fuzz targets (ZS_FUZZ). Everything
# about them is decided here, once, for every target in the tree:
#   OFF      no sanitizer (default).
#   address  AddressSanitizer (with LeakSanitizer) + UndefinedBehaviorSanitizer;
#            any UBSan report is fatal (-fno-sanitize-recover=all).
#   thread   ThreadSanitizer.
# Sets, in the caller's scope, the runtime options tests run with:
#   ZS_TEST_ENVIRONMENT      every test (zs_cc_test adds it; tests added by
#                            hand append it);
#   ZS_MPI_TEST_ENVIRONMENT  tests under mpirun (the same, plus what MPI needs).
function(zs_configure_sanitizers)
  set(sanitize_values OFF address thread)
  if(NOT ZS_SANITIZE IN_LIST sanitize_values)
    message(FATAL_ERROR "ZS_SANITIZE=${ZS_SANITIZE}: use OFF, address (ASan+UBSan) or thread (TSan)")
  endif()
  if(ZS_CUDA STREQUAL "ON" AND NOT ZS_SANITIZE STREQUAL "OFF")
    message(FATAL_ERROR "ZS_SANITIZE=${ZS_SANITIZE} builds are CPU-only (nvcc's host code is not "
                        "instrumented); use -DZS_CUDA=OFF or AUTO")
  endif()
  if(ZS_FUZZ)
    if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
      message(FATAL_ERROR "ZS_FUZZ=ON needs clang (libFuzzer); configure with "
                          "-DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++")
    endif()
    if(NOT ZS_SANITIZE STREQUAL "address")
      message(FATAL_ERROR "ZS_FUZZ=ON runs the fuzz targets under ASan+UBSan; add -DZS_SANITIZE=address")
    endif()
  endif()

  set(supp ${PROJECT_SOURCE_DIR}/tests/sanitizers)
  set(env "")
  set(mpi_env "")
  if(ZS_SANITIZE STREQUAL "address")
    set(flags -fsanitize=address,undefined -fno-sanitize-recover=all)
    set(asan "detect_leaks=1:strict_init_order=1:check_initialization_order=1:detect_stack_use_after_return=1")
    set(others "UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1"
               "LSAN_OPTIONS=suppressions=${supp}/lsan.supp")
    set(env "ASAN_OPTIONS=${asan}" ${others})
    # OpenMPI is built without frame pointers: the fast unwinder stops at its
    # first frame, and lsan.supp could not tell which library leaked.
    # Open MPI's components stay loaded to the end, so a report's stack
    # names their libraries (a closed one shows as <unknown module>).
    set(mpi_env "ASAN_OPTIONS=${asan}:fast_unwind_on_malloc=0" ${others}
                "OMPI_MCA_mca_base_component_disable_dlclose=1")
  elseif(ZS_SANITIZE STREQUAL "thread")
    set(flags -fsanitize=thread)
    set(env "TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=${supp}/tsan.supp")
    set(mpi_env ${env})
  endif()
  if(NOT ZS_SANITIZE STREQUAL "OFF")
    # Instrumented code runs several times slower: the heaviest sweeps take
    # their light cases and wall-time bounds stretch (tests/test_env.h).
    list(APPEND env ZS_TEST_LIGHT=1 ZS_TEST_TIME_SCALE=10)
    list(APPEND mpi_env ZS_TEST_LIGHT=1 ZS_TEST_TIME_SCALE=10)
    # Frame pointers keep the reports' stacks complete. -O1, as the
    # sanitizers' docs advise, after the build type's -O2: a third less
    # compile time for the test files, tests run about as fast. ASan: line
    # tables only (clang's -gline-tables-only; ~20% faster to compile than
    # -g), enough for file and line in a report. TSan keeps -g: with line
    # tables only an inlined frame is named without its namespace ("Unref"
    # for absl::Status::Unref), and tsan.supp matches qualified names.
    if(CMAKE_CXX_COMPILER_ID MATCHES "Clang" AND ZS_SANITIZE STREQUAL "address")
      list(APPEND flags -fno-omit-frame-pointer -O1 -gline-tables-only)
    else()
      list(APPEND flags -fno-omit-frame-pointer -O1 -g)
    endif()
    add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:${flags}>")
    add_link_options(${flags})
    message(STATUS "zeroshard: sanitizers ${ZS_SANITIZE}")
  endif()
  set(ZS_TEST_ENVIRONMENT "${env}" PARENT_SCOPE)
  set(ZS_MPI_TEST_ENVIRONMENT "${mpi_env}" PARENT_SCOPE)
endfunction()
