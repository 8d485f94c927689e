"""Forks Python programs from a process that has already imported the
data-analysis stack, so that a run does not pay ~1.2 s of imports.

The runbox agent starts this with a SOCK_SEQPACKET socket as fd 3. Each
message from the agent is a JSON request {"path", "env", "cwd"} carrying three
file descriptors (the program's stdin, stdout and stderr). The zygote forks;
the child becomes the program; the zygote answers {"pid"} and, when the
child ends, {"exit": pid, "status": <wait status>}. A request {"preload":
"numpy,pandas"} imports those modules into the zygote, for every program
forked after it. The zygote says {"ready": true} when it starts and after
each preload.

A request {"spawn": true} carries one descriptor, a SOCK_SEQPACKET socket:
the zygote forks a new zygote that serves that socket (it says {"ready"}
there) and answers {"pid"}, then {"exit"} when it ends. The agent keeps
one zygote that only ever spawns — the template, which never forks a
program — and spawns from it the zygote programs fork from; when a sandbox
passes to another conversation, that zygote is killed and a new one
spawned: as fresh as one started anew (nothing but the agent has ever
spoken to the template, and no program can reach it, see below), for a
fork's cost rather than Python's start. The template ignores the signals
a program could send it to end or interrupt it (a program runs as the
same user); a spawned zygote restores them as Python started them.

A request {"prefork": true, "seq"} carries four descriptors: a
SOCK_SEQPACKET socket and the next program's stdin, stdout and stderr.
The zygote forks that program's process ahead of its run and answers
{"ahead": pid, "seq"}, then {"exit"} when it ends; the process waits on
the socket for the run's request ({"path", "env", "cwd"}), which the
agent sends it directly, goes on as a child forked for it would, and
sends {"exit": code} on the socket as its last step. A fork of this
process costs ~6 ms under gVisor, 27 with pandas imported, where it
costs 0.3 and 2 under runc; so it leaves the run's time. The agent keeps
one forked ahead, two from the zygote's second run on (a zygote that
serves one run before a reset forks no more than it needs): the zygote
forks them while no program runs (the second may finish while one does),
they are not dumpable until they become the program (as the zygote), and
they block every signal a program could end or interrupt them with while
they wait, and drop those that came; before a program that does not take
one (a kept interpreter's cell, one under filesystem rules, the first
after a preload made them stale) the agent kills them, so that no such
program finds them.

A request {"kernel": true, "env", "cwd"} carries a fourth descriptor, a
SOCK_SEQPACKET socket: the child becomes a kept interpreter (a "kernel",
see serve_kernel()) that runs cell after cell in one namespace, for one
conversation, until the agent closes the socket or kills it; between
cells it saves its namespace to a snapshot, or restores one, when asked.

The zygote outlives the programs it forks, so no program may reach it:
it makes itself not dumpable before anything else (its /proc entries are
root's: no program can open its socket or trace it), and it runs isolated
(`python3 -I`): neither /data nor the environment's PYTHON* variables are on
its import path, so a module a program planted is never imported into it.
A forked child puts /data (PYTHONPATH) on its own path.

A forked program must behave as if started with `python3 path`: fresh
globals in a new __main__ module, __name__ == "__main__", its own argv,
environment, cwd, stdio and exit code, fresh random seeds, and tracebacks
without this file's frames.
"""

import ctypes
import os

PR_SET_DUMPABLE = 4


LIBC = ctypes.CDLL(None, use_errno=True)


def set_dumpable(flag):
    if LIBC.prctl(PR_SET_DUMPABLE, flag, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE)")


# First of all: until this line the process is open to the programs'
# user (the agent starts a zygote only while no program runs).
set_dumpable(0)

import selectors  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import sys  # noqa: E402

CTL_FD = 3


def preload(names):
    """Imports the modules named, comma-separated (matplotlib picks its
    backend from MPLBACKEND)."""
    import importlib

    for name in filter(None, names.split(",")):
        try:
            importlib.import_module(name)
        except Exception as e:
            print(f"zygote: cannot preload {name}: {e}", file=sys.stderr)


