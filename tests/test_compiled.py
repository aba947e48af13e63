"""The compiled hot path (setup.py, engine/compiled.py): built where it must be, never stale, and
optional where no compiler is."""
import importlib
import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from setuptools import Distribution, Extension

from lanner.compiled import HOT_MODULES

ROOT = Path(__file__).resolve().parent.parent
HEAPTYPE = 1 << 9           # Py_TPFLAGS_HEAPTYPE


def loaded_from(name: str) -> Path:
    return Path(importlib.import_module(name).__file__)


@pytest.mark.skipif(os.environ.get("LANNER_REQUIRE_COMPILED") != "1",
                    reason="LANNER_REQUIRE_COMPILED=1 (CI) requires the compiled build")
@pytest.mark.parametrize("name", HOT_MODULES)
def test_hot_module_is_compiled(name):
    """CI installs with a compiler: a module that silently fell back to pure Python fails here."""
    path = loaded_from(name)
    assert path.suffix == ".so", f"{name} was loaded from {path.name}, not from its compiled build"


@pytest.mark.parametrize("name", HOT_MODULES)
def test_compiled_module_is_not_older_than_its_source(name):
    """An editable install leaves the extension next to the .py, and the import system prefers
    it: after an edit, the old build would run until `pip install -e .` is run again."""
    path = loaded_from(name)
    if path.suffix != ".so":
        return                      # pure Python: the source is what runs
    stem = path.name.split(".")[0]
    for src in (path.with_name(stem + ".py"), path.with_name(stem + ".pxd")):
        if src.exists():
            assert path.stat().st_mtime >= src.stat().st_mtime, \
                f"{path.name} is older than {src.name}: run `pip install -e .` again"


@pytest.mark.parametrize("name", HOT_MODULES)
def test_classes_a_pxd_declares_are_c_types(name):
    """A .pxd next to a compiled module makes the classes it declares C types (typed fields, direct
    method calls).  Cython finds it by import name, which package-dir maps elsewhere: if the build
    misses it, the module still compiles, with every class a plain Python class, and only the
    CPU per request shows it (setup.py's pxd_include_dir)."""
    mod = importlib.import_module(name)
    path = Path(mod.__file__)
    if path.suffix != ".so":
        return                      # pure Python: nothing was declared
    pxd = path.with_name(path.name.split(".")[0] + ".pxd")
    if not pxd.exists():
        return
    text = pxd.read_text()
    declared = re.findall(r"^cdef class (\w+)", text, re.M)
    constant = re.search(r"^cdef bint COMPILED$", text, re.M) is not None
    functions = re.findall(r"^cpdef [\w ]*?\b(\w+)\(", text, re.M)
    assert declared or constant or functions, \
        f"{pxd.name} declares no class, no COMPILED constant and no function"
    for fn_name in functions:
        # applied, a module-level cpdef is a Cython function (cimported by other modules as a
        # C call); missed, a plain Python function whose callers pay a Python call
        assert type(getattr(mod, fn_name)).__name__ == "cython_function_or_method", \
            f"{name}.{fn_name} compiled as a Python function: the build did not apply {pxd.name}"
    if constant:
        # applied, the .pxd makes COMPILED a C constant (its C helpers exist only then);
        # missed, it stays a module attribute and the helpers' names fail at run time
        assert not hasattr(mod, "COMPILED"), \
            f"{name}.COMPILED is a Python attribute: the build did not apply {pxd.name}"
    for cls_name in declared:
        cls = getattr(mod, cls_name)
        # a class statement makes a heap type; an extension type of the build is static
        assert not cls.__flags__ & HEAPTYPE, \
            f"{name}.{cls_name} compiled as a Python class: the build did not apply {pxd.name}"


def test_setup_lists_only_existing_sources():
    sys.path.insert(0, str(ROOT))
    try:
        setup = importlib.import_module("setup")
    finally:
        sys.path.remove(str(ROOT))
    for name in HOT_MODULES:
        assert (ROOT / setup.source_of(name)).is_file(), name
    assert setup.source_of("lanner.protocols.memcache") == os.path.join("protocols", "memcache.py")
    assert setup.source_of("lanner.fronts.conn") == os.path.join("engine", "fronts", "conn.py")
    assert setup.source_of("lanner.perf.hotloop") == os.path.join("perf", "hotloop.py")


