"""`pip install .` for the viper Python package (offline: everything comes from Debian).

    /usr/bin/python3 -m venv --system-site-packages /path/to/venv
    /path/to/venv/bin/pip install --no-build-isolation /path/to/viper

Builds the extension viper._viper with CMake (the same target as scripts/build.sh, in
build-pip/, Release, no tests or benchmarks) and installs it with python/viper/*.py.
--no-build-isolation: pip would otherwise try to download setuptools from PyPI; the venv sees
Debian's (python3-setuptools, python3-wheel) through --system-site-packages. Needs the Debian
packages of scripts/install-deps.sh.
"""
import os
import pathlib
import re
import shutil
import subprocess

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = pathlib.Path(__file__).parent.resolve()


def project_version() -> str:
    text = (ROOT / "CMakeLists.txt").read_text(encoding="utf-8")
    match = re.search(r"project\(viper VERSION ([0-9.]+)", text)
    if match is None:
        raise RuntimeError("setup.py: no 'project(viper VERSION x.y.z' line in CMakeLists.txt")
    return match.group(1)


class CMakeExtension(Extension):
    def __init__(self, name: str):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build_dir = pathlib.Path(os.environ.get("VIPER_PIP_BUILD_DIR", ROOT / "build-pip"))
        jobs = os.environ.get("VIPER_JOBS", str(os.cpu_count() or 1))
        subprocess.check_call(["cmake", "-S", str(ROOT), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release",
                               "-DVIPER_WITH_UCX=ON", "-DVIPER_WITH_PYTHON=ON", "-DVIPER_BUILD_TESTS=OFF",
                               "-DVIPER_BUILD_BENCH=OFF"])
        subprocess.check_call(["cmake", "--build", str(build_dir), "--target", "_viper", "-j", jobs])
        built = sorted((build_dir / "python" / "viper").glob("_viper*.so"))
        if not built:
            raise RuntimeError(f"setup.py: CMake built no _viper*.so in {build_dir / 'python' / 'viper'}")
        dest = pathlib.Path(self.get_ext_fullpath(ext.name))
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built[0], dest)


setup(
    name="viper",
    version=project_version(),
    description="Model versions from a training job to inference servers, memory to memory",
    packages=["viper"],
    package_dir={"viper": "python/viper"},
    ext_modules=[CMakeExtension("viper._viper")],
    cmdclass={"build_ext": CMakeBuild},
    python_requires=">=3.11",
    install_requires=["numpy"],
    zip_safe=False,
)
