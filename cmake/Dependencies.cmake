# Finds Viper's dependencies. Required ones fail at configure time with the Debian package to
# install; optional ones follow their OFF/AUTO/ON switch.
find_package(Threads REQUIRED)
find_package(PkgConfig REQUIRED)
find_package(nlohmann_json 3 REQUIRED)   # nlohmann-json3-dev
find_package(fmt REQUIRED)               # libfmt-dev
find_package(CLI11 REQUIRED)             # libcli11-dev
find_package(OpenSSL REQUIRED COMPONENTS Crypto)  # libssl-dev: HMAC-SHA256, CSPRNG (src/core/crypto.h)
pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)   # libxxhash-dev
pkg_check_modules(ZSTD REQUIRED IMPORTED_TARGET libzstd)       # libzstd-dev

# viper_optional_pkg(WHAT PREFIX MODULE PACKAGE WITHOUT): a pkg-config dependency behind the
# switch VIPER_WITH_<WHAT> (OFF/AUTO/ON); sets VIPER_HAVE_<WHAT> and PkgConfig::<PREFIX>. ON fails
# naming the Debian PACKAGE; AUTO warns with WITHOUT (what is not built).
function(viper_optional_pkg what prefix module package without)
  set(VIPER_HAVE_${what} OFF PARENT_SCOPE)
  if(VIPER_WITH_${what} STREQUAL "OFF")
    return()
  endif()
  pkg_check_modules(${prefix} IMPORTED_TARGET GLOBAL ${module})
  if(${prefix}_FOUND)
    set(VIPER_HAVE_${what} ON PARENT_SCOPE)
  elseif(VIPER_WITH_${what} STREQUAL "ON")
    message(FATAL_ERROR "VIPER_WITH_${what}=ON but ${module} was not found: apt-get install ${package}")
  else()
    message(WARNING "${module} not found: ${without}")
  endif()
endfunction()

viper_optional_pkg(UCX UCX ucx libucx-dev "net, api and the node commands are not built")
viper_optional_pkg(REDIS HIREDIS hiredis libhiredis-dev "the Redis registry backend is not built")

set(VIPER_HAVE_PYTHON OFF)
if(NOT VIPER_WITH_PYTHON STREQUAL "OFF" AND VIPER_HAVE_UCX)
  # The interpreter the module is built for: Debian's by default (scripts/build.sh, the tests);
  # setup.py passes the one that runs pip (-DPython_EXECUTABLE=...), a venv's or another install's.
  set(Python_EXECUTABLE /usr/bin/python3 CACHE FILEPATH "Python interpreter the viper module is built for")
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
