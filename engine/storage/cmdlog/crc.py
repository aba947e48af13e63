"""CRC-32C for the command log: the `crc32c` package's compiled function, without the package.

`import crc32c` runs the package's __init__, which reads its own version through
importlib.metadata and loads its command line (email, csv, zipfile, argparse, ...): about
0.9 MB of heap in the supervisor, which every forked process inherits, for nothing the
server uses.  So the extension module is loaded straight from the package's directory;
where that is not possible (another layout of the package), the ordinary import serves.
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import os

__all__ = ["crc32c"]


def _extension():
    spec = importlib.util.find_spec("crc32c")         # finds the package without running it
    for where in (spec.submodule_search_locations or []) if spec else []:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = os.path.join(where, "_crc32c" + suffix)
            if os.path.exists(path):
                loader = importlib.machinery.ExtensionFileLoader("crc32c._crc32c", path)
                ext_spec = importlib.util.spec_from_file_location("crc32c._crc32c", path, loader=loader)
                module = importlib.util.module_from_spec(ext_spec)
                loader.exec_module(module)
                return module.crc32c
    return None


crc32c = _extension()
if crc32c is None:
    from crc32c import crc32c           # noqa: F811 (the package as published, at its full cost)