def close_from(low, keep=()):
    """Closes every descriptor from low up but those in keep: those open,
    as /proc/self/fd lists them. (os.closerange here tries every number up
    to the limit, a system call each: 5 ms under runc, 16 ms under
    gVisor.)"""
    try:
        open_fds = [int(n) for n in os.listdir("/proc/self/fd")]
    except OSError:
        if not keep:
            os.closerange(low, 65536)
            return
        open_fds = range(low, 65536)
    for fd in open_fds:
        if fd >= low and fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass  # the listing's own, closed already


def prepare():
    """What child() does first, whatever the request: a process forked
    ahead does it while it waits."""
    try:
        os.setsid()
        # The kernel's OOM killer takes the program before the zygote.
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass


def program_signals():
    """Sets the signal handling a program starts with where the zygote's
    differs."""
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.set_wakeup_fd(-1)


def child(req, fds=(), prepared=False, report=None):
    """Becomes the program, or a kernel, on fds: its stdin, stdout, stderr
    and, for a kernel, its socket. Prepared, waiting() has done what needs
    no request: fds are 0, 1 and 2 already, the only ones besides report,
    and the signals are the program's. report, if given, is told the exit
    code just before the process exits. Never returns."""
    import atexit
    import builtins
    import random
    import threading
    import types

    if not prepared:
        prepare()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        close_from(len(fds))
        program_signals()

    path = req.get("path") or "/tmp/runbox/main.py"
    os.environ.clear()
    os.environ.update(req.get("env") or {})
    os.chdir(req.get("cwd") or "/data")
    sys.argv = [path]
    # As `python3 path` would have it: the script's folder first, then
    # PYTHONPATH, then the zygote's own (system) path.
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(":") if p]
    sys.path[:0] = [os.path.dirname(path)] + extra
    # The program is its own user's process, as one exec'd would be.
    try:
        set_dumpable(1)
    except OSError:
        pass
    # The zygote's seeds would repeat in every program.
    random.seed()
    numpy = sys.modules.get("numpy")  # reseeded if imported, never imported here
    if numpy is not None:
        try:
            numpy.random.seed()
        except Exception:
            pass
    atexit._clear()
    # Its .pth files are the conversation's code: read once the child is
    # the program's own process.
    add_user_site()
    if req.get("kernel"):
        serve_kernel(socket.socket(fileno=3))
        os._exit(0)

    main = types.ModuleType("__main__")
    main.__file__ = path
    main.__builtins__ = builtins
    sys.modules["__main__"] = main
    code = run_source(main.__dict__, path)
    try:
        threading._shutdown()
        atexit._run_exitfuncs()
    except BaseException:
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            code = code or 120
    if report is not None:
        # The agent has the code without waiting for the zygote to reap
        # this process and tell it (a wake-up of each, ~1 ms under gVisor,
        # more while the zygote forks); it takes it once the process is
        # gone, as it would the zygote's.
        try:
            report.send(b'{"exit": %d}' % code)
        except OSError:
            pass
        # Its output is complete (flushed above): the agent sees its end
        # now. gVisor closes an exiting process's descriptors only after
        # its address space is torn down, ~2 ms later.
        for fd in (1, 2):
            try:
                os.close(fd)
            except OSError:
                pass
    os._exit(code)


def waiting(sock, stdio):
    """A process forked ahead of its run: waits for the run's request on
    sock, then becomes the program on stdio as child() does. Never
    returns."""
    import json

    # No signal a program could send ends, stops or interrupts it while it
    # waits but SIGKILL (the agent then has the zygote fork the run) and
    # SIGSTOP (the agent continues it with the request): the others are
    # blocked, and those that came meanwhile are dropped before they are
    # let through. (Blocked rather than ignored: two system calls, where
    # ignoring and restoring each took one per signal, 1.5 ms under gVisor
    # in the run's time.)
    unblocked = signal.pthread_sigmask(signal.SIG_BLOCK, CATCHABLE)
    # What needs no request is done while it waits: the run's stdio become
    # 0, 1 and 2, and nothing of the zygote's (its socket to the agent above
    # all) is held; it takes its own session and OOM score, and the
    # program's signal handling.
    for target, fd in enumerate(stdio):
        os.dup2(fd, target)
    close_from(3, keep={sock.fileno()})
    prepare()
    program_signals()
    # Python's first steps in a fork write to pages it shares with the
    # zygote, each copied then (a fault: ~10 µs under gVisor, where these
    # steps took 2 ms): compiling and running a line, and reading a
    # request, take many of those copies now rather than in the program's
    # time.
    exec(compile("x = [1]", "<ahead>", "exec"), {})
    json.loads('{"path": "/tmp/main.py", "cwd": "/data", "env": {"A": "b"}}')
    try:
        msg = sock.recv(1 << 20)
        req = json.loads(msg) if msg else None
    except BaseException:
        os._exit(70)
    if req is None:  # given up
        os._exit(0)
    # Kept for the exit code, by this process alone.
    os.set_inheritable(sock.fileno(), False)
    # Ignoring a pending signal discards it.
    for sig in signal.sigpending():
        handler = signal.signal(sig, signal.SIG_IGN)
        if handler is not None:
            signal.signal(sig, handler)
    signal.pthread_sigmask(signal.SIG_SETMASK, unblocked)
    child(req, prepared=True, report=sock)


