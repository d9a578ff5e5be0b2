"""Shared by .ci/test-jupyter-server and .ci/test-notebook-browser (and the
warm-up .ci/warm-evcxr): the repository's paths, the error text a notebook
output must not contain, timed steps that name the step that failed, a guard
that keeps a notebook byte-identical, and `Server`, which starts the README's
launch command (`.ci/jupyter --no-browser --port=P --IdentityProvider.token=T`)
in its own process group, talks to its REST API, and always stops it and
every process it started. Standard library only at import time (psutil,
which Jupyter brings, is used only when stopping)."""
import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = REPO / "notebooks"
VENV = Path(os.environ.get("OVERLAP_LAB_VENV", Path.home() / ".cache/overlap-lab/venv"))
# Same directory as .ci/test, .ci/jupyter and the warm-up in .ci/setup.
EVCXR_TMPDIR = os.environ.get("EVCXR_TMPDIR", str(REPO / "target-evcxr"))
# evcxr reports panics and `?` errors only as text (see pitfalls.md).
ERROR_TEXT = re.compile(r"panicked at|\bError:|error\[E|^error:", re.M)
DEP_CELL = ':dep overlap-lab = { path = "../crate" }'
# evcxr_jupyter prints this on its own stdout at every kernel start where no
# evcxr.toml is found (in the kernel's directory or $EVCXR_CONFIG_DIR). It
# loads its configuration never quietly: with a file it would print the
# file's path instead, so no setting prevents the line; kernel_stdout()
# drops exactly this line and nothing else.
EVCXR_NO_CONFIG = b"No configuration file found, use the default configuration"


@contextlib.contextmanager
def kernel_stdout():
    """A file descriptor to give a kernel as its stdout (nbclient passes
    `stdout=` on to the kernel's Popen): every line it writes is copied to
    our stdout, except evcxr's EVCXR_NO_CONFIG line, which reads like a
    failure in a test log and is none."""
    read_end, write_end = os.pipe()

    def relay():
        with os.fdopen(read_end, "rb") as kernel_out:
            for line in kernel_out:
                if line.rstrip(b"\r\n") != EVCXR_NO_CONFIG:
                    sys.stdout.buffer.write(line)
                    sys.stdout.buffer.flush()

    thread = threading.Thread(target=relay, daemon=True)
    thread.start()
    try:
        yield write_end
    finally:
        # The kernel has stopped: its copy of the pipe is closed, so the
        # relay sees the end once ours is (a process the kernel left behind
        # may hold it open: then the relay is left to end with us).
        os.close(write_end)
        thread.join(timeout=5)


