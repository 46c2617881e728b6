"""The device load path (``tensorlist.torch``): chunk plan, staged copies, checks, adapters.

The staging ring runs unchanged on the CPU (ordinary buffers, synchronous
copies), so every rule of the plan and the copy (chunk boundaries inside an
element, one tensor over many chunks, many tensors in one chunk, gaps, empty
tensors, every dtype, CRCs on the staged bytes, truncation while reading) is
tested here on any machine, against local, ``pread``, ``memory://`` and S3
readers. The CUDA cases (pinned buffers, the side stream) are in
``TestCuda`` and skip, with the reason, where there is no CUDA device.
"""
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch", reason="the device load path needs torch (pip install 'tensorlist[torch]')")

import tensorlist as tl  # noqa: E402
import tensorlist.torch as tt  # noqa: E402
from tensorlist import ChecksumError, FormatError  # noqa: E402
from tensorlist._base.dtypes import DTYPES  # noqa: E402
from tensorlist.torch import load_into_device, plan_chunks  # noqa: E402

HYPOTHESIS = settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                            HealthCheck.too_slow])
CUDA = torch.cuda.is_available()


def _bytes(t: torch.Tensor) -> bytes:
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def _arrays(seed=0):
    """One tensor of every dtype (random bytes: NaN payloads and specials included), plus awkward shapes."""
    rng = np.random.default_rng(seed)
    out = {}
    for d in DTYPES:
        n = int(rng.integers(1, 40))
        out[d.name] = rng.integers(0, 256, n * d.numpy.itemsize, dtype=np.uint8).view(d.numpy)
    out["bool"] = rng.integers(0, 2, 11).astype(np.bool_)
    out["scalar"] = np.float64(-0.0)
    out["empty"] = np.zeros((0, 4), np.float32)
    out["big"] = rng.standard_normal((257, 33)).astype(np.float32)
    out["empty_last"] = np.zeros((3, 0), np.int16)
    return out


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("dev") / "m.tl")
    arrays = _arrays()
    tl.save(path, arrays)
    return path, arrays


# --------------------------------------------------------------------------
# the chunk plan

@st.composite
def _layouts(draw):
    n = draw(st.integers(0, 12))
    lengths = draw(st.lists(st.integers(0, 300), min_size=n, max_size=n))
    gaps = draw(st.lists(st.integers(0, 200), min_size=n, max_size=n))
    offsets, at = [], 0
    for g, ln in zip(gaps, lengths):
        at += g
        offsets.append(at)
        at += ln
    perm = draw(st.permutations(range(n)))  # file order need not be offset order
    return [offsets[i] for i in perm], [lengths[i] for i in perm]


@settings(HYPOTHESIS, max_examples=300)
@given(_layouts(), st.integers(1, 400), st.integers(0, 150))
def test_plan_covers_every_byte_once_within_bounded_chunks(layout, chunk_bytes, max_gap):
    offsets, lengths = layout
    chunks = plan_chunks(offsets, lengths, chunk_bytes, max_gap)
    covered = {i: np.zeros(n, np.int64) for i, n in enumerate(lengths)}
    previous_end = -1
    for c in chunks:
        assert 0 < c.length <= chunk_bytes and c.start >= previous_end  # in order, never overlapping
        previous_end = c.start + c.length
        for p in c.pieces:
            assert p.length > 0 and 0 <= p.src and p.src + p.length <= c.length
            # the piece's bytes in the region are the tensor's bytes
            assert c.start + p.src == offsets[p.index] + p.dst
            covered[p.index][p.dst:p.dst + p.length] += 1
    assert all((v == 1).all() for v in covered.values())


def test_plan_keeps_small_neighbours_whole_and_skips_wide_gaps():
    # three 10-byte tensors 64 apart fit one 200-byte chunk; one 2 MiB away starts another
    chunks = plan_chunks([0, 64, 128, 128 + (2 << 20)], [10, 10, 10, 10], 200, max_gap=1 << 20)
    assert [(c.start, c.length, len(c.pieces)) for c in chunks] == [(0, 138, 3), (128 + (2 << 20), 10, 1)]
    # a tensor that would straddle a chunk but fits a fresh one is not split
    chunks = plan_chunks([0, 64], [60, 100], 128)
    assert [[(p.index, p.length) for p in c.pieces] for c in chunks] == [[(0, 60)], [(1, 100)]]
    # one tensor larger than a chunk is split into chunk-sized pieces
    chunks = plan_chunks([0], [250], 100)
    assert [(c.start, c.length) for c in chunks] == [(0, 100), (100, 100), (200, 50)]
    with pytest.raises(ValueError, match="chunk_bytes"):
        plan_chunks([0], [1], 0)


