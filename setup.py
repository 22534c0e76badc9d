"""`pip install .` for the viper Python package (pyproject.toml; docs/INSTALL.md).

    /usr/bin/python3 -m venv --system-site-packages /path/to/venv
    /path/to/venv/bin/pip install --no-build-isolation /path/to/viper

Builds the extension viper._viper with CMake for the interpreter that runs this script
(-DPython_EXECUTABLE=sys.executable) and installs it with python/viper/*.py, the .pyi stubs and
py.typed. The CMake tree is build-pip/ (Release, no tests or benchmarks), or VIPER_PIP_BUILD_DIR:
an existing tree there (e.g. scripts/build.sh's build/) is reused as it is configured, only the
_viper target is built, and it is reconfigured only if it was made for another interpreter.
--no-build-isolation: pip would otherwise try to download setuptools and wheel from PyPI; the
venv sees Debian's (python3-setuptools, python3-wheel) through --system-site-packages. Needs the
Debian packages of scripts/install-deps.sh.
"""
import os
import pathlib
import re
import shutil
import subprocess
import sys
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = pathlib.Path(__file__).parent.resolve()

# setuptools before 70.1 builds wheels only with the `wheel` package; without it, under
# --no-build-isolation, pip would end with "invalid command 'bdist_wheel'" (dist_info runs it too).
if {"bdist_wheel", "dist_info"} & set(sys.argv):  # pip: metadata (dist_info), then the wheel
    try:
        import wheel  # noqa: F401
    except ImportError:
        sys.exit(f"setup.py: building a wheel needs the 'wheel' package in {sys.executable}'s environment: "
                 "install it (Debian: python3-wheel, seen by a venv made with --system-site-packages; "
                 "elsewhere: pip install wheel), or drop --no-build-isolation so that pip fetches it")


def project_version() -> str:
    text = (ROOT / "CMakeLists.txt").read_text(encoding="utf-8")
    match = re.search(r"project\(viper VERSION ([0-9.]+)", text)
    if match is None:
        raise RuntimeError("setup.py: no 'project(viper VERSION x.y.z' line in CMakeLists.txt")
    return match.group(1)


def cached_python(build_dir: pathlib.Path):
    """The interpreter an existing CMake tree was configured for (None if it has no cache)."""
    cache = build_dir / "CMakeCache.txt"
    if not cache.exists():
        return None
    match = re.search(r"^Python_EXECUTABLE:[A-Z]+=(.*)$", cache.read_text(encoding="utf-8"), re.MULTILINE)
    return match.group(1) if match else ""


class CMakeExtension(Extension):
    def __init__(self, name: str):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build_dir = pathlib.Path(os.environ.get("VIPER_PIP_BUILD_DIR", ROOT / "build-pip")).resolve()
        jobs = os.environ.get("VIPER_JOBS", str(os.cpu_count() or 1))
        python = sys.executable
        cached = cached_python(build_dir)
        if cached is None:
            subprocess.check_call(["cmake", "-S", str(ROOT), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release",
                                   f"-DPython_EXECUTABLE={python}", "-DVIPER_WITH_UCX=ON", "-DVIPER_WITH_PYTHON=ON",
                                   "-DVIPER_BUILD_TESTS=OFF", "-DVIPER_BUILD_BENCH=OFF"])
        elif not cached or os.path.realpath(cached) != os.path.realpath(python):
            # Another interpreter (or none): the same tree, configured for this one.
            print(f"setup.py: {build_dir} was configured for {cached or 'no Python'}; reconfiguring for {python}")
            subprocess.check_call(["cmake", "-S", str(ROOT), "-B", str(build_dir), f"-DPython_EXECUTABLE={python}",
                                   "-DVIPER_WITH_PYTHON=ON"])
        subprocess.check_call(["cmake", "--build", str(build_dir), "--target", "_viper", "-j", jobs])

        # The module for this interpreter's ABI, and a real one: it must define PyInit__viper.
        suffix = sysconfig.get_config_var("EXT_SUFFIX")
        built = build_dir / "python" / "viper" / f"_viper{suffix}"
        if not built.exists():
            found = sorted(p.name for p in (build_dir / "python" / "viper").glob("_viper*"))
            raise RuntimeError(f"setup.py: CMake built no {built.name} for {python} in {built.parent} "
                               f"(found: {', '.join(found) or 'nothing'})")
        if b"PyInit__viper" not in built.read_bytes():
            raise RuntimeError(f"setup.py: {built} ({built.stat().st_size} bytes) defines no PyInit__viper: "
                               "the build produced an empty module")
        dest = pathlib.Path(self.get_ext_fullpath(ext.name))
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built, dest)


setup(
    version=project_version(),
    packages=["viper"],
    package_dir={"viper": "python/viper"},
    package_data={"viper": ["*.pyi", "py.typed"]},
    ext_modules=[CMakeExtension("viper._viper")],
    cmdclass={"build_ext": CMakeBuild},
    # setuptools' own build files stay out of CMake's build/ (its default build base).
    options={"build": {"build_base": str(pathlib.Path(os.environ.get("VIPER_PIP_BUILD_DIR", ROOT / "build-pip"))
                                         / "setuptools")}},
    zip_safe=False,
)
