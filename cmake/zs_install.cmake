# Install rules and the CMake package: after `cmake --install build --prefix P`
# a project finds the engine with
#   find_package(zeroshard REQUIRED)   # -DCMAKE_PREFIX_PATH=P
#   target_link_libraries(app PRIVATE zeroshard::engine)
# P/include holds the public headers (engine/include) and the 16-bit float
# rules (kernels/common/float16_rules.h, host_device.h), P/lib the static
# libraries, P/lib/cmake/zeroshard the package files, P/bin the command line.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(ZS_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/zeroshard)

install(TARGETS zeroshard ${ZS_ENGINE_LIBRARIES}
  EXPORT zeroshardTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/engine/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  FILES_MATCHING PATTERN "*.h")
# The 16-bit float rules, for a trainer's own CUDA kernels (kernels/CMakeLists.txt).
foreach(header ${ZS_KERNELS_PUBLIC_HDRS})
  get_filename_component(header_dir ${header} DIRECTORY)
  install(FILES ${PROJECT_SOURCE_DIR}/${header} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/${header_dir})
endforeach()
if(TARGET zeroshard_cli)
  install(TARGETS zeroshard_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  if(TARGET zeroshard_calibrate)
    install(TARGETS zeroshard_calibrate RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  endif()
endif()

install(EXPORT zeroshardTargets NAMESPACE zeroshard:: DESTINATION ${ZS_INSTALL_CMAKEDIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/zeroshardConfig.cmake.in
  ${PROJECT_BINARY_DIR}/zeroshardConfig.cmake INSTALL_DESTINATION ${ZS_INSTALL_CMAKEDIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/zeroshardConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/zeroshardConfig.cmake
  ${PROJECT_BINARY_DIR}/zeroshardConfigVersion.cmake DESTINATION ${ZS_INSTALL_CMAKEDIR})