def add_user_site():
    """Puts the conversation's installed packages (the user site of
    PYTHONUSERBASE, under /data) on the path as `python3` would: after
    PYTHONPATH, before the system's packages, its .pth files read. Only in
    a forked program or kernel: the zygote runs isolated, and nothing under
    /data ever runs in it."""
    import importlib
    import site

    base = os.environ.get("PYTHONUSERBASE")
    if not base or os.environ.get("PYTHONNOUSERSITE"):
        return
    user_site = os.path.join(base, "lib", "python%d.%d" % sys.version_info[:2], "site-packages")
    if user_site in sys.path or not os.path.isdir(user_site):
        return
    known = set(sys.path)
    site.addsitedir(user_site)
    added = [p for p in sys.path if p not in known]
    for p in added:
        sys.path.remove(p)
    at = next((i for i, p in enumerate(sys.path) if p.endswith(("site-packages", "dist-packages"))), len(sys.path))
    sys.path[at:at] = added
    importlib.invalidate_caches()


def run_source(namespace, path, echo=False):
    """Runs the program at path in namespace; returns its exit code. With
    echo, a final bare expression's value is shown as a notebook (or the
    interactive interpreter) shows it."""
    code = 0
    try:
        with open(path, "rb") as f:
            source = f.read()
        if not echo:
            exec(compile(source, path, "exec"), namespace)
            return 0
        import ast

        tree = ast.parse(source, path)
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        exec(compile(tree, path, "exec"), namespace)
        if last is not None:
            sys.displayhook(eval(compile(last, path, "eval"), namespace))
    except SystemExit as e:
        code = exit_code(e.code)
    except BaseException as e:
        print_exception(e)
        code = 130 if isinstance(e, KeyboardInterrupt) else 1
    return code


def print_exception(e):
    tb = e.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    # The default hook prints the exception's own traceback.
    sys.excepthook(type(e), e.with_traceback(tb), tb)


