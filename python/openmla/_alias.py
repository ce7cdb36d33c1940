"""The opt-in alias that serves `import flash_mla` and `import flash_mla.flash_mla_interface`
with openmla.flash_mla (and `import flash_mla.fused_norm_rope_attn_rope_cast` with
openmla.fused_norm_rope_attn_rope_cast), so an engine written for FlashMLA runs on OpenMLA
without code edits.

Each way is opt-in:
  * openmla.install_flash_mla_alias(), before the engine imports flash_mla;
  * OPENMLA_FLASH_MLA_ALIAS=1 in the environment, honoured by `import openmla`, and, where the
    package was installed by pip, from interpreter start: the wheel's
    openmla-flash-mla-alias.pth makes the first `import flash_mla` import openmla
    (python/alias/).
While on, the alias takes precedence over an installed FlashMLA.
"""

from __future__ import annotations

import os
import sys

NAMES = ("flash_mla", "flash_mla.flash_mla_interface")
# FlashMLA's submodules, served by OpenMLA's modules of the same names.
SUBMODULES = {"flash_mla.fused_norm_rope_attn_rope_cast": "fused_norm_rope_attn_rope_cast"}


def requested() -> bool:
    return os.environ.get("OPENMLA_FLASH_MLA_ALIAS", "0").strip().lower() not in (
        "", "0", "false", "no", "off")


def install_flash_mla_alias() -> None:
    """Makes `import flash_mla` and `import flash_mla.flash_mla_interface` give
    openmla.flash_mla (FlashMLA's interface, `__version__` included) from now on."""
    import importlib

    from . import flash_mla

    for name in NAMES:
        sys.modules[name] = flash_mla
    for name, module in SUBMODULES.items():
        sys.modules[name] = importlib.import_module(f"{__package__}.{module}")
