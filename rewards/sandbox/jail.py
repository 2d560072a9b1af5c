"""The launcher that isolates a reply's code before `rewards.sandbox.harness` runs it.

Not imported: `rewards.verifiers.python_tests` runs ``python -I -S jail.py CONFIG_JSON`` (standard
library only) with the payload and report descriptors passed open; CONFIG_JSON holds the
harness program's text (``program``) and what of the interpreter to show (``expose``, ``hide``).
It:

1. dies with the verifier process that started it (``PR_SET_PDEATHSIG``);
2. unshares new network, mount, PID, IPC and UTS namespaces (as root; otherwise, or where
   root may not, also a new user namespace mapping only its own uid): the network namespace
   has nothing but a loopback device that is down, so no address, local or remote, can be
   reached; abstract unix sockets belong to it too;
3. forks the process that becomes PID 1 of the new PID namespace: when it exits or is
   killed, the kernel kills every process left in the namespace (forked, daemonised,
   in a new session: all of them);
4. that process builds a new root on a small tmpfs and ``pivot_root``s into it, detaching
   the old one: it holds only ``/usr`` (and the ``/bin``, ``/lib*`` links or binds), what the
   interpreter needs when it lives elsewhere (its binary, its shared libraries, its standard
   library without ``site-packages``: ``expose`` and ``hide``, never the rest of its install
   prefix or home directory), ``/etc/ld.so.cache``, ``/dev/{null,zero,random,urandom}`` and
   an empty scratch tmpfs at ``/tmp`` (its cwd and HOME); all read-only but ``/tmp``, nosuid;
   no ``/proc``, ``/sys``, ``/home``, ``/root``, ``/run``, repository or run files;
5. sets the resource limits (CPU seconds, address space, processes, file size, open files,
   no core files), switches to an unprivileged uid (as root: a uid of its own, 10^9 + the
   launcher's pid, so that the process limit counts only this run's processes), sets
   ``PR_SET_NO_NEW_PRIVS``, closes every other descriptor and execs the harness.

Any step that fails writes ``setup-error <why>`` to the report descriptor and exits with
`SETUP_FAILED`: the caller then knows the code never ran.
"""

import ctypes
import json
import os
import platform
import resource
import signal
import sys

SETUP_FAILED = 125
INNER_UID = 1000  # the uid the code has inside a user namespace the launcher made
OWN_UID_BASE = 10**9  # as root: the code runs as OWN_UID_BASE + the launcher's pid

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 4096, 16384, 1 << 18
MNT_DETACH, AT_RECURSIVE, AT_FDCWD = 2, 0x8000, -100
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID = 0x1, 0x2
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
SYS_MOUNT_SETATTR = 442  # the same number on every architecture
DEVICES = ("null", "zero", "random", "urandom")

_libc = ctypes.CDLL(None, use_errno=True)


class SetupError(Exception):
    """One step of the isolation could not be set up."""


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def _b(text):
    return None if text is None else os.fsencode(text)


def _check(ret, what):
    if ret != 0:
        raise SetupError(f"{what}: {os.strerror(ctypes.get_errno())}")


def _mount(src, dst, fstype, flags, data=None):
    _check(_libc.mount(_b(src), _b(dst), _b(fstype), ctypes.c_ulong(flags), _b(data)),
           f"mount {dst}")


def _set_attr(path, attr_set, attr_clr, flags):
    attr = _MountAttr(attr_set, attr_clr, 0, 0)
    _check(_libc.syscall(SYS_MOUNT_SETATTR, ctypes.c_int(AT_FDCWD), _b(path),
                         ctypes.c_uint(flags), ctypes.byref(attr),
                         ctypes.c_size_t(ctypes.sizeof(attr))), f"mount_setattr {path}")


def _write(path, text):
    with open(path, "w") as f:
        f.write(text)


def _unshare(user):
    """New namespaces; with `user`, a user namespace mapping only our own uid and gid."""
    flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
    uid, gid = os.geteuid(), os.getegid()
    _check(_libc.unshare(ctypes.c_int(flags | (CLONE_NEWUSER if user else 0))),
           "unshare(" + ("user, " if user else "") + "net, mount, pid, ipc, uts namespaces)")
    if user:
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{INNER_UID} {uid} 1")
        _write("/proc/self/gid_map", f"{INNER_UID} {gid} 1")


def _own_uid():
    """As root: a uid no other process uses (when the uid map allows it), else nobody's."""
    wanted = OWN_UID_BASE + os.getpid()
    with open("/proc/self/uid_map") as f:
        ranges = [tuple(int(x) for x in line.split()) for line in f if line.strip()]
    if any(first <= wanted < first + count for first, _, count in ranges):
        return wanted
    return 65534


