"""Hostile programs, one a test: each is contained with the right status, leaves nothing on the host, and this
(training) process goes on. Limits are small so that the whole file runs in seconds."""

from __future__ import annotations

import os
import resource
import signal
import socket
import subprocess
import threading
import time

from rlhfkit.sandbox.run import UID_BASE

from .host import processes_with, sandbox_processes, sandbox_uid_processes, wait_until_gone


def assert_nothing_left() -> None:
    assert wait_until_gone(sandbox_processes) == []
    if os.geteuid() == 0:  # bubblewrap started as root runs programs as user ids from UID_BASE up
        assert wait_until_gone(lambda: sandbox_uid_processes(UID_BASE)) == []


def test_a_plain_program_runs_and_reads_its_stdin(sandbox):
    result = sandbox("import sys\nprint(sys.stdin.read().upper())", stdin="hello")
    assert (result.status, result.exit_code, result.stdout, result.stderr) == ("ok", 0, "HELLO\n", "")
    assert result.sandboxed and not result.truncated
    assert_nothing_left()


def test_an_exception_is_an_error_with_its_traceback(sandbox):
    result = sandbox("raise ValueError('nope')")
    assert (result.status, result.exit_code) == ("error", 1)
    assert "ValueError: nope" in result.stderr
    assert_nothing_left()


def test_infinite_loop_times_out(sandbox):
    start = time.monotonic()
    result = sandbox("while True:\n    pass", timeout_s=1)
    assert (result.status, result.exit_code) == ("timeout", None)
    assert 1 <= result.seconds < 2 and time.monotonic() - start < 3
    assert_nothing_left()


def test_ignoring_sigterm_does_not_help(sandbox):
    code = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\ntime.sleep(60)"
    result = sandbox(code, timeout_s=1)
    assert (result.status, result.stdout) == ("timeout", "ready\n")
    assert result.seconds < 2
    assert_nothing_left()


def test_memory_bomb_hits_the_memory_limit(sandbox):
    code = "chunks = []\nwhile True:\n    chunks.append(bytearray(10 ** 7))"
    result = sandbox(code, memory_mb=128)
    assert (result.status, result.exit_code) == ("memory", 1)
    assert result.stderr.rstrip().endswith("MemoryError")
    assert_nothing_left()


def test_fork_bomb_is_capped_and_dies_with_the_sandbox(sandbox):
    code = """\
import os
children = 0
refused = 0
while children + refused < 10_000:
    try:
        if os.fork() == 0:
            while True:
                pass
        children += 1
    except OSError:
        refused += 1
print(children, refused, flush=True)
while True:
    pass
"""
    result = sandbox(code, timeout_s=1.5, max_processes=8)
    assert result.status == "timeout"
    children, refused = map(int, result.stdout.split())
    # itself and its children make max_processes; started by an ordinary user, bubblewrap's own PID 1 counts too
    assert children == (7 if os.geteuid() == 0 else 6)
    assert refused > 0
    assert_nothing_left()
    assert subprocess.run(["true"]).returncode == 0  # the host can still start processes


def test_double_forked_daemon_dies_and_never_writes(sandbox, tmp_path):
    marker = f"rlhfkit-daemon-{os.getpid()}-{time.monotonic_ns()}"
    target = tmp_path / "written-later"
    code = f"""\
import os
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv("/bin/sh", ["sh", "-c", "sleep 1; echo pwned > {target}; echo pwned > /tmp/later", "{marker}"])
    os._exit(0)
print("parent done")
"""
    result = sandbox(code)
    assert (result.status, result.stdout) == ("ok", "parent done\n")
    assert wait_until_gone(lambda: processes_with(marker.encode())) == []
    time.sleep(1.5)  # past the daemon's sleep: had it survived, it would have written by now
    assert not target.exists()
    assert processes_with(marker.encode()) == []
    assert_nothing_left()


def test_host_files_tokens_and_environment_are_out_of_reach(sandbox, tmp_path, monkeypatch):
    token = "hf_" + "x" * 20 + str(os.getpid())
    home = tmp_path / "home"
    (home / ".cache" / "huggingface").mkdir(parents=True)
    (home / ".cache" / "huggingface" / "token").write_text(token)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("HF_TOKEN", token)
    monkeypatch.setenv("SECRET_API_KEY", token)
    paths = [
        str(home / ".cache" / "huggingface" / "token"),
        "~/.cache/huggingface/token",
        "/root/.cache/huggingface/token",
        "/etc/passwd",
        "/etc/shadow",
        os.getcwd(),
        "/work",
        "/home",
        "/proc/1/environ",
    ]
    code = f"""\
import os
print(sorted(os.environ))
for path in {paths!r}:
    path = os.path.expanduser(path)
    try:
        with open(path) if not os.path.isdir(path) else open(os.devnull) as f:
            print("READ", path, os.listdir(path) if os.path.isdir(path) else f.read())
    except OSError as e:
        print("DENIED", path, type(e).__name__)
"""
    result = sandbox(code)
    assert result.status == "ok", result.stderr
    assert token not in result.stdout + result.stderr
    assert "HF_TOKEN" not in result.stdout and "SECRET_API_KEY" not in result.stdout
    assert result.stdout.count("DENIED") == len(paths) and "READ" not in result.stdout
    assert_nothing_left()


