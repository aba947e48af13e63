"""Build step for the compiled hot path; everything else about the package is in pyproject.toml.

The modules named in engine/compiled.py are compiled by Cython in pure-Python mode: the same .py
files, no second copy of the logic, so the package works unchanged where they are not compiled.
`pip install -e .` puts the extensions next to their sources (the import system prefers them to
the .py), a wheel carries both.  Without Cython or a C compiler the install still succeeds, in
pure Python, with one warning; tests/test_compiled.py (with LANNER_REQUIRE_COMPILED=1, as in
CI) fails if that happened where it must not.
"""
import os
import runpy
import shutil
import sys
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
# the one place that maps import names to folders is pyproject.toml's package-dir; these are
# its top-level entries, longest first, so the most specific prefix wins
PACKAGE_DIRS = (("lanner.protocols", "protocols"), ("lanner.perf", "perf"), ("lanner", "engine"))
WARNING = ("lanner: the compiled hot path was not built (%s); installing pure Python, which "
           "serves the same bytes with more CPU per request")


def source_of(module: str) -> str:
    """engine/fronts/conn.py for lanner.fronts.conn (the package-dir mapping)."""
    for prefix, folder in PACKAGE_DIRS:
        if module == prefix or module.startswith(prefix + "."):
            rest = module[len(prefix):].lstrip(".").split(".")
            return os.path.join(folder, *rest) + ".py"
    raise ValueError("not a lanner module: " + module)


def hot_modules() -> tuple[str, ...]:
    return runpy.run_path(os.path.join(HERE, "engine", "compiled.py"))["HOT_MODULES"]


def pxd_include_dir() -> str:
    """A folder holding every .pxd of the compiled modules where their import name puts them
    (lanner/protocols/memcache.pxd for protocols/memcache.pxd).  Cython looks for a module's
    declarations, and for what a .pxd cimports, by import name from the package root; with
    package-dir mapping `lanner.protocols` onto protocols/ it finds neither next to the .py, so
    without this folder every class a .pxd declares a C type silently compiles as a Python
    class (tests/test_compiled.py checks that they are C types)."""
    out = os.path.join(HERE, "build", "cython", "include")
    os.makedirs(out, exist_ok=True)
    for m in hot_modules():
        src = os.path.join(HERE, source_of(m)[:-3] + ".pxd")
        if os.path.exists(src):
            dst = os.path.join(out, *m.split(".")) + ".pxd"
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            # copy2 keeps the source's mtime, so cythonize rebuilds only when the .pxd changed
            if not os.path.exists(dst) or os.path.getmtime(dst) != os.path.getmtime(src):
                shutil.copy2(src, dst)
    return out


_warned = False
_rejected: list[str] = []       # modules Cython rejected (cythonized), for OptionalBuildExt


def drop_stale_build(module: str) -> None:
    """Remove the extension an earlier in-place build left next to `module`'s source.  The
    import system prefers it to the .py, so after a failed build the old code would run while
    the warning says pure Python is installed."""
    path = os.path.join(HERE, source_of(module)[:-3] + sysconfig.get_config_var("EXT_SUFFIX"))
    if os.path.exists(path):
        os.remove(path)
        print("lanner: removed the stale build %s" % os.path.relpath(path, HERE), file=sys.stderr)


def warn(why: str) -> None:
    """The one warning of a build that falls back to pure Python, whatever failed and how often."""
    global _warned
    if not _warned:
        _warned = True
        print("WARNING: " + WARNING % why, file=sys.stderr)


def extensions() -> list:
    try:
        from Cython.Build import cythonize  # noqa: F401 (only whether it is there)
    except ImportError as e:
        warn("Cython is missing: %s" % e)
        return []
    return cythonized([Extension(m, [source_of(m)]) for m in hot_modules()], [pxd_include_dir()])


def cythonized(exts: list, include_path: list[str]) -> list:
    """The C extensions of `exts` that Cython translates; one that it rejects (a Cython compile
    error, which is not the C compiler's: build_ext never sees it) stays pure Python, with the
    one warning, like a module gcc fails on."""
    # imported here: extensions() checked it is there, and setup.py must load without it
    from Cython.Build import cythonize
    out = []
    for ext in exts:
        try:
            out += cythonize([ext], build_dir=os.path.join("build", "cython"), quiet=True,
                             include_path=include_path,
                             compiler_directives={
                                 "language_level": 3,
                                 # type hints document, they do not convert: a `bytes` hint must
                                 # still take the memoryview a ring hands over, as the .py does
                                 "annotation_typing": False,
                                 "binding": True,   # methods and functions introspect as in Python
                             })
        except Exception as e:      # Cython's CompileError: this module stays pure Python
            warn("Cython rejected %s: %s: %s" % (ext.name, type(e).__name__, e))
            _rejected.append(ext.name)
    return out


class OptionalBuildExt(build_ext):
    """Compile what can be compiled; a missing compiler or header is one warning, not a failure."""

    failed: list[str]

    def run(self):
        self.failed = list(_rejected)
        try:
            super().run()
        except Exception as e:      # no compiler at all (DistutilsPlatformError and kin)
            self.announce_failure(e)
            self.failed += [ext.name for ext in self.extensions]
        self.forget_failed_builds()

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as e:      # CompileError, LinkError: this module stays pure Python
            self.announce_failure(e)
            self.failed.append(ext.name)

    def forget_failed_builds(self) -> None:
        """An in-place (`pip install -e`) build puts extensions beside their sources; one that
        failed this time must not leave the last one there.  A build into a build folder
        leaves the source tree alone."""
        if self.inplace or getattr(self, "editable_mode", False):
            for name in self.failed:
                drop_stale_build(name)

    def announce_failure(self, e: Exception) -> None:
        warn("%s: %s" % (type(e).__name__, e))


if __name__ == "__main__":          # as setuptools runs it; tests import the helpers above
    setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
