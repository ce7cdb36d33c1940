"""Installed next to the `openmla` package with openmla-flash-mla-alias.pth, which runs
install_finder() at interpreter start. With OPENMLA_FLASH_MLA_ALIAS=1 in the environment, the
first `import flash_mla` (or `import flash_mla.flash_mla_interface`) imports openmla and is
served by openmla.flash_mla; without it nothing happens. Nothing is imported up front."""

import importlib.abc
import importlib.util
import os
import sys

NAMES = ("flash_mla", "flash_mla.flash_mla_interface", "flash_mla.fused_norm_rope_attn_rope_cast")


def requested() -> bool:
    return os.environ.get("OPENMLA_FLASH_MLA_ALIAS", "0").strip().lower() not in (
        "", "0", "false", "no", "off")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname not in NAMES:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        # The import system returns what sys.modules holds after this: openmla.flash_mla.
        import openmla

        openmla.install_flash_mla_alias()


def install_finder() -> None:
    if requested() and not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
