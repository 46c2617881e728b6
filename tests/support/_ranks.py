"""Launching the ranks of a gloo process group on 127.0.0.1, for the tests that start several processes.

- ``free_port()``: a TCP port on 127.0.0.1 that nothing listens on (the group's ``tcp://`` rendezvous).
- ``join(rank, world, port, **kw)``: run in a rank, joins the gloo group of that port.
- ``Launch(world)``: the ranks of one group, started in rank order, each a new interpreter (``spawn``) or a
  fork of this process (``fork``), each writing its output to a file of its own. ``wait`` stops them as a
  scheduler stops a job: once a rank ends with an error or a signal, or at the deadline, it SIGKILLs the
  ranks still running (they would wait on a collective for their dead peer). Leaving the ``with`` block
  SIGKILLs whatever still runs.
- ``run_script(script, mode, world, root)``: the convention of the test files that are their own worker:
  ranks of ``python SCRIPT MODE RANK WORLD PORT ROOT``, each of which must exit 0.
"""
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (free when asked; a race is unlikely)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def join(rank, world, port, **kw):
    """Joins rank ``rank`` of ``world`` to the gloo group that meets on ``port`` (kw: init_process_group's)."""
    import torch.distributed as dist  # here, so that importing this module never imports torch
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, **kw)


class _Fork:
    """A forked rank, with the part of subprocess.Popen's interface that Launch uses."""

    def __init__(self, pid):
        self.pid, self.returncode = pid, None

    def poll(self):
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self):
        if self.returncode is None:
            self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
        return self.returncode

    def kill(self):  # only while not reaped, so the pid is still this child's
        os.kill(self.pid, signal.SIGKILL)


class Launch:
    """The processes of one launch, ``procs[rank]``; exit statuses as Popen's (negative: the signal).

    Args:
        world: the number of ranks.
        logs: a path for each rank's output (kept afterwards); by default anonymous temporary files.
    """

    def __init__(self, world, logs=None):
        self.world, self.port, self.procs = world, free_port(), []
        self._outs = [open(p, "w+") for p in logs] if logs else [tempfile.TemporaryFile("w+") for _ in range(world)]

    def spawn(self, argv, env=None):
        """Starts the next rank: the command ``argv``, with its stdout and stderr in the rank's file."""
        out = self._outs[len(self.procs)]
        self.procs.append(subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env))

    def fork(self, fn):
        """Starts the next rank as a fork running ``fn()``: it exits 0 if fn returns, 1 (traceback logged) if not.

        A fork starts in milliseconds where a new interpreter needs seconds to import torch.
        """
        out = self._outs[len(self.procs)]
        sys.stdout.flush()  # or the child would write this process's buffered output again
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.dup2(out.fileno(), 1)
                os.dup2(out.fileno(), 2)
                fn()
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        self.procs.append(_Fork(pid))

    def wait(self, timeout):
        """Waits until every rank has ended, a rank has failed, or ``timeout`` seconds; then ``stop()``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            codes = [p.poll() for p in self.procs]  # every rank, each time: any of them may be the one that failed
            if None not in codes or any(c not in (None, 0) for c in codes):
                break
            time.sleep(0.05)
        return self.stop()

    def stop(self):
        """SIGKILLs the ranks still running and waits for all of them; their exit statuses."""
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        return [p.wait() for p in self.procs]

    def output(self, rank):
        """What rank ``rank`` has written to stdout and stderr."""
        out = self._outs[rank]
        out.seek(0)
        return out.read()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        for out in self._outs:
            out.close()


def spawn_script(job, script, mode, root, env=None):
    """Starts every rank of ``job`` as ``python SCRIPT MODE RANK WORLD PORT ROOT``, one thread, warnings off."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", **(env or {}))
    # a test module run as a script imports the support modules (this directory) by name, as under pytest
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.dirname(os.path.abspath(__file__)),
                                                      env.get("PYTHONPATH")]))
    for r in range(job.world):
        job.spawn([sys.executable, os.path.abspath(script), mode, str(r), str(job.world), str(job.port), str(root)],
                  env)


def run_script(script, mode, world, root, env=None, timeout=240):
    """Runs ``world`` ranks of ``script`` (see ``spawn_script``) as ``Launch.wait`` does; each must exit 0."""
    with Launch(world) as job:
        spawn_script(job, script, mode, root, env)
        codes = job.wait(timeout)
        # the rank that failed first, not one that stop() killed afterwards (-SIGKILL) because it had
        bad = [r for r, c in enumerate(codes) if c not in (0, -signal.SIGKILL)] or [r for r, c in enumerate(codes) if c]
        for r in bad[:1]:
            raise AssertionError(f"rank {r} of {mode} on {world} ended with {codes[r]} (all: {codes}):\n"
                                 f"{job.output(r)[-4000:]}")


def exit_now(code: int = 0) -> None:
    """Ends a rank at once, after flushing its output: no interpreter teardown.

    torch 2.13's gloo can abort a rank during teardown even after ``destroy_process_group``
    ("terminate called without an active exception", SIGABRT: seen in CI for a rank that had
    finished its work), so a rank whose results are written and closed leaves this way.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