def _bind(src_fd, dst, is_dir):
    if is_dir:
        os.makedirs(dst, 0o755, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(dst), 0o755, exist_ok=True)
        open(dst, "w").close()
    _mount(f"/proc/self/fd/{src_fd}", dst, None, MS_BIND | MS_REC)


def _new_root(cfg, owner):
    """Build the new root on a tmpfs mounted at cfg["root"] and pivot into it."""
    sources = {}  # opened before the tmpfs hides anything: path -> (O_PATH fd, is a dir)
    links = {}
    for path in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
                 "/etc/ld.so.cache", *cfg["expose"], *(f"/dev/{d}" for d in DEVICES)):
        if os.path.islink(path) and path.count("/") == 1:
            links[path] = os.readlink(path)
        elif os.path.exists(path) and path not in sources:
            sources[path] = (os.open(path, os.O_PATH), os.path.isdir(path))
    root = cfg["root"]
    _mount("tmpfs", root, "tmpfs", MS_NOSUID, "size=1m,mode=0755")
    for path, target in links.items():
        os.symlink(target, root + path)
    for path, (fd, is_dir) in sorted(sources.items()):
        _bind(fd, root + path, is_dir)
        os.close(fd)
    for path in cfg.get("hide", ()):  # an empty directory over it (site-packages)
        if os.path.isdir(root + path):
            _mount("tmpfs", root + path, "tmpfs", MS_NOSUID | MS_NODEV, "size=4k,mode=0555")
    os.mkdir(root + "/tmp")
    _mount("tmpfs", root + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV,
           f"size={cfg['limits']['scratch_bytes']},mode=0700")
    if owner is not None:
        os.chown(root + "/tmp", owner, owner)
    os.mkdir(root + "/.old")
    nr = SYS_PIVOT_ROOT.get(platform.machine())
    if nr is None:
        raise SetupError(f"pivot_root: unsupported architecture {platform.machine()}")
    _check(_libc.syscall(nr, _b(root), _b(root + "/.old")), "pivot_root")
    os.chdir("/")
    _check(_libc.umount2(b"/.old", MNT_DETACH), "umount old root")
    os.rmdir("/.old")
    _set_attr("/", MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID, 0, AT_RECURSIVE)
    _set_attr("/tmp", 0, MOUNT_ATTR_RDONLY, 0)
    os.chdir("/tmp")


def _limit(limits):
    """Resource limits, each capped at the hard limit we already have."""
    cpu = int(limits["cpu_s"])
    for name, value, hard in (("RLIMIT_CORE", 0, 0), ("RLIMIT_CPU", cpu, cpu + 1),
                              ("RLIMIT_AS", limits["memory_bytes"], None),
                              ("RLIMIT_NPROC", limits["processes"], None),
                              ("RLIMIT_FSIZE", limits["file_bytes"], None),
                              ("RLIMIT_NOFILE", limits["open_files"], None)):
        which = getattr(resource, name)
        _, old_hard = resource.getrlimit(which)
        hard = value if hard is None else hard
        if old_hard != resource.RLIM_INFINITY:
            value, hard = min(value, old_hard), min(hard, old_hard)
        resource.setrlimit(which, (value, hard))


def _child(cfg, user, uid):
    """PID 1 of the new namespace: build the root, drop everything, exec the harness."""
    keep = sorted({0, 1, 2, cfg["payload_fd"], cfg["report_fd"]})
    _new_root(cfg, None if user else uid)
    for low, high in zip(keep, [*keep[1:], 65536]):
        os.closerange(low + 1, high)
    _limit(cfg["limits"])
    if not user:  # as root: a uid of our own, no groups; with a user namespace we are one
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "pdeathsig")
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8",
           "MALLOC_ARENA_MAX": "2"}
    python = cfg["python"]
    os.execve(python, [python, "-I", "-S", "-c", cfg["program"],
                       str(cfg["payload_fd"]), str(cfg["report_fd"])], env)


def _fail(report_fd, why):
    os.write(report_fd, f"setup-error {why}\n".encode())
    os._exit(SETUP_FAILED)


def main(cfg):
    report_fd = cfg["report_fd"]
    os.umask(0o022)
    try:
        _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "pdeathsig")
        if os.getppid() != cfg["parent"]:
            _fail(report_fd, "the verifier process is gone")
        user = os.geteuid() != 0
        uid = None if user else _own_uid()
        try:
            _unshare(user)
        except SetupError:
            if user:
                raise
            user = True  # root that may not unshare (no CAP_SYS_ADMIN): a user namespace
            _unshare(user)
        _mount(None, "/", None, MS_REC | MS_PRIVATE)
    except (SetupError, OSError) as e:
        _fail(report_fd, str(e))
    pid = os.fork()
    if pid == 0:
        try:
            _child(cfg, user, uid)
        except (SetupError, OSError) as e:
            _fail(report_fd, str(e))
    _, status = os.waitpid(pid, 0)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
