"""A candidate program that imports and exercises the stdlib modules solutions use, one named step
at a time: ``step(name)`` is True when that step worked inside the sandbox. It runs as a sample in
tests/reward_plugins/code_sandbox/test_sandbox_integrity_os.py (each step one test, on every verdict path) and, under strace,
in benchmarks/sandbox_syscalls.py, which is how the seccomp allowlist's needs were measured.

It is data (the program's source text): nothing here runs on the host.
"""

PROGRAM = r'''
import array, base64, binascii, bisect, calendar, cmath, collections, collections.abc, concurrent.futures
import contextlib, copy, csv, dataclasses, datetime, decimal, difflib, enum, fnmatch, fractions, functools
import gc, glob, hashlib, heapq, io, itertools, json, keyword, math, mmap, numbers, operator, os, pickle
import pprint, queue, random, re, resource, secrets, select, selectors, shutil, signal, statistics, string
import struct, sys, tempfile, textwrap, threading, time, typing, unicodedata, uuid, weakref, zlib


def _threads():
    threading.stack_size(64 << 20)  # the competitive-programming idiom for deep recursion
    sys.setrecursionlimit(100_000)
    out = []

    def deep(n):
        return 0 if n == 0 else 1 + deep(n - 1)

    t = threading.Thread(target=lambda: out.append(deep(30_000)))
    t.start()
    t.join()
    threading.stack_size(0)
    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        squares = sum(ex.map(lambda x: x * x, range(100)))
    lock = threading.Lock()
    lock.acquire()
    timed_out = not lock.acquire(timeout=0.01)
    ev = threading.Event()
    threading.Timer(0.01, ev.set).start()
    q = queue.Queue()
    try:
        q.get(timeout=0.01)
        empty = False
    except queue.Empty:
        empty = True
    cond = threading.Condition()
    with cond:
        cond.wait(0.005)
    return out == [30_000] and squares == 328350 and timed_out and ev.wait(5) and empty


def _clocks():
    t0, m0, p0 = time.time(), time.monotonic(), time.perf_counter()
    time.sleep(0.002)
    cpu = time.process_time() + time.thread_time() + time.clock_gettime(time.CLOCK_PROCESS_CPUTIME_ID)
    now = datetime.datetime.now()
    return (time.time() > t0 and time.monotonic() > m0 and time.perf_counter() - p0 >= 0.002 and cpu >= 0
            and now.year >= 2024 and time.strftime("%Y", time.localtime()) == str(now.year)
            and datetime.date(2024, 2, 29).weekday() == 3 and time.monotonic_ns() > 0)


def _randomness():
    random.seed(7)
    a = random.random()
    random.seed(7)
    random.seed()  # from os.urandom
    xs = list(range(10))
    random.shuffle(xs)
    return (random.Random(7).random() == a and 0 <= random.SystemRandom().randint(1, 6) <= 6
            and len(os.urandom(16)) == 16 and len(secrets.token_hex(8)) == 16 and uuid.uuid4().version == 4
            and sorted(xs) == list(range(10)))


def _hashing():
    return (hashlib.sha256(b"x").hexdigest()[:8] == "2d711642" and hashlib.md5(b"").hexdigest()[:6] == "d41d8c"
            and len(hashlib.blake2b(b"x").digest()) == 64 and zlib.decompress(zlib.compress(b"a" * 100)) == b"a" * 100
            and base64.b64decode(base64.b64encode(b"hi")) == b"hi" and binascii.crc32(b"x") == 2363233923)


def _files():
    with open("a.txt", "w") as f:
        f.write("hello\n")
    with open("a.txt") as f:
        ok = f.read() == "hello\n"
    os.makedirs("d/e", exist_ok=True)
    os.rename("a.txt", "d/b.txt")
    shutil.copy("d/b.txt", "d/e/c.txt")
    st = os.stat("d/e/c.txt")
    os.chmod("d/e/c.txt", 0o600)
    os.utime("d/e/c.txt", None)
    with open("d/e/c.txt", "r+") as f:
        f.truncate(2)
        f.flush()
        os.fsync(f.fileno())
    found = sorted(p for _, _, fs in os.walk(".") for p in fs)
    globbed = glob.glob("d/*.txt") == ["d/b.txt"] and fnmatch.fnmatch("b.txt", "*.txt")
    names = sorted(e.name for e in os.scandir("d"))
    os.symlink("b.txt", "d/link")
    linked = os.readlink("d/link") == "b.txt" and os.path.realpath("d/link").endswith("/d/b.txt")
    with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryFile() as tf:
        tf.write(b"x")
        tf.seek(0)
        tmp_ok = tf.read() == b"x" and os.path.isdir(tmp)
    with tempfile.NamedTemporaryFile("w", dir=".", delete=False) as nf:
        nf.write("y")
    os.remove(nf.name)
    shutil.rmtree("d")
    return (ok and st.st_size == 6 and found == ["b.txt", "c.txt"] and globbed and names == ["b.txt", "e"] and linked
            and tmp_ok and os.listdir(".") == [] and os.getcwd().startswith("/") and os.path.getsize(".") >= 0)


def _memory_maps():
    m = mmap.mmap(-1, 1 << 16)
    m[:5] = b"hello"
    with open("m.bin", "wb") as f:
        f.write(b"\0" * 4096)
    with open("m.bin", "r+b") as f, mmap.mmap(f.fileno(), 0) as fm:
        fm[:3] = b"abc"
        fm.flush()
    ok = m[:5] == b"hello" and open("m.bin", "rb").read(3) == b"abc"
    os.remove("m.bin")
    big = bytearray(200 << 20)  # large allocations: mmap, madvise
    big[-1] = 1
    del big
    return ok and gc.collect() >= 0


def _signals():
    got = []
    signal.signal(signal.SIGALRM, lambda *a: got.append("alarm"))
    signal.setitimer(signal.ITIMER_REAL, 0.01)
    deadline = time.monotonic() + 5
    while not got and time.monotonic() < deadline:
        time.sleep(0.001)
    signal.alarm(0)
    signal.signal(signal.SIGUSR1, lambda *a: got.append("usr1"))
    os.kill(0, signal.SIGUSR1)  # its own process group: itself
    old = signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])
    signal.pthread_sigmask(signal.SIG_SETMASK, old)
    return got == ["alarm", "usr1"]


def _process_info():
    soft, hard = resource.getrlimit(resource.RLIMIT_STACK)
    resource.setrlimit(resource.RLIMIT_STACK, (soft, hard))  # the deep-recursion idiom
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return (os.cpu_count() >= 1 and len(os.sched_getaffinity(0)) >= 1 and os.getpid() > 0 and os.getuid() >= 0
            and usage.ru_maxrss > 0 and os.times().user >= 0 and os.uname().sysname == "Linux"
            and sys.getrecursionlimit() > 0 and resource.getpagesize() > 0)


def _polling():
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.write(w, b"x")
    ok = select.select([r], [], [], 1)[0] == [r]
    p = select.poll()
    p.register(r, select.POLLIN)
    ok = ok and p.poll(1000)[0][0] == r
    with selectors.DefaultSelector() as sel:
        sel.register(r, selectors.EVENT_READ)
        ok = ok and len(sel.select(1)) == 1
    ok = ok and os.read(r, 10) == b"x"
    os.close(r)
    os.close(w)
    return ok


@dataclasses.dataclass(order=True)
class _P:
    x: int
    y: int = 0


class _Color(enum.Enum):
    RED = 1


def _pure_python():
    decimal.getcontext().prec = 50
    c = collections.Counter("abracadabra")
    dq = collections.deque(range(5), maxlen=3)
    h = [5, 1, 4]
    heapq.heapify(h)
    pt = collections.namedtuple("pt", "x y")(1, 2)
    buf = io.StringIO()
    csv.writer(buf).writerow([1, "a"])

    @functools.lru_cache(None)
    def fib(n):
        return n if n < 2 else fib(n - 1) + fib(n - 2)

    checks = [
        re.findall(r"\d+", "a1b22") == ["1", "22"], math.comb(10, 3) == 120, math.isqrt(99) == 9,
        cmath.sqrt(-1) == 1j, str(decimal.Decimal(2).sqrt())[:6] == "1.4142",
        fractions.Fraction(1, 3) + fractions.Fraction(1, 6) == fractions.Fraction(1, 2),
        statistics.median([3, 1, 2]) == 2, round(statistics.stdev([1, 2, 3, 4]), 3) == 1.291,
        json.loads(json.dumps({"a": [1, 2.5, None]})) == {"a": [1, 2.5, None]},
        struct.unpack("<I", struct.pack("<I", 7)) == (7,), array.array("i", [1, 2]).tolist() == [1, 2],
        textwrap.wrap("a b c", 3) == ["a b", "c"], unicodedata.name("a") == "LATIN SMALL LETTER A",
        difflib.SequenceMatcher(None, "abc", "abd").ratio() > 0.6, calendar.monthrange(2024, 2)[1] == 29,
        string.ascii_lowercase[:3] == "abc", c.most_common(1) == [("a", 5)], list(dq) == [2, 3, 4], h[0] == 1,
        bisect.bisect_left([1, 2, 4], 3) == 2, list(itertools.accumulate([1, 2, 3])) == [1, 3, 6],
        functools.reduce(operator.mul, range(1, 6)) == 120, fib(80) == 23416728348467685,
        copy.deepcopy([[1], [2]]) == [[1], [2]], sorted([_P(2), _P(1, 5)])[0] == _P(1, 5), _Color(1) is _Color.RED,
        isinstance(typing.List[int], object), pprint.pformat({"a": 1}) == "{'a': 1}",
        pickle.loads(pickle.dumps((pt.x, {"a": [pt.y]}))) == (1, {"a": [2]}), buf.getvalue() == "1,a\r\n", keyword.iskeyword("def"),
        isinstance(3, numbers.Integral), isinstance([], collections.abc.Sequence),
        weakref.ref(_P(1))() is None or True, math.factorial(30) == 265252859812191058636308480000000,
        pow(3, -1, 7) == 5, sum(i * i for i in range(10**5)) == 333328333350000,
    ]
    return all(checks)


def _refused():
    """What a solution never needs stays refused (these must raise)."""
    import socket, subprocess
    refused = 0
    for attempt in (lambda: socket.socket(), lambda: subprocess.run(["/bin/true"]),
                    lambda: os.fork() == 0 and os._exit(0),
                    lambda: os.kill(os.getppid(), 0), lambda: os.sched_setaffinity(0, {0}),
                    lambda: os.setpriority(os.PRIO_PROCESS, 0, 5), lambda: os.getpriority(os.PRIO_PROCESS, 1),
                    lambda: resource.prlimit(1, resource.RLIMIT_NOFILE), lambda: os.sched_getaffinity(1)):
        try:
            attempt()
        except (OSError, ValueError):
            refused += 1
    return refused == 9


STEPS = {"threads": _threads, "clocks": _clocks, "randomness": _randomness, "hashing": _hashing, "files": _files,
         "memory_maps": _memory_maps, "signals": _signals, "process_info": _process_info, "polling": _polling,
         "pure_python": _pure_python, "refused": _refused}


def step(name):
    try:
        return STEPS[name]() is True
    except BaseException:
        return False


if __name__ == "__main__":  # the io path: the steps named on stdin, one verdict per line
    for line in sys.stdin.read().split():
        print(line, step(line))
'''

STEPS = ["threads", "clocks", "randomness", "hashing", "files", "memory_maps", "signals", "process_info", "polling",
         "pure_python", "refused"]  # fmt: skip