# --------------------------------------------------------------------------
# the staged copy, against every reader

_DTYPES = [d for d in DTYPES]


@st.composite
def _lists(draw):
    n = draw(st.integers(0, 8))
    out = {}
    for i in range(n):
        d = draw(st.sampled_from(_DTYPES))
        shape = tuple(draw(st.lists(st.integers(0, 9), min_size=0, max_size=3)))
        size = int(np.prod(shape)) * d.numpy.itemsize
        raw = draw(st.binary(min_size=size, max_size=size))
        out[f"t{i}"] = np.frombuffer(raw, np.uint8).view(d.numpy).reshape(shape) if size else np.empty(shape, d.numpy)
    return out


@settings(HYPOTHESIS, max_examples=60)
@given(_lists(), st.integers(1, 600), st.integers(1, 4), st.sampled_from([8, 64, 4096]),
       st.booleans(), st.booleans())
def test_staged_copy_equals_the_numpy_load(tmp_path_factory, arrays, chunk_bytes, buffers, alignment, lamp, subset):
    """Any list, any ring: the staged tensors hold exactly the bytes ``tl.load`` maps."""
    path = tmp_path_factory.mktemp("hyp") / "h.tl"
    if lamp and any(a.dtype.itemsize > 8 for a in arrays.values()):
        lamp = False  # lamp's layout cannot hold complex128 at every position (test_lamp.py covers that)
    tl.save(path, list(arrays.values()) if lamp else arrays, **({"lamp": True} if lamp else {"alignment": alignment}))
    want = tl.load(path)
    keys = list(want)[::2] if subset else None
    with tl.open(path, mmap=False) as r:
        got = load_into_device(r, "cpu", keys=keys, chunk_bytes=chunk_bytes, buffers=buffers, verify=not lamp)
    assert list(got) == (keys if keys is not None else list(want))
    for k, t in got.items():
        assert tuple(t.shape) == want[k].shape and _bytes(t) == want[k].tobytes(), k


@pytest.mark.parametrize("mmap", [True, False], ids=["mmap", "pread"])
@pytest.mark.parametrize("chunk_bytes,buffers", [(1, 1), (3, 2), (7, 3), (64, 2), (1000, 3), (32 << 20, 3)])
def test_staged_copy_is_bit_exact_for_every_dtype(saved, mmap, chunk_bytes, buffers):
    path, arrays = saved
    with tl.open(path, mmap=mmap) as r:
        out = load_into_device(r, "cpu", chunk_bytes=chunk_bytes, buffers=buffers, verify=True)
    assert list(out) == list(arrays)
    for k, a in arrays.items():
        assert out[k].dtype == tt.torch_dtype(tl.open(path).info(k).dtype.name)
        assert tuple(out[k].shape) == a.shape
        assert _bytes(out[k]) == np.ascontiguousarray(a).tobytes(), k


def test_staged_copy_from_urls(saved, s3_prefix):
    import fsspec

    path, arrays = saved
    for url in (f"memory://dev-{os.getpid()}/m.tl", f"{s3_prefix}/m.tl"):
        tl.save(url, arrays)
        with tl.open(url) as r:
            out = load_into_device(r, "cpu", chunk_bytes=100, verify=True)
        assert all(_bytes(out[k]) == np.ascontiguousarray(a).tobytes() for k, a in arrays.items())
    fsspec.filesystem("memory").rm(f"/dev-{os.getpid()}", recursive=True)


def test_a_subset_of_keys_of_a_lamp_list(tmp_path):
    rng = np.random.default_rng(1)
    arrays = [rng.standard_normal(5).astype(np.float32), np.arange(3, dtype=np.int8),
              rng.standard_normal((2, 3)).astype(np.float64)]
    tl.save(tmp_path / "l.tl", arrays, lamp=True)
    with tl.open(tmp_path / "l.tl", mmap=False) as r:
        out = load_into_device(r, "cpu", keys=["2", "0"], chunk_bytes=9)
    assert list(out) == ["2", "0"]
    assert np.array_equal(out["2"].numpy(), arrays[2]) and np.array_equal(out["0"].numpy(), arrays[0])