def serve_kernel(ctl):
    """Runs cells in one namespace until the agent closes ctl. Each request
    {"seq", "path", "env"} carries the cell's stdin, stdout and stderr; the
    answer {"seq", "done": exit code} goes out once the cell is over and
    its stdio are back on /dev/null. SIGINT interrupts a cell
    (KeyboardInterrupt) and is ignored between cells. A request {"seq",
    "save", "preload"} or {"seq", "restore"} carries one descriptor, a
    pipe: the kernel writes a snapshot of its namespace to it
    (save_state), or reads one into it (restore_state), and answers what
    those return with the request's seq."""
    import builtins
    import json
    import types

    os.set_inheritable(ctl.fileno(), False)
    main = types.ModuleType("__main__")
    main.__builtins__ = builtins
    sys.modules["__main__"] = main
    # plt.show() saves figures into /data (runbox_inline.py).
    sys.path.append(os.path.join(os.path.dirname(__file__), "lib"))
    os.environ["MPLBACKEND"] = "module://runbox_inline"
    if "matplotlib.pyplot" in sys.modules:
        sys.modules["matplotlib.pyplot"].switch_backend("module://runbox_inline")
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    devnull = os.open(os.devnull, os.O_RDWR)
    ctl.send(b'{"ready": true}')
    while True:
        msg, fds, _, _ = socket.recv_fds(ctl, 1 << 16, 3)
        if not msg:
            os._exit(0)
        req = json.loads(msg)
        reap()
        if req.get("save") or req.get("restore"):
            if len(fds) != 1:
                os._exit(70)
            if req.get("save"):
                answer = save_state(main, fds[0])
                # Whether a restore should have the zygote import the
                # data stack first, as this kernel had.
                preload = filter(None, (req.get("preload") or "").split(","))
                answer["heavy"] = any(m in sys.modules for m in preload)
            else:
                answer = restore_state(main, fds[0])
            answer["seq"] = req.get("seq")
            ctl.send(json.dumps(answer).encode())
            continue
        if len(fds) != 3:
            os._exit(70)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        sys.stdin = open(0, "r", closefd=False)
        os.environ.update(req.get("env") or {})
        # Packages installed since the kernel started, importable now.
        add_user_site()
        path = req["path"]
        main.__file__ = path
        sys.argv = [path]
        signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            code = run_source(main.__dict__, path, echo=True)
        except KeyboardInterrupt:
            code = 130
        # An interrupt that comes now is too late for the cell: ignored.
        while True:
            try:
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                break
            except KeyboardInterrupt:
                code = 130
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                code = code or 120
        for target in range(3):
            os.dup2(devnull, target)
        ctl.send(json.dumps({"seq": req.get("seq"), "done": code}).encode())


# A snapshot of a kernel's namespace (save_state, restore_state) is
# STATE_MAGIC, then records: the first the names bound to modules
# ({name: module}), re-imported by name; then one per variable. A record is
# its name (uint16 length, UTF-8) and its pickle in chunks (uint32 length,
# bytes), ended by a chunk length of 0, or of ABORTED when the pickle
# failed part way: a variable that cannot be pickled (a socket, a thread,
# a generator) is lost alone, by name, and the snapshot goes on. One
# pickler writes every record and one unpickler reads them, so that
# objects two variables share stay shared. dill, where installed, pickles
# what pickle cannot (functions and classes defined in cells, lambdas).
STATE_MAGIC = b"RBXK1\n"
ABORTED = 0xFFFFFFFF
# At most this many lost names are told: the rest are counted.
MAX_LOST_NAMES = 64


class _ChunkSink:
    """Writes what the pickler writes as chunks of the current record."""

    def __init__(self, f):
        self.f = f

    def write(self, b):
        n = len(b)
        if n:
            view = memoryview(b).cast("B")
            for at in range(0, n, 1 << 30):
                part = view[at:at + (1 << 30)]
                self.f.write(len(part).to_bytes(4, "big"))
                self.f.write(part)
        return n


class _ChunkSource:
    """Reads one record's chunks for the unpickler, then says EOF."""

    def __init__(self, f):
        self.f = f
        self.left = 0
        self.ended = True
        self.aborted = False

    def start(self):
        self.left, self.ended, self.aborted = 0, False, False

    def _fill(self):
        while self.left == 0 and not self.ended:
            n = int.from_bytes(_read_exact(self.f, 4), "big")
            if n == 0 or n == ABORTED:
                self.ended, self.aborted = True, n == ABORTED
            else:
                self.left = n

    def read(self, n=-1):
        self._fill()
        if 0 <= n <= self.left:
            # Within one chunk (a large buffer is one): no copy of ours.
            self.left -= n
            return _read_exact(self.f, n)
        out = bytearray()
        while n < 0 or len(out) < n:
            self._fill()
            if self.left == 0:
                break
            want = self.left if n < 0 else min(self.left, n - len(out))
            out += _read_exact(self.f, want)
            self.left -= want
        return bytes(out)

    def readinto(self, b):
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)

    def readline(self):
        out = bytearray()
        while True:
            c = self.read(1)
            out += c
            if not c or c == b"\n":
                return bytes(out)

    def skip(self):
        while not self.ended:
            self.read(1 << 20)


class _Truncated(Exception):
    """The snapshot ends in the middle of a record."""


def _read_exact(f, n):
    b = f.read(n)
    if len(b) != n:
        raise _Truncated("the snapshot ends early")
    return b


