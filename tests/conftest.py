"""Fixtures shared by the test modules.

Nothing here imports torch, fsspec, s3fs or moto at module level: without them
the tests that do not need them still collect and run, and those that do skip
with a reason.

- ``_one_thread`` (autouse, per module): one torch thread for the modules that
  import torch.
- ``unused_port``: a free TCP port on 127.0.0.1.
- ``s3`` (per module): a moto S3 server on loopback, with the environment that
  points s3fs (and a ``python -m tensorlist`` child) at it; ``s3_prefix``: a
  fresh ``s3://bucket/xxxxxxxx`` folder in it.
"""
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")

import socket
import sys
import types
import uuid

import pytest

# The helper scripts and support modules (tests/support/: _ddp_script.py, _loop_script.py, _fuzz_worker.py,
# _record_support.py...) are run as children or imported by tests by their bare names, and hold no
# doctests: collecting them under --doctest-modules would import them here, and the training scripts set
# torch's thread count for the whole session when imported.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))
# The corpus generator is a script too (test_conformance runs it where the installed ml_dtypes has every
# dtype): importing it for doctests would fail collection where ml_dtypes lacks one (0.4: float8_e8m0fnu).
collect_ignore = ["support", "conformance/make_corpus.py"]

#: The bucket the ``s3`` fixture creates.
S3_BUCKET = "tensorlist-tests"


@pytest.fixture(autouse=True, scope="module")
def _one_thread(request):
    """Tiny models run fastest on one thread (several spin against each other on a small machine).

    Acts only in test modules that import torch themselves (a module-level
    ``torch`` name), so that the other modules never import it.
    """
    torch = getattr(request.module, "torch", None)
    if not isinstance(torch, types.ModuleType) or not hasattr(torch, "set_num_threads"):
        yield
        return
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def unused_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (free when asked; a race is unlikely)."""
    return _free_port()


@pytest.fixture(scope="module")
def s3():
    """A moto S3 server on 127.0.0.1 (a thread of this process) holding one empty bucket.

    While the module runs, ``AWS_*`` variables (``AWS_ENDPOINT_URL`` included)
    point s3fs, and any ``python -m tensorlist`` child given ``s3["env"]``, at it.

    Yields:
        dict with ``fs`` (an s3fs filesystem on the server), ``endpoint``
        (``http://127.0.0.1:port``), ``env`` (the variables set) and
        ``bucket`` (its name).
    """
    moto_server = pytest.importorskip("moto.server", reason="the S3 tests need moto[server]")
    s3fs = pytest.importorskip("s3fs", reason="the S3 tests need s3fs")
    port = _free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "testing",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": endpoint}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        # s3fs caches filesystems by their arguments, not by the endpoint the environment names:
        # one made for an earlier module's server would still talk to that (stopped) server
        s3fs.S3FileSystem.clear_instance_cache()
        fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": endpoint})
        # moto keeps its buckets in this process, across servers: an earlier module's may be here
        fs.makedirs(S3_BUCKET, exist_ok=True)
        yield {"fs": fs, "endpoint": endpoint, "env": env, "bucket": S3_BUCKET}
    finally:
        server.stop()
        s3fs.S3FileSystem.clear_instance_cache()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture
def s3_prefix(s3) -> str:
    """A fresh folder URL in the ``s3`` server's bucket: ``s3://tensorlist-tests/1a2b3c4d``."""
    return f"s3://{s3['bucket']}/{uuid.uuid4().hex[:8]}"