def test_into_writes_the_given_tensors_in_place(saved):
    path, arrays = saved
    dest = torch.zeros(257, 33)
    with tl.open(path, mmap=False) as r:
        out = load_into_device(r, "cpu", keys=["big", "int8"], into={"big": dest}, chunk_bytes=4096)
        assert out["big"] is dest and np.array_equal(dest.numpy(), arrays["big"])
        for bad in (torch.zeros(257, 33, dtype=torch.float64), torch.zeros(33, 257), torch.zeros(33, 257).t()):
            with pytest.raises(ValueError, match="'big'.*destination"):
                load_into_device(r, "cpu", keys=["big"], into={"big": bad})


def test_verify_names_the_corrupt_tensor_even_across_chunks(tmp_path):
    arrays = {"a": np.ones(1000, np.float32), "b": np.arange(5000, dtype=np.float32)}
    tl.save(tmp_path / "c.tl", arrays)
    with tl.open(tmp_path / "c.tl") as r:
        at = r.descriptor.byte_offset + r.info("b").byte_offset + 4096  # inside b's third 2 KiB chunk
        data = r.descriptor.data_path
    with open(data, "r+b") as f:
        f.seek(at)
        f.write(b"\xff")
    with tl.open(tmp_path / "c.tl", mmap=False) as r:
        load_into_device(r, "cpu", chunk_bytes=2048)  # unverified: no error
        with pytest.raises(ChecksumError) as e:
            load_into_device(r, "cpu", chunk_bytes=2048, verify=True)
    assert e.value.tensor_name == "b" and e.value.field == "crc32c" and "c.tl" in str(e.value)
    with pytest.raises(ChecksumError) as e:
        tl.load(tmp_path / "c.tl", device="cpu", verify=True)
    assert e.value.tensor_name == "b"


def test_a_data_file_truncated_while_loading_is_a_format_error(tmp_path):
    arrays = {"a": np.ones(1000, np.float32), "b": np.arange(5000, dtype=np.float32)}
    tl.save(tmp_path / "t.tl", arrays)
    with tl.open(tmp_path / "t.tl", mmap=False) as r:
        os.truncate(r.descriptor.data_path, r.descriptor.byte_offset + r.info("b").byte_offset + 100)
        with pytest.raises(FormatError) as e:
            load_into_device(r, "cpu", chunk_bytes=1024)
    assert e.value.tensor_name == "b" and "truncated" in str(e.value) and "t.tl" in str(e.value)


# --------------------------------------------------------------------------
# Reader.readinto, the primitive the staging uses

def test_readinto_reads_the_region_and_refuses_what_leaves_it(saved):
    path, arrays = saved
    for mmap in (True, False):
        with tl.open(path, mmap=mmap) as r:
            info = r.info("big")
            buf = bytearray(info.byte_length)
            r.readinto(buf, info.byte_offset)
            assert bytes(buf) == arrays["big"].tobytes()
            whole = np.empty(r.descriptor.byte_length, np.uint8)
            r.readinto(whole)
            assert whole[info.byte_offset:info.byte_offset + 8].tobytes() == arrays["big"].tobytes()[:8]
            r.readinto(bytearray(0), r.descriptor.byte_length)  # an empty read at the end is fine
            with pytest.raises(ValueError, match="outside"):
                r.readinto(bytearray(2), r.descriptor.byte_length - 1)
            with pytest.raises(ValueError, match="outside"):
                r.readinto(bytearray(1), -1)
            with pytest.raises(ValueError, match="read-only"):
                r.readinto(b"xxxx", 0)
            with pytest.raises(ValueError, match="contiguous"):
                r.readinto(np.zeros((4, 4), np.uint8)[:, 0], 0)
        with pytest.raises(ValueError, match="closed"):
            r.readinto(bytearray(1), 0)


def test_remote_readinto_matches_local(saved):
    import fsspec

    path, _ = saved
    url = f"memory://ri-{os.getpid()}/m.tl"
    tl.save(url, tl.load(path))
    with tl.open(path) as local, tl.open(url) as remote:
        n = local.descriptor.byte_length
        a, b = np.empty(n - 3, np.uint8), np.empty(n - 3, np.uint8)
        local.readinto(a, 3)
        remote.readinto(b, 3)
        assert a.tobytes() == b.tobytes()
        with pytest.raises(ValueError, match="outside"):
            remote.readinto(bytearray(5), n - 4)
    fsspec.filesystem("memory").rm(f"/ri-{os.getpid()}", recursive=True)