def _picklers():
    """The pickler and unpickler classes: dill's where installed."""
    try:
        import dill

        return dill.Pickler, dill.Unpickler, True
    except Exception:
        import pickle

        return pickle._Pickler, pickle._Unpickler, False


def _saved_names(main):
    """The variables of a namespace a snapshot keeps, and its modules."""
    import types

    names, modules = [], {}
    for name, value in list(main.__dict__.items()):
        if name.startswith("__"):
            continue
        if isinstance(value, types.ModuleType):
            modules[name] = value.__name__
        else:
            names.append(name)
    return names, modules


def _write_record(f, pickler, sink, name, value):
    """Writes one record; returns whether its value could be pickled. A
    failed pickle leaves the pickler's memo as it was, so that later
    records never refer to objects the failed one defined."""
    encoded = name.encode("utf-8", "surrogatepass")[:0xFFFF]
    f.write(len(encoded).to_bytes(2, "big"))
    f.write(encoded)
    memo = pickler.memo
    known = len(memo)
    try:
        pickler.dump(value)
        ok = True
    except Exception:
        while len(memo) > known:
            memo.popitem()
        ok = False
    f.write((0 if ok else ABORTED).to_bytes(4, "big"))
    return ok


def save_state(main, fd):
    """Writes a snapshot of main's namespace to fd (then closed) and
    returns {"saved": count, "lost": names, "lost_count"}."""
    Pickler, _, has_dill = _picklers()
    lost, saved = [], 0
    # An agent that gives up closes its end: a write then fails, where
    # SIGPIPE would end the kernel.
    sigpipe = signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    try:
        with os.fdopen(fd, "wb", buffering=1 << 20) as f:
            f.write(STATE_MAGIC)
            sink = _ChunkSink(f)
            pickler = Pickler(sink, protocol=5)
            if has_dill:
                pickler._main = main  # its functions' globals are this namespace
            names, modules = _saved_names(main)
            _write_record(f, pickler, sink, "", modules)
            for name in names:
                if _write_record(f, pickler, sink, name, main.__dict__.get(name)):
                    saved += 1
                else:
                    lost.append(name)
    except OSError as e:
        return {"saved": saved, "error": "the snapshot could not be written: %s" % e.strerror}
    finally:
        signal.signal(signal.SIGPIPE, sigpipe)
    return {"saved": saved, "lost": lost[:MAX_LOST_NAMES], "lost_count": len(lost)}


def restore_state(main, fd):
    """Reads a snapshot from fd (then closed) into main's namespace and
    returns {"restored": count, "lost": names, "lost_count"}: the
    variables and modules that could not be brought back."""
    import importlib

    _, Unpickler, has_dill = _picklers()
    lost, restored = [], 0
    try:
        with os.fdopen(fd, "rb", buffering=1 << 20) as f:
            if f.read(len(STATE_MAGIC)) != STATE_MAGIC:
                return {"restored": 0, "error": "not a snapshot"}
            source = _ChunkSource(f)
            unpickler = Unpickler(source)
            if has_dill:
                unpickler._main = main
            first = True
            while True:
                head = f.read(2)
                if not head:
                    break
                if len(head) < 2:
                    raise _Truncated("the snapshot ends early")
                name = _read_exact(f, int.from_bytes(head, "big")).decode("utf-8", "surrogatepass")
                source.start()
                try:
                    value = unpickler.load()
                    ok = not source.aborted
                except (_Truncated, OSError):
                    raise
                except Exception:
                    ok = False
                source.skip()
                if first:
                    first = False
                    for var, module in (value if ok and isinstance(value, dict) else {}).items():
                        try:
                            main.__dict__[var] = importlib.import_module(module)
                        except Exception:
                            lost.append(var)
                    continue
                if ok and not source.aborted:
                    main.__dict__[name] = value
                    restored += 1
                else:
                    lost.append(name)
    except (_Truncated, OSError) as e:
        return {"restored": restored, "error": "the snapshot could not be read: %s" % e}
    return {"restored": restored, "lost": lost[:MAX_LOST_NAMES], "lost_count": len(lost)}