@contextlib.contextmanager
def ticking(prog, what, every=15):
    """Prints "PROG: WHAT: N s so far" every `every` seconds until the block
    ends, so a long wait (a cold build in a kernel) never looks hung."""
    done = threading.Event()
    t0 = time.monotonic()

    def tick():
        while not done.wait(every):
            print(f"{prog}: {what}: {time.monotonic() - t0:.0f} s so far", flush=True)

    thread = threading.Thread(target=tick, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def in_venv():
    """Re-executes this script with the project venv's Python unless it already
    runs there, so the tests work however they are invoked."""
    py = VENV / "bin" / "python"
    if Path(sys.prefix).resolve() != VENV.resolve():
        if not py.exists():
            sys.exit(f"{Path(sys.argv[0]).name}: no venv at {VENV}: run .ci/setup --notebooks first")
        os.execv(str(py), [str(py), *sys.argv])


class StepFailed(Exception):
    def __init__(self, step, error):
        super().__init__(f"step '{step}' failed: {error}")
        self.step = step


class Steps:
    """`with steps.step("name"):` prints the step, its time, and turns any
    exception into StepFailed naming it."""

    def __init__(self, prog):
        self.prog = prog
        self.t0 = time.monotonic()
        self.times = {}

    @contextlib.contextmanager
    def step(self, name):
        t = time.monotonic()
        print(f"{self.prog}: {name} ...", flush=True)
        try:
            yield
        except StepFailed:
            raise
        except BaseException as e:  # KeyboardInterrupt too: it still names the step
            raise StepFailed(name, f"{type(e).__name__}: {e}") from e
        dt = time.monotonic() - t
        self.times[name] = dt
        print(f"{self.prog}: {name}: ok ({dt:.1f} s)", flush=True)

    def total(self):
        return time.monotonic() - self.t0


def run_main(prog, body):
    """Runs body(steps); exits 0 on success, 1 with the failed step named."""
    steps = Steps(prog)
    try:
        body(steps)
    except StepFailed as e:
        print(f"{prog}: FAILED: {e} (after {steps.total():.1f} s)", flush=True)
        sys.exit(1)
    print(f"{prog}: passed in {steps.total():.1f} s", flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Fatal(Exception):
    """Raised by a wait_for predicate to stop waiting at once."""


def wait_for(what, predicate, timeout, interval=0.25):
    """Polls predicate() until it returns a true value (returned) or timeout.
    Other errors count as 'not yet' (the last is reported); Fatal stops."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except Fatal:
            raise
        except Exception as e:
            last = e
        time.sleep(interval)
    raise TimeoutError(f"{what}: not within {timeout} s" + (f" (last error: {last})" if last else ""))


@contextlib.contextmanager
def notebook_unchanged(path):
    """Saves a notebook's bytes; afterwards restores them if a Jupyter UI
    changed the file (autosave) and removes the checkpoint it may have made.
    Raises if the bytes could not be restored. Only this file and its new
    checkpoint are touched, nothing else under notebooks/."""
    path = Path(path)
    before = path.read_bytes()
    ckpt_dir = path.parent / ".ipynb_checkpoints"
    ckpt = ckpt_dir / f"{path.stem}-checkpoint{path.suffix}"
    had_dir, had_ckpt = ckpt_dir.exists(), ckpt.exists()
    try:
        yield
    finally:
        notes = []
        try:
            if not path.exists() or path.read_bytes() != before:
                path.write_bytes(before)
                notes.append(f"restored {path.relative_to(REPO)} (Jupyter had changed it)")
            if ckpt.exists() and not had_ckpt:
                ckpt.unlink()
                notes.append(f"removed new {ckpt.relative_to(REPO)}")
            if ckpt_dir.exists() and not had_dir and not any(ckpt_dir.iterdir()):
                ckpt_dir.rmdir()
            ok = path.read_bytes() == before
        except OSError as e:
            notes.append(str(e))
            ok = False
        for n in notes:
            print(f"notebook guard: {n}", flush=True)
        if not ok:
            raise RuntimeError(f"COULD NOT RESTORE {path}: it is not byte-identical to before the test")


class Server:
    """The README's launch command, headless, on a free port with a random
    token. Jupyter's runtime, settings and workspace dirs are private
    temporary ones, so a test neither reads nor writes the user's."""

    def __init__(self, log_path, lab_settings=None):
        self.port = free_port()
        self.token = secrets.token_urlsafe(24)
        self.url = f"http://127.0.0.1:{self.port}"
        self.command = [str(REPO / ".ci/jupyter"), "--no-browser", f"--port={self.port}",
                        f"--IdentityProvider.token={self.token}"]
        self.log_path = Path(log_path)
        self.lab_settings = lab_settings or {}
        self.proc = None
        self.tmp = None
        self.seen = {}  # pid -> psutil.Process (which refuses a reused pid)

    def start(self):
        self.tmp = tempfile.mkdtemp(prefix="overlap-lab-jupyter-")
        settings = Path(self.tmp, "lab-settings")
        for plugin, values in self.lab_settings.items():  # e.g. "@jupyterlab/docmanager-extension/plugin"
            f = settings / f"{plugin}.jupyterlab-settings"
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(json.dumps(values))
        env = dict(os.environ, EVCXR_TMPDIR=EVCXR_TMPDIR,
                   JUPYTER_RUNTIME_DIR=str(Path(self.tmp, "runtime")),
                   JUPYTERLAB_SETTINGS_DIR=str(settings),
                   JUPYTERLAB_WORKSPACES_DIR=str(Path(self.tmp, "workspaces")))
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log = open(self.log_path, "wb")
        print(f"  $ {' '.join(self.command[:-1])} --IdentityProvider.token=<random>   (log: {self.log_path})",
              flush=True)
        self.proc = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=self.log,
                                     stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def log_tail(self, n=15):
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def wait_ready(self, timeout=60):
        def up():
            if self.proc.poll() is not None:
                raise Fatal(f"server exited with code {self.proc.returncode}:\n{self.log_tail()}")
            return self.api("GET", "/api/status", timeout=2)
        return wait_for("server /api/status", up, timeout)

    def api(self, method, path, body=None, timeout=30):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Authorization": f"token {self.token}",
                                              "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
        return json.loads(raw) if raw else {}

    def ws_url(self, path):
        return f"ws://127.0.0.1:{self.port}{path}?token={self.token}"

    def remember_children(self):
        """Notes the server's child processes (kernels run in sessions of
        their own, so the process group does not reach them)."""
        if self.proc and self.proc.poll() is None:
            with contextlib.suppress(Exception):
                import psutil
                for p in psutil.Process(self.proc.pid).children(recursive=True):
                    self.seen.setdefault(p.pid, p)

    def stop(self):
        """POST /api/shutdown; if the server still runs, SIGTERM then SIGKILL
        its process group; then kill any child process seen that is still
        alive (by pid, checked by psutil). Safe to call twice."""
        if self.proc is None:
            return
        self.remember_children()
        if self.proc.poll() is None:
            with contextlib.suppress(Exception):
                self.api("POST", "/api/shutdown", timeout=10)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(20)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if self.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, sig)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(10)
        survivors = []
        for pid, p in self.seen.items():
            with contextlib.suppress(Exception):  # psutil.NoSuchProcess: it is gone, good
                if p.is_running() and p.status() != "zombie":
                    survivors.append(f"{pid} {p.name()}")
                    p.kill()
        if survivors:
            print(f"  killed leftover processes of the server: {', '.join(survivors)}", flush=True)
        self.log.close()
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.proc = None

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()
