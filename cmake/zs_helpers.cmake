# Small helpers in the style of abseil's absl_cc_library / absl_cc_test.

set(ZS_WARNINGS -Wall -Wextra -Wno-unused-parameter)

# zs_cc_library(NAME name SRCS ... [HDRS ...] [DEPS ...] [COPTS ...])
function(zs_cc_library)
  cmake_parse_arguments(ZS "" "NAME" "SRCS;HDRS;DEPS;COPTS" ${ARGN})
  add_library(${ZS_NAME} STATIC ${ZS_SRCS} ${ZS_HDRS})
  target_include_directories(${ZS_NAME} PUBLIC
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/engine/include>
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>)
  target_compile_options(${ZS_NAME} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${ZS_WARNINGS} ${ZS_COPTS}>)
  target_link_libraries(${ZS_NAME} PUBLIC ${ZS_DEPS})
  add_library(zeroshard::${ZS_NAME} ALIAS ${ZS_NAME})
endfunction()

# zs_cc_test(NAME name SRCS ... [DEPS ...] [LABELS ...] [ARGS ...])
# Builds a GoogleTest binary and registers it with ctest as one test.
function(zs_cc_test)
  cmake_parse_arguments(ZS "" "NAME;TIMEOUT" "SRCS;DEPS;LABELS;ARGS" ${ARGN})
  add_executable(${ZS_NAME} ${ZS_SRCS})
  target_compile_options(${ZS_NAME} PRIVATE ${ZS_WARNINGS})
  target_link_libraries(${ZS_NAME} PRIVATE ${ZS_DEPS} GTest::gtest GTest::gtest_main GTest::gmock)
  add_test(NAME ${ZS_NAME} COMMAND ${ZS_NAME} ${ZS_ARGS})
  if(NOT ZS_TIMEOUT)
    set(ZS_TIMEOUT 300)
  endif()
  set_tests_properties(${ZS_NAME} PROPERTIES TIMEOUT ${ZS_TIMEOUT})
  if(ZS_LABELS)
    set_tests_properties(${ZS_NAME} PROPERTIES LABELS "${ZS_LABELS}")
  endif()
endfunction()

# zs_cc_binary(NAME name SRCS ... [DEPS ...])
function(zs_cc_binary)
  cmake_parse_arguments(ZS "" "NAME" "SRCS;DEPS" ${ARGN})
  add_executable(${ZS_NAME} ${ZS_SRCS})
  target_compile_options(${ZS_NAME} PRIVATE ${ZS_WARNINGS})
  target_link_libraries(${ZS_NAME} PRIVATE ${ZS_DEPS})
endfunction()