def test_writing_outside_its_directory_fails_and_leaves_nothing(sandbox, tmp_path):
    host_dir = tmp_path / "host"
    host_dir.mkdir()
    targets = [
        str(host_dir / "x"),
        "/x",
        "/usr/x",
        "/root/x",
        "/sandbox/x",
        "/dev/x",
        "/dev/shm/x",
        "/proc/sys/kernel/hostname",
    ]
    code = f"""\
import os
for path in {targets!r}:
    try:
        with open(path, "w") as f:
            f.write("pwned")
        print("WROTE", path)
    except OSError as e:
        print("DENIED", path, type(e).__name__)
with open("/tmp/mine", "w") as f:
    f.write("fine")
print("OWN", os.listdir("/tmp"))
"""
    result = sandbox(code)
    assert result.status == "ok", result.stderr
    assert "WROTE" not in result.stdout
    assert result.stdout.count("DENIED") == len(targets)
    assert "OWN ['mine']" in result.stdout
    assert list(host_dir.iterdir()) == []
    assert_nothing_left()


def test_a_server_on_the_host_loopback_is_unreachable(sandbox):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.2)
    port = server.getsockname()[1]
    accepted, done = [], threading.Event()

    def accept() -> None:
        while not done.is_set():
            try:
                accepted.append(server.accept())
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept)
    thread.start()
    code = f"""\
import socket
for host in ("127.0.0.1", "localhost", "::1"):
    try:
        socket.create_connection((host, {port}), timeout=1).sendall(b"pwned")
        print("CONNECTED", host)
    except OSError as e:
        print("REFUSED", host, type(e).__name__)
"""
    try:
        result = sandbox(code)
    finally:
        time.sleep(0.3)  # a connection that got through would be accepted within this
        done.set()
        thread.join()
        server.close()
    assert result.status == "ok", result.stderr
    assert "CONNECTED" not in result.stdout and result.stdout.count("REFUSED") == 3
    assert accepted == []
    assert_nothing_left()


def test_killing_its_parent_and_everything_it_can_reach(sandbox):
    bystander = subprocess.Popen(["sleep", "30"])  # a host process it must not reach
    code = """\
import os, signal
for pid in (os.getppid(), 1, -1):
    try:
        os.kill(pid, signal.SIGKILL)
        print("SENT", pid)
    except OSError as e:
        print("DENIED", pid, type(e).__name__)
print("still here")
"""
    try:
        result = sandbox(code)
        assert result.status == "ok", result.stderr
        assert result.stdout.endswith("still here\n")
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()
    os.kill(os.getpid(), 0)  # and this process is alive
    assert_nothing_left()


def test_printing_a_gigabyte_is_cut_at_the_output_limit(sandbox):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.monotonic()
    code = "import sys\nline = 'x' * 1023 + '\\n'\nfor _ in range(1 << 20):\n    sys.stdout.write(line)"
    result = sandbox(code, max_output_bytes=1 << 16)
    assert (result.status, result.exit_code, result.truncated) == ("output_limit", None, True)
    assert len(result.stdout) == 1 << 16 and set(result.stdout) == {"x", "\n"}
    assert time.monotonic() - start < 3
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 64 * 1024  # the gigabyte never passed through this process's memory
    assert_nothing_left()


def test_stderr_has_the_same_cap(sandbox):
    result = sandbox("import sys\nwhile True:\n    sys.stderr.write('e' * 4096)", max_output_bytes=10_000)
    assert (result.status, len(result.stderr), result.stdout) == ("output_limit", 10_000, "")


def test_filling_its_disk_stops_at_the_disk_limit(sandbox):
    code = """\
i = 0
while True:
    with open(f"/tmp/fill{i}", "wb") as f:
        f.write(b"x" * (1 << 20))
    i += 1
"""
    result = sandbox(code, disk_mb=4)
    assert result.status == "disk", result.stderr
    assert "No space left on device" in result.stderr
    assert_nothing_left()


def test_one_file_past_the_disk_limit_is_refused(sandbox):
    result = sandbox("open('/tmp/big', 'wb').write(b'x' * (8 << 20))", disk_mb=4)
    assert result.status == "disk" and "File too large" in result.stderr


def test_new_user_namespaces_are_refused(sandbox):
    code = """\
import os
try:
    os.unshare(os.CLONE_NEWUSER)
    print("UNSHARED")
except AttributeError:  # Python < 3.12
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    print("UNSHARED" if libc.unshare(0x10000000) == 0 else f"REFUSED {ctypes.get_errno()}")
except OSError as e:
    print("REFUSED", e.errno)
"""
    result = sandbox(code)
    assert result.status == "ok" and result.stdout.startswith("REFUSED"), result.stdout + result.stderr


def test_the_training_process_goes_on_after_every_hostile_program(sandbox):
    """After all of the above in one process: a plain program still runs, and signals to this process are untouched."""
    assert signal.getsignal(signal.SIGTERM) is not None
    assert sandbox("print(6 * 7)").stdout == "42\n"


def test_anonymous_memory_files_are_refused(sandbox):
    code = """\
import os
try:
    os.memfd_create("fill")
    print("CREATED")
except OSError as e:
    print("REFUSED", e.errno)
"""
    result = sandbox(code)
    assert result.status == "ok" and result.stdout.startswith("REFUSED"), result.stdout + result.stderr
