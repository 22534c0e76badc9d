# Finds Viper's dependencies. Required ones fail at configure time with the Debian package to
# install; optional ones follow their OFF/AUTO/ON switch.
find_package(Threads REQUIRED)
find_package(PkgConfig REQUIRED)
find_package(nlohmann_json 3 REQUIRED)   # nlohmann-json3-dev
find_package(fmt REQUIRED)               # libfmt-dev
find_package(CLI11 REQUIRED)             # libcli11-dev
pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)   # libxxhash-dev
pkg_check_modules(ZSTD REQUIRED IMPORTED_TARGET libzstd)       # libzstd-dev

set(VIPER_HAVE_UCX OFF)
if(NOT VIPER_WITH_UCX STREQUAL "OFF")
  pkg_check_modules(UCX IMPORTED_TARGET ucx)   # libucx-dev
  if(UCX_FOUND)
    set(VIPER_HAVE_UCX ON)
  elseif(VIPER_WITH_UCX STREQUAL "ON")
    message(FATAL_ERROR "VIPER_WITH_UCX=ON but UCX was not found: apt-get install libucx-dev")
  else()
    message(WARNING "UCX not found: net, api and the node commands are not built")
  endif()
endif()

set(VIPER_HAVE_REDIS OFF)
if(NOT VIPER_WITH_REDIS STREQUAL "OFF")
  pkg_check_modules(HIREDIS IMPORTED_TARGET hiredis)   # libhiredis-dev
  if(HIREDIS_FOUND)
    set(VIPER_HAVE_REDIS ON)
  elseif(VIPER_WITH_REDIS STREQUAL "ON")
    message(FATAL_ERROR "VIPER_WITH_REDIS=ON but hiredis was not found: apt-get install libhiredis-dev")
  else()
    message(WARNING "hiredis not found: the Redis registry backend is not built")
  endif()
endif()

set(VIPER_HAVE_PYTHON OFF)
if(NOT VIPER_WITH_PYTHON STREQUAL "OFF" AND VIPER_HAVE_UCX)
  set(Python_EXECUTABLE /usr/bin/python3)
  find_package(Python 3.11 COMPONENTS Interpreter Development.Module)
  find_package(pybind11 CONFIG)
  if(Python_FOUND AND pybind11_FOUND)
    set(VIPER_HAVE_PYTHON ON)
  elseif(VIPER_WITH_PYTHON STREQUAL "ON")
    message(FATAL_ERROR "VIPER_WITH_PYTHON=ON but python3-dev/pybind11-dev were not found")
  endif()
endif()

if(VIPER_BUILD_TESTS)
  find_package(GTest REQUIRED)           # libgtest-dev libgmock-dev
endif()
if(VIPER_BUILD_BENCH)
  find_package(benchmark QUIET)
endif()