def test_without_a_compiler_the_build_warns_once_and_succeeds(tmp_path):
    pytest.importorskip("Cython")
    env = dict(os.environ, CC="false", LDSHARED="false")      # every compile fails
    done = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--build-lib",
                           str(tmp_path / "lib"), "--build-temp", str(tmp_path / "tmp")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stderr.count("WARNING: lanner: the compiled hot path was not built") == 1, done.stderr
    assert not list((tmp_path / "lib").rglob("*.so"))


def _setup_in(tmp_path, monkeypatch):
    """setup.py's helpers, pointed at a source tree in tmp_path."""
    sys.path.insert(0, str(ROOT))
    try:
        setup = importlib.import_module("setup")
    finally:
        sys.path.remove(str(ROOT))
    monkeypatch.setattr(setup, "_warned", False, raising=False)
    monkeypatch.setattr(setup, "HERE", str(tmp_path))
    monkeypatch.setattr(setup, "source_of", lambda name: name + ".py")
    monkeypatch.chdir(tmp_path)
    # cythonize makes its relative build dir once per process (Cython's safe_makedirs_once
    # remembers the path, not where it was made): an earlier test's tmp_path had it, this one
    # would not, and the first module it translates would fail to be written
    (tmp_path / "build" / "cython").mkdir(parents=True)
    return setup


def test_a_module_cython_rejects_stays_pure_python_with_one_warning(tmp_path, monkeypatch, capsys):
    """A Cython compile error (not a C one) failed `pip install` outright: cythonize ran before
    build_ext, whose fallback only catches the C step.  Now that module is left out, with the
    one warning, and the others are still translated."""
    pytest.importorskip("Cython")
    setup = _setup_in(tmp_path, monkeypatch)
    monkeypatch.setattr(setup, "hot_modules", lambda: ("bad", "good", "worse"))
    monkeypatch.setattr(setup, "pxd_include_dir", lambda: str(tmp_path))
    (tmp_path / "bad.py").write_text("def f(:\n    pass\n")          # a syntax Cython rejects
    (tmp_path / "worse.py").write_text("x = = 1\n")
    (tmp_path / "good.py").write_text("def f():\n    return 1\n")
    out = setup.extensions()
    assert [e.name for e in out] == ["good"]
    err = capsys.readouterr().err
    assert err.count("WARNING: lanner: the compiled hot path was not built") == 1, err
    assert "Cython rejected bad" in err


def _in_place(setup, failed: list[str], in_place: bool = True):
    cmd = setup.OptionalBuildExt(Distribution())
    cmd.inplace = in_place
    cmd.failed = failed
    return cmd


def test_a_module_cython_rejects_loses_its_stale_build(tmp_path, monkeypatch, capsys):
    """The warning says pure Python; an extension an earlier in-place build left beside the
    source would still be what Python imports."""
    pytest.importorskip("Cython")
    setup = _setup_in(tmp_path, monkeypatch)
    monkeypatch.setattr(setup, "_rejected", [])
    monkeypatch.setattr(setup, "hot_modules", lambda: ("bad",))
    monkeypatch.setattr(setup, "pxd_include_dir", lambda: str(tmp_path))
    (tmp_path / "bad.py").write_text("def f(:\n    pass\n")
    stale = tmp_path / ("bad" + sysconfig.get_config_var("EXT_SUFFIX"))
    stale.write_bytes(b"an old build")
    assert setup.extensions() == []
    assert setup._rejected == ["bad"]
    _in_place(setup, list(setup._rejected)).forget_failed_builds()
    assert not stale.exists()
    assert "removed the stale build" in capsys.readouterr().err


def test_a_module_gcc_fails_on_loses_its_stale_build_only_in_place(tmp_path, monkeypatch, capsys):
    setup = _setup_in(tmp_path, monkeypatch)

    def fails(self, ext):
        raise RuntimeError("gcc: error")
    monkeypatch.setattr(setup.build_ext, "build_extension", fails)
    stale = tmp_path / ("mod" + sysconfig.get_config_var("EXT_SUFFIX"))
    stale.write_bytes(b"an old build")
    for in_place in (False, True):
        cmd = _in_place(setup, [], in_place)
        cmd.build_extension(Extension("mod", ["mod.c"]))
        assert cmd.failed == ["mod"]
        cmd.forget_failed_builds()
        assert stale.exists() != in_place       # a build into a build folder leaves it alone
    err = capsys.readouterr().err
    assert "WARNING: lanner: the compiled hot path was not built (RuntimeError: gcc: error)" in err
