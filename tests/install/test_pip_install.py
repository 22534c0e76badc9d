"""`pip install .` into a fresh virtual environment, exactly as docs/INSTALL.md says, then
`import viper` there (not from the build tree) and a round trip through it.

The extension is built by setup.py in VIPER_PIP_BUILD_DIR = this build tree (CTest passes
VIPER_BINARY_DIR), so the test reuses the module CMake already built instead of compiling a
second tree; everything else (pyproject.toml, setup.py, the wheel, the installed files) is the
user's path.
"""
import os
import pathlib
import subprocess
import sys
import textwrap

SOURCE = pathlib.Path(__file__).resolve().parents[2]
BINARY = pathlib.Path(os.environ.get("VIPER_BINARY_DIR", SOURCE / "build"))

ROUND_TRIP = textwrap.dedent("""
    import pathlib, sys
    import numpy as np
    import viper
    from viper import _viper
    env = pathlib.Path(sys.prefix)
    for module in (viper, _viper):
        assert pathlib.Path(module.__file__).is_relative_to(env), f"{module.__name__} from {module.__file__}"
    package = pathlib.Path(viper.__file__).parent
    assert (package / "py.typed").is_file() and (package / "_viper.pyi").is_file(), sorted(package.iterdir())

    weights = {"w": np.arange(4096, dtype=np.float32).reshape(64, 64), "b": np.ones(64, dtype=np.float16)}
    snapshot = viper.build_snapshot(weights, model="venv", step=3)
    assert sorted(snapshot.keys()) == ["b", "w"] and np.array_equal(snapshot["w"], weights["w"])
    with viper.Publisher("venv", mode="sync", segment_prefix="viperpip") as pub:
        with viper.Subscriber("venv", connect=pub.address) as sub:
            result = pub.publish(weights, step=3)
            version = sub.wait_for(result.version, timeout=30)
            assert version.step == 3 and np.array_equal(version["w"], weights["w"]), version
            assert np.array_equal(version["b"], weights["b"])
    print(f"ok viper {viper.__version__} from {package}: version {version.version}, {result.bytes} bytes")
""")


def run(cmd, **kwargs):
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kwargs)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def test_pip_install_into_a_fresh_venv_imports_and_round_trips(tmp_path):
    env_dir = tmp_path / "env"
    run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", env_dir])
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(VIPER_PIP_BUILD_DIR=str(BINARY), PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    install = run([env_dir / "bin" / "pip", "install", "--no-build-isolation", SOURCE], env=env, cwd=tmp_path)
    assert "Successfully installed viper" in install.stdout, install.stdout

    # The wheel carries the real extension (the bug this guards: a 3.5 KB module without PyInit__viper).
    site = run([env_dir / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['platlib'])"],
               env=env).stdout.strip()
    modules = list((pathlib.Path(site) / "viper").glob("_viper*.so"))
    assert len(modules) == 1, modules
    assert b"PyInit__viper" in modules[0].read_bytes()

    out = run([env_dir / "bin" / "python", "-c", ROUND_TRIP], env=env, cwd=tmp_path).stdout
    assert out.startswith("ok viper "), out
    print(out)


def test_stubs_match_the_built_module():
    """python/viper/_viper.pyi is what scripts/gen_stubs.py prints for this build."""
    env = dict(os.environ, PYTHONPATH=str(BINARY / "python"))
    proc = subprocess.run([sys.executable, str(SOURCE / "scripts" / "gen_stubs.py"), "--check"], env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
