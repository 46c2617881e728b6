"""``dcp.async_save`` with torch's own stagers and executors, writing through TensorListWriter.

``DefaultStager(StagingOptions(...))`` (shared memory; pinned memory only with CUDA), its
``AsyncSaveResponse`` (``use_async_staging``), and ``async_checkpointer_type=PROCESS`` (the writer is sent to
a background process that saves there). Each save comes back bit for bit through ``read_full`` and
``dcp.load``. Where this torch lacks these (torch 2.8 has no ``DefaultStager``), the tests skip saying so.
"""
import io
import socket
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="dcp.async_save needs torch")
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint import staging  # noqa: E402

from tensorlist.dcp import TensorListReader, TensorListWriter, read_full  # noqa: E402
from _paths import SUPPORT

if not hasattr(staging, "DefaultStager") or not hasattr(staging, "StagingOptions"):
    pytest.skip(f"torch {torch.__version__} has no DefaultStager/StagingOptions (torch >= 2.9)",
                allow_module_level=True)
try:
    from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType, AsyncSaveResponse
except ImportError:
    pytest.skip(f"torch {torch.__version__} has no AsyncSaveResponse (torch >= 2.9)", allow_module_level=True)

CUDA = torch.cuda.is_available()
# (pinned, shared, async staging, non-blocking copy): pinned memory and async staging's copies need CUDA
OPTIONS = [(False, False, False, False), (False, True, False, False), (False, True, True, False)]
if CUDA:
    OPTIONS.append((True, True, True, True))


def state():
    g = torch.Generator().manual_seed(0)
    return {"w": torch.randn(64, 32, generator=g), "h": torch.randn(8, 8, generator=g).bfloat16(), "step": 11,
            "blob": b"\x00raw\xff", "buf": io.BytesIO(b"stream"), "cfg": {"betas": (0.9, 0.99)}}


def check(path, sd):
    full = read_full(path)
    assert np.array_equal(full["w"], sd["w"].numpy()) and full["step"] == 11 and full["blob"] == b"\x00raw\xff"
    assert full["buf"].getvalue() == b"stream" and full["cfg.betas"] == (0.9, 0.99)
    back = {"w": torch.zeros(64, 32), "h": torch.zeros(8, 8, dtype=torch.bfloat16), "step": 0, "blob": b"",
            "buf": io.BytesIO(), "cfg": {"betas": None}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(back, storage_reader=TensorListReader(path))
    assert torch.equal(back["w"], sd["w"]) and torch.equal(back["h"], sd["h"]) and back["blob"] == sd["blob"]
    assert isinstance(back["buf"], io.BytesIO) and back["buf"].getvalue() == b"stream"
    assert back["cfg"] == {"betas": (0.9, 0.99)} and back["step"] == 11


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
@pytest.mark.parametrize("options", OPTIONS, ids=["plain", "shared", "shared+async"] + (["pinned"] if CUDA else []))
def test_async_save_with_the_default_stager_on_a_thread(tmp_path, options):
    sd = state()
    stager = staging.DefaultStager(staging.StagingOptions(*options))
    try:
        r = dcp.async_save(sd, storage_writer=TensorListWriter(tmp_path), async_stager=stager,
                           async_checkpointer_type=AsyncCheckpointerType.THREAD)
        if options[2]:
            assert isinstance(r, AsyncSaveResponse)
            r.staging_completion.result(timeout=60)
            r.upload_completion.result(timeout=60)
        else:
            r.result(timeout=60)
    finally:
        stager.close()
    check(tmp_path, sd)


CHILD = textwrap.dedent("""
    import socket, sys, warnings
    import torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import staging
    from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType, AsyncSaveResponse
    from tensorlist.dcp import TensorListWriter
    sys.path.insert(0, sys.argv[2])
    from test_dcp_async import state

    if __name__ == "__main__":
        warnings.simplefilter("ignore")
        torch.set_num_threads(1)
        s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
        for i, opts in enumerate([(False, False, False, False), (False, True, True, False)]):
            stager = staging.DefaultStager(staging.StagingOptions(*opts))
            r = dcp.async_save(state(), storage_writer=TensorListWriter(f"{sys.argv[1]}/{i}"), async_stager=stager,
                               async_checkpointer_type=AsyncCheckpointerType.PROCESS)
            (r.upload_completion if isinstance(r, AsyncSaveResponse) else r).result(timeout=120)
            stager.close()
            print("saved", i, type(r).__name__, flush=True)
        dist.destroy_process_group()
        import os; os._exit(0)  # the executor's background process is torch's to end
""")


@pytest.mark.slow
def test_async_save_sends_the_writer_to_a_background_process(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    import os
    # the child imports this module (its folder) and, through it, the support modules
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [SUPPORT, os.environ.get("PYTHONPATH")])))
    out = subprocess.run([sys.executable, str(script), str(tmp_path), os.path.dirname(os.path.abspath(__file__))],
                         capture_output=True, text=True, timeout=180, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "saved 0 Future" in out.stdout and "saved 1 AsyncSaveResponse" in out.stdout
    for i in range(2):
        check(tmp_path / str(i), state())