# --------------------------------------------------------------------------
# the public entry points

def test_load_with_a_device_gives_torch_tensors(saved):
    path, arrays = saved
    for mmap in (True, False):
        out = tl.load(path, device="cpu", mmap=mmap)
        assert all(isinstance(t, torch.Tensor) for t in out.values())
        assert all(_bytes(out[k]) == np.ascontiguousarray(a).tobytes() for k, a in arrays.items())
    assert out["big"].numpy().flags.writeable  # mmap=False: private, writable memory
    assert tl.load(path, device=torch.device("cpu"))["bool"].dtype == torch.bool
    assert isinstance(tl.load(path)["big"], np.ndarray)  # no device: numpy, as always
    for bad in ("no-such-device", 3.5, "cuda:x"):
        with pytest.raises(ValueError, match=r"m.tl: .* is not a torch device"):
            tl.load(path, device=bad)


def test_a_device_without_torch_is_a_clear_import_error(saved):
    path, _ = saved
    code = ("import sys; sys.modules['torch'] = None\n"
            "import tensorlist as tl\n"
            f"assert tl.load({path!r})['big'].shape == (257, 33)\n"  # numpy needs no torch
            "try:\n"
            f"    tl.load({path!r}, device='cpu')\n"
            "except ImportError as e:\n"
            "    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "m.tl: loading onto a device needs torch" in out.stdout


def test_module_state_through_the_staging(tmp_path, monkeypatch):
    """load_module_state's accelerator path, run on CPU tensors: in place where the dtype matches, else a cast."""
    import tensorlist.torch as adapters
    import tensorlist.torch as _staging

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(300, 7), torch.nn.BatchNorm1d(7))
    tt.save_module_state(tmp_path / "m.tl", m)
    calls = []
    real = _staging.load_into_device  # tensorlist.torch imports it at the call

    def spy(r, device, **kw):
        calls.append((sorted(kw["keys"]), sorted(kw["into"])))
        return real(r, device, chunk_bytes=512, **kw)

    monkeypatch.setattr(_staging, "load_into_device", spy)
    monkeypatch.setattr(adapters, "_staged", lambda t: True)
    g = torch.nn.Sequential(torch.nn.Linear(300, 7), torch.nn.BatchNorm1d(7))
    g[0].weight.data = g[0].weight.data.double()  # one parameter of another dtype: staged, then cast
    ptrs = {k: v.data_ptr() for k, v in g.state_dict().items()}
    assert tt.load_module_state(tmp_path / "m.tl", g).complete
    names = sorted(m.state_dict())
    assert calls == [(names, [n for n in names if n != "0.weight"])]
    assert {k: v.data_ptr() for k, v in g.state_dict().items()} == ptrs  # written in place
    for k, v in m.state_dict().items():
        assert torch.equal(g.state_dict()[k].to(v.dtype), v), k
    # a partial, non-strict load stages only what matches
    calls.clear()
    h = torch.nn.Sequential(torch.nn.Linear(300, 7))
    result = tt.load_module_state(tmp_path / "m.tl", h, strict=False)
    assert sorted(result.loaded) == ["0.bias", "0.weight"] and calls == [(["0.bias", "0.weight"],) * 2]
    assert torch.equal(h[0].weight, m[0].weight)


@pytest.mark.skipif(CUDA, reason="checks the error where torch sees no CUDA device")
def test_cuda_without_cuda_is_a_clear_error(saved):
    path, _ = saved
    for load in (lambda: tl.load(path, device="cuda"), lambda: tl.load(path, device="cuda:1"),
                 lambda: tt.load_state(path, device=torch.device("cuda", 0))):
        with pytest.raises(RuntimeError, match=r"m.tl: cannot load onto cuda.*(no CUDA|not visible|no CUDA device)"):
            load()


