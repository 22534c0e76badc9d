# `cmake --install` rules: the libraries as an exported CMake package (find_package(viper) ->
# viper::viper), a pkg-config file (viper.pc), the public headers under include/viper and the
# `viper` and `viper-bench` programs. Layout and use: docs/INSTALL.md. Included by the top-level CMakeLists.txt when
# the API library is built (UCX found).
#
# The libraries are static archives (built with -fPIC), so a consumer's link needs their private
# dependencies too: viperConfig.cmake finds them again, and viper.pc names them in Requires.
# Their headers do not leak: every installed header compiles with the standard library alone
# (tests/install checks each one in its own translation unit).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# viper::viper: what a user links, the API (publisher, subscriber, node, relay, registry) with
# everything it needs, plus the data side (record files, prefetcher, rehearsal buffer) and the
# scheduler, whose headers are installed too. The parts stay available as viper::<part>.
add_library(viper_all INTERFACE)
target_link_libraries(viper_all INTERFACE viper_api viper_data viper_schedule)
set_target_properties(viper_all PROPERTIES EXPORT_NAME viper)
add_library(viper::viper ALIAS viper_all)

set(VIPER_EXPORTED_LIBS viper_core viper_delta viper_store viper_schedule viper_data viper_net viper_registry viper_gpu
    viper_api)
foreach(lib ${VIPER_EXPORTED_LIBS})
  string(REGEX REPLACE "^viper_" "" part ${lib})
  set_target_properties(${lib} PROPERTIES EXPORT_NAME ${part})
endforeach()

install(TARGETS ${VIPER_EXPORTED_LIBS} viper_all EXPORT viperTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS viper RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
if(TARGET viper-bench)  # `viper bench` execs the viper-bench beside viper
  install(TARGETS viper-bench RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()

# Public headers: include/viper/*.h, not include/viper/internal/ (in-tree only, see log.h).
file(GLOB VIPER_PUBLIC_HEADERS CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/include/viper/*.h)
install(FILES ${VIPER_PUBLIC_HEADERS} ${PROJECT_BINARY_DIR}/generated/viper/version.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/viper)

set(VIPER_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/viper)
install(EXPORT viperTargets NAMESPACE viper:: DESTINATION ${VIPER_CMAKE_DIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/viperConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/package/viperConfig.cmake INSTALL_DESTINATION ${VIPER_CMAKE_DIR})
# 0.x: only the same minor version is compatible.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/package/viperConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/package/viperConfig.cmake ${PROJECT_BINARY_DIR}/package/viperConfigVersion.cmake
        DESTINATION ${VIPER_CMAKE_DIR})

# viper.pc: the archives in link order (each before what it uses), then the dependencies.
set(VIPER_PC_REQUIRES "ucx libxxhash libzstd libcrypto fmt")
if(VIPER_HAVE_REDIS)
  string(APPEND VIPER_PC_REQUIRES " hiredis")
endif()
set(CMAKE_DL_LIBS_FLAG "")
if(CMAKE_DL_LIBS)
  set(CMAKE_DL_LIBS_FLAG "-l${CMAKE_DL_LIBS}")  # viper_gpu opens libcuda with dlopen
endif()
file(RELATIVE_PATH VIPER_PC_UP /prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig /prefix)
string(REGEX REPLACE "/$" "" VIPER_PC_UP "${VIPER_PC_UP}")
configure_file(${PROJECT_SOURCE_DIR}/cmake/viper.pc.in ${PROJECT_BINARY_DIR}/package/viper.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/package/viper.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# The systemd unit for `viper serve`, with the installed program's path (packaging/systemd/).
# The build tree's copy (tests/install/test_systemd_unit.py) names the configured prefix; the
# installed one is configured again at install time, so that `cmake --install --prefix P` names
# P/bin/viper, not the configured prefix's.
set(VIPER_INSTALL_FULL_BINDIR ${CMAKE_INSTALL_FULL_BINDIR})
configure_file(${PROJECT_SOURCE_DIR}/packaging/systemd/viper-serve.service.in
               ${PROJECT_BINARY_DIR}/package/viper-serve.service @ONLY)
if(IS_ABSOLUTE "${CMAKE_INSTALL_BINDIR}")
  set(viper_unit_bindir "${CMAKE_INSTALL_BINDIR}")
else()
  set(viper_unit_bindir "\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_BINDIR}")
endif()
install(CODE "set(VIPER_INSTALL_FULL_BINDIR \"${viper_unit_bindir}\")
  configure_file(\"${PROJECT_SOURCE_DIR}/packaging/systemd/viper-serve.service.in\"
                 \"${PROJECT_BINARY_DIR}/package/install/viper-serve.service\" @ONLY)")
install(FILES ${PROJECT_BINARY_DIR}/package/install/viper-serve.service
              ${PROJECT_SOURCE_DIR}/packaging/systemd/viper-serve.env
        DESTINATION ${CMAKE_INSTALL_DATADIR}/viper/systemd)