def reap():
    """Collects the kernel's children that the agent's sweep killed."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def exit_code(value):
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    print(value, file=sys.stderr)
    return 1


def main():
    # What every child needs, imported once here rather than in each.
    preload("atexit,builtins,random,threading,traceback,types")
    preload(sys.argv[1] if len(sys.argv) > 1 else "")
    import json  # noqa: F401 (serve's, imported before any spawn)

    # As Python set them up: restored in every zygote spawned, so that
    # programs start with them whatever the template ignores.
    fresh = {sig: signal.getsignal(sig) for sig in CATCHABLE}
    fresh = {sig: h for sig, h in fresh.items() if h is not None}
    serve(fresh)


# The signals that end, stop or interrupt a process by default and can be
# caught (SIGKILL and SIGSTOP cannot: the agent sees the template gone, or
# continues it, before each spawn).
CATCHABLE = [
    getattr(signal, name)
    for name in (
        "SIGHUP SIGINT SIGQUIT SIGILL SIGTRAP SIGABRT SIGBUS SIGFPE SIGUSR1 "
        "SIGSEGV SIGUSR2 SIGPIPE SIGALRM SIGTERM SIGSTKFLT SIGTSTP SIGTTIN "
        "SIGTTOU SIGXCPU SIGXFSZ SIGVTALRM SIGPROF SIGIO SIGPWR SIGSYS"
    ).split()
    if hasattr(signal, name)
] + list(range(signal.SIGRTMIN, signal.SIGRTMAX + 1))


def serve(fresh):
    """Serves the agent on CTL_FD until it closes the socket."""
    import json

    ctl = socket.socket(fileno=CTL_FD)
    ctl.setblocking(True)
    rfd, wfd = os.pipe()
    os.set_blocking(wfd, False)
    signal.set_wakeup_fd(wfd)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    sel = selectors.DefaultSelector()
    sel.register(ctl, selectors.EVENT_READ)
    sel.register(rfd, selectors.EVENT_READ)

    def send(msg):
        ctl.send(json.dumps(msg).encode())

    def detach():
        """What a child of this zygote does first: the agent's socket is
        closed by number later (close_from), never by the object."""
        sel.close()
        ctl.detach()

    send({"ready": True})
    while True:
        for key, _ in sel.select():
            if key.fileobj is ctl:
                msg, fds, _, _ = socket.recv_fds(ctl, 1 << 20, 4)
                if not msg:
                    return
                req = json.loads(msg)
                if "preload" in req:
                    for fd in fds:
                        os.close(fd)
                    preload(req["preload"])
                    send({"ready": True})
                    continue
                if req.get("prefork"):
                    if len(fds) == 4:
                        sys.stdout.flush()
                        sys.stderr.flush()
                        pid = os.fork()
                        if pid == 0:
                            detach()
                            # A signal it gets while it waits must not wake
                            # the zygote.
                            signal.set_wakeup_fd(-1)
                            waiting(socket.socket(fileno=fds[0]), fds[1:])
                        send({"ahead": pid, "seq": req.get("seq")})
                    for fd in fds:
                        os.close(fd)
                    continue
                if req.get("spawn"):
                    # From now on this process is the template: it forks
                    # zygotes only, and no program's signal ends it.
                    for sig in CATCHABLE:
                        signal.signal(sig, signal.SIG_IGN)
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    detach()
                    if req.get("spawn"):
                        spawned(fresh, fds, rfd, wfd)
                    child(req, fds)
                for fd in fds:
                    os.close(fd)
                send({"pid": pid})
            else:
                os.read(rfd, 512)
                while True:
                    try:
                        pid, status = os.waitpid(-1, os.WNOHANG)
                    except ChildProcessError:
                        break
                    if pid == 0:
                        break
                    send({"exit": pid, "status": status})


def spawned(fresh, fds, rfd, wfd):
    """Becomes a zygote serving the socket the spawn request carried.
    Never returns."""
    if len(fds) != 1:
        os._exit(70)
    signal.set_wakeup_fd(-1)
    os.close(rfd)
    os.close(wfd)
    os.dup2(fds[0], CTL_FD)  # over the template's socket
    os.close(fds[0])
    for sig, handler in fresh.items():
        signal.signal(sig, handler)
    serve(fresh)
    os._exit(0)


if __name__ == "__main__":
    main()