def _dcp_load_through_the_ring(tmp_path, monkeypatch, device):
    """dcp.load with TensorListReader into targets on ``device`` through the staging ring (non-contiguous, cast)."""
    import warnings
    import torch.distributed.checkpoint as dcp
    from tensorlist.dcp import TensorListReader, TensorListWriter
    from tensorlist.dcp import torch_storage
    state = {"w": torch.randn(256, 64), "h": torch.randn(32, 16).bfloat16(), "s": torch.tensor(1.5)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, storage_writer=TensorListWriter(tmp_path))
        for ring_bytes in (256, 32 << 20):  # many buffers in flight, then one
            monkeypatch.setattr(torch_storage, "RING_BYTES", ring_bytes)
            target = {"w": torch.empty(64, 256, device=device).t(), "h": torch.empty(32, 16, device=device),
                      "s": torch.empty((), device=device)}
            reader = TensorListReader(tmp_path)
            dcp.load(target, storage_reader=reader, no_dist=True)
            assert all(v.device.type == device for v in target.values())
            assert torch.equal(target["w"].cpu(), state["w"]) and torch.equal(target["s"].cpu(), state["s"])
            assert torch.equal(target["h"].cpu(), state["h"].float())  # a cast, from the staged bytes
            assert reader.bytes_read == sum(v.numel() * v.element_size() for v in state.values())


def test_a_dcp_load_through_the_ring_on_the_cpu(tmp_path, monkeypatch):
    """The ring path of TensorListReader (what a CUDA target takes) with CPU targets: plain buffers, synchronous."""
    from tensorlist.dcp import torch_storage
    monkeypatch.setattr(torch_storage, "_through_ring", lambda target: True)
    _dcp_load_through_the_ring(tmp_path, monkeypatch, "cpu")


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device: pinned staging buffers and a copy stream")
class TestCuda:
    def test_load_to_cuda_is_bit_exact_for_every_dtype(self, saved):
        path, arrays = saved
        for chunk_bytes in (64, 4096, 32 << 20):
            out = tl.load(path, device="cuda", chunk_bytes=chunk_bytes, verify=True)
            for k, a in arrays.items():
                assert out[k].device.type == "cuda"
                assert _bytes(out[k]) == np.ascontiguousarray(a).tobytes(), k

    def test_adapters_load_straight_into_a_cuda_module(self, tmp_path):
        m = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.LayerNorm(32)).to(torch.bfloat16)
        tt.save_module_state(tmp_path / "m.tl", m)
        g = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.LayerNorm(32)).to(torch.bfloat16).cuda()
        ptrs = {k: v.data_ptr() for k, v in g.state_dict().items()}
        assert tt.load_module_state(tmp_path / "m.tl", g).complete
        assert {k: v.data_ptr() for k, v in g.state_dict().items()} == ptrs  # written in place
        for k, v in m.state_dict().items():
            assert torch.equal(g.state_dict()[k].cpu(), v)
        h = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.LayerNorm(32)).cuda()  # float32: a cast
        assert tt.load_module_state(tmp_path / "m.tl", h).complete
        assert torch.equal(h[0].weight.cpu(), m[0].weight.float())

    def test_a_device_index_past_the_last_is_a_clear_error(self, saved):
        path, _ = saved
        with pytest.raises(RuntimeError, match=r"m.tl: cannot load onto cuda:\d+: torch sees \d+ CUDA devices"):
            tl.load(path, device=f"cuda:{torch.cuda.device_count()}")

    def test_many_chunks_in_flight_overlap_safely(self, tmp_path):
        # more chunks than buffers: a buffer is refilled only after its copies finished
        a = {f"t{i}": torch.randn(1000 + i).numpy() for i in range(200)}
        tl.save(tmp_path / "many.tl", a)
        out = tl.load(tmp_path / "many.tl", device="cuda", chunk_bytes=8192, buffers=2)
        assert all(np.array_equal(out[k].cpu().numpy(), v) for k, v in a.items())

    def test_a_dcp_load_onto_cuda_goes_through_the_ring(self, tmp_path, monkeypatch):
        _dcp_load_through_the_ring(tmp_path, monkeypatch, "cuda")

    def test_peers_agree(self, tmp_path):
        safetensors = pytest.importorskip("safetensors.torch")
        state = {"w": torch.randn(128, 64), "b": torch.randn(64).to(torch.bfloat16)}
        tt.save_module_state(tmp_path / "m.tl", state)
        safetensors.save_file(state, str(tmp_path / "m.safetensors"))
        ours = tl.load(tmp_path / "m.tl", device="cuda")
        theirs = safetensors.load_file(str(tmp_path / "m.safetensors"), device="cuda")
        assert all(torch.equal(ours[k], theirs[k]) for k in state)
