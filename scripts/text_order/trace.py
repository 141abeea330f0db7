#!/usr/bin/env python3
"""Runs a program and lists the functions of it that ran, in the order they
first ran.

    trace.py OUT PROGRAM [ARGS...]

Every function entry of PROGRAM's symbol table gets a one-shot breakpoint
(int3) before the program's first instruction; a function whose breakpoint
fires is noted and its first byte put back, so each function costs one trap
and then runs at full speed. The program's threads are followed; the
processes it starts are not (they exec other programs). SIGTERM and SIGINT
are passed on. When the program exits, the names of the functions that ran
are appended to OUT, one per line.

A socket-activated program keeps its sockets: LISTEN_PID is set to the
traced process's own pid.

Needs ptrace rights over the child (root, or a kernel.yama.ptrace_scope of
0 or 1) and x86-64.
"""
import ctypes
import os
import signal
import subprocess
import sys

TRACEME, PEEKTEXT, POKETEXT, CONT, GETREGS, SETREGS = 0, 1, 4, 7, 12, 13
SETOPTIONS = 0x4200
OPT_TRACECLONE, OPT_EXITKILL = 0x8, 0x100000
WAIT_ALL = 0x40000000  # __WALL: threads too
RIP = 16  # index of rip in struct user_regs_struct
INT3 = 0xCC

libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
libc.ptrace.restype = ctypes.c_long


def ptrace(request, pid, addr=0, data=0):
    ctypes.set_errno(0)
    r = libc.ptrace(request, pid, ctypes.c_void_p(addr), ctypes.c_void_p(data))
    err = ctypes.get_errno()
    if r == -1 and err:
        raise OSError(err, f"ptrace({request}) on {pid} at {addr:#x}")
    return r & 0xFFFFFFFFFFFFFFFF


def functions(program):
    """Offset -> name of every function the file defines."""
    listed = subprocess.run(
        ["nm", "--defined-only", program], capture_output=True, text=True, check=True
    ).stdout
    found = {}
    for line in listed.splitlines():
        fields = line.split()
        if len(fields) == 3 and fields[1] in "tTwW":
            offset = int(fields[0], 16)
            if offset:
                found.setdefault(offset, fields[2])
    return found


def load_base(pid, program):
    real = os.path.realpath(program)
    base = None
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            f = line.split()
            if len(f) >= 6 and f[5] == real:
                start = int(f[0].split("-")[0], 16) - int(f[2], 16)
                base = start if base is None else min(base, start)
    if base is None:
        sys.exit(f"{program} is not mapped in process {pid}")
    return base


def set_byte(pid, addr, value):
    word = ptrace(PEEKTEXT, pid, addr)
    ptrace(POKETEXT, pid, addr, (word & ~0xFF) | value)


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    out, program, args = sys.argv[1], sys.argv[2], sys.argv[3:]
    names = functions(program)
    pid = os.fork()
    if pid == 0:
        env = dict(os.environ)
        if "LISTEN_FDS" in env:
            env["LISTEN_PID"] = str(os.getpid())
        libc.ptrace(TRACEME, 0, None, None)
        os.execve(program, [program] + args, env)

    def pass_on(sig, _frame):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass

    signal.signal(signal.SIGTERM, pass_on)
    signal.signal(signal.SIGINT, pass_on)

    _, status = os.waitpid(pid, WAIT_ALL)  # stopped at the exec
    if not os.WIFSTOPPED(status):
        sys.exit(f"{program} did not start")
    base = load_base(pid, program)
    original = {base + off: ptrace(PEEKTEXT, pid, base + off) & 0xFF for off in names}
    for addr in original:
        set_byte(pid, addr, INT3)
    ptrace(SETOPTIONS, pid, 0, OPT_TRACECLONE | OPT_EXITKILL)

    order, seen = [], set()
    regs = (ctypes.c_ulonglong * 27)()
    ptrace(CONT, pid)
    while True:
        try:
            tid, status = os.waitpid(-1, WAIT_ALL)
        except InterruptedError:
            continue
        except ChildProcessError:
            break
        if os.WIFEXITED(status) or os.WIFSIGNALED(status):
            if tid == pid:
                break
            continue
        if not os.WIFSTOPPED(status):
            continue
        sig, event = os.WSTOPSIG(status), status >> 16
        deliver = sig
        if sig == signal.SIGTRAP and event == 0:
            ptrace(GETREGS, tid, 0, ctypes.addressof(regs))
            addr = regs[RIP] - 1
            if addr in original:
                set_byte(tid, addr, original.pop(addr))
                order.append(addr)
                seen.add(addr)
            if addr in seen:
                # Also a second thread that reached the breakpoint before
                # it was removed.
                regs[RIP] = addr
                ptrace(SETREGS, tid, 0, ctypes.addressof(regs))
                deliver = 0
        elif sig in (signal.SIGTRAP, signal.SIGSTOP):
            deliver = 0  # clone events, a new thread's first stop
        try:
            ptrace(CONT, tid, 0, deliver)
        except OSError:
            pass  # the thread is gone
    with open(out, "a") as f:
        f.writelines(names[addr - base] + "\n" for addr in order)


if __name__ == "__main__":
    main()
