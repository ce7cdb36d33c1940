"""The context-parallel example's distributed path for real: 2 and 3 processes under torchrun,
each decoding its shard on the CPU backend, all-gathering (out, lse) through torch.distributed
(gloo) and merging; rank 0 checks the merge against one decode over the whole cache. The NCCL
run on GPUs is tools/device_check.sh's context_nccl step (issue 6)."""
import os
import pathlib
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: the torchrun test is skipped")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("this torch has no gloo backend", allow_module_level=True)

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "context_parallel_decode.py"


@pytest.mark.parametrize("ranks", [2, 3])
def test_torchrun_gloo_shards_merge_to_one_decode(ranks):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
         str(ranks), str(EXAMPLE), "--device", "cpu", "--batch", "2", "--s-q", "2", "--heads",
         "16", "--seqlen", "1001", "--page-size", "16", "--iters", "2"],
        capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert f"{ranks} ranks (GLOO)" in result.stdout, result.stdout
    assert "context-parallel vs one-device decode" in result.stdout
    assert "-> OK" in result.stdout, result.stdout
