"""Classic BPF programs compiled to Python functions, with libpcap's `bpf_filter` semantics.

`FrameFilter` runs the program `collector run` attaches to its socket on every
frame of a file. Calling libpcap's interpreter through ctypes costs more than
the program itself, so the program is translated once per network-layer offset
into Python source: its jumps only go forward, so it is a tree of `if`s whose
every path ends in a `return`. The function takes the frame, whose packet
starts at that offset, and returns what the program returns (0: the packet is
rejected), exactly as `bpf_filter(program, packet, len, len)` does:

- a load that reaches past the packet's end, and a division or modulo by an
  X of zero, return 0;
- arithmetic is on 32-bit unsigned values; a shift by an X of 32 or more gives 0;
- the scratch memory and both registers start at 0.

The source stays short: the accumulator is kept as an expression until a
value is needed twice (a load, a mask and a compare become one `if`), and a
packet length already checked on a path is not checked again.

A program that `bpf_validate` would refuse (an unknown instruction, a jump or
scratch slot out of range, a constant division by zero or shift of 32 or more, a
path that runs off its end) raises `UncompilableProgramError`, and so does one
whose tree would exceed `MAX_STATEMENTS` statements or `MAX_DEPTH` nested `if`s
(shared tails are copied into each path that reaches them): the caller then
keeps libpcap's interpreter.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from collector.capture.bpf import Instruction
from collector.capture.errors import CaptureError

#: A compiled program: the frame -> the program's return value on the packet in it.
CompiledFilter = Callable[[bytes], int]

MAX_STATEMENTS = 4096
MAX_DEPTH = 64
_MEMWORDS = 16
_U32 = 0xFFFFFFFF

_LD, _LDX, _ST, _STX, _ALU, _JMP, _RET, _MISC = range(8)
_SIZES = {0x00: 4, 0x08: 2, 0x10: 1}
_IMM, _ABS, _IND, _MEM, _LEN, _MSH = 0x00, 0x20, 0x40, 0x60, 0x80, 0xA0
_WRAPPING = {0x00: "+", 0x10: "-", 0x20: "*"}
_BITWISE = {0x40: "|", 0x50: "&", 0xA0: "^"}
_DIV, _LSH, _RSH, _NEG, _MOD = 0x30, 0x60, 0x70, 0x80, 0x90
_JUMPS = {0x10: "==", 0x20: ">", 0x30: ">=", 0x40: "&"}
_JA = 0x00
_SRC_X = 0x08
_RET_A = 0x10
_TAX, _TXA = 0x00, 0x80
#: Every instruction libpcap's interpreter runs (it aborts on any other).
_CODES = frozenset(
    {0x06, 0x16, 0x20, 0x28, 0x30, 0x80, 0x81, 0x40, 0x48, 0x50, 0xB1, 0x00, 0x01}
    | {0x60, 0x61, 0x02, 0x03, 0x05, 0x84, 0x07, 0x87}
    | {0x05 | op | src for op in (0x10, 0x20, 0x30, 0x40) for src in (0, _SRC_X)}
    | {
        0x04 | op | src
        for op in (0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x90, 0xA0)
        for src in (0, _SRC_X)
    }
)


class UncompilableProgramError(CaptureError):
    """The program is not one this compiler translates (the interpreter runs it instead)."""


def compile_program(program: Sequence[Instruction], offset: int) -> CompiledFilter:
    """`program` as a Python function of frames whose packet starts at `offset`."""
    if not program:
        raise UncompilableProgramError("an empty program")
    for pc, (code, _jt, _jf, _k) in enumerate(program):
        if code not in _CODES:
            raise UncompilableProgramError(f"unknown instruction {code:#x} at {pc}")
    emitter = _Emitter(program, offset)
    body = emitter.emit(0, _State("0", offset), 1)
    lines = ["def bpf_program(p):", " m = len(p)", " X = 0"]
    # The scratch slots the program reads or writes, as locals (no list per packet).
    slots = sorted({k for code, _jt, _jf, k in program if _uses_memory(code)})
    if slots:
        lines.append(" " + " = ".join(f"M{k}" for k in slots) + " = 0")
    namespace: dict[str, object] = {}
    source = "\n".join([*lines, *(" " + line for line in body)])
    exec(compile(source, "<bpf program>", "exec"), namespace)
    compiled: CompiledFilter = namespace["bpf_program"]  # type: ignore[assignment]
    return compiled


@dataclass(frozen=True, slots=True)
class _State:
    """What the code emitted so far on one path leaves behind."""

    #: A Python expression for the accumulator (reading only `p`, `A`, `X` and `M`).
    a: str
    #: The frame is known to hold at least this many bytes (`m >= checked`).
    checked: int


class _Emitter:
    """Writes the statements of every path through the program."""

    def __init__(self, program: Sequence[Instruction], offset: int) -> None:
        self.program = program
        self.offset = offset
        self.statements = 0
        self.a_live = _accumulator_liveness(program)

    def emit(self, pc: int, state: _State, depth: int) -> list[str]:
        """The statements (unindented) from instruction `pc` to the returns of every path."""
        if depth > MAX_DEPTH:
            raise UncompilableProgramError(f"more than {MAX_DEPTH} nested jumps")
        program = self.program
        out: list[str] = []
        while True:
            if not 0 <= pc < len(program):
                raise UncompilableProgramError(f"a path runs past the program's end at {pc}")
            code, jt, jf, k = program[pc]
            kind = code & 0x07
            if kind == _RET:
                source = code & 0x18
                value = state.a if source == _RET_A else str(k)
                self._add(out, f"return {value}")
                return out
            if kind != _JMP:
                state = self._straight(out, pc, code, k, state)
                pc += 1
                continue
            op = code & 0xF0
            if op == _JA:
                pc += 1 + k
                continue
            test = _JUMPS.get(op)
            if test is None:
                raise UncompilableProgramError(f"unknown jump {code:#x} at {pc}")
            if jt == jf:
                pc += 1 + jt
                continue
            yes, no = pc + 1 + jt, pc + 1 + jf
            if self.a_live[yes] or self.a_live[no]:
                state = self._materialize(out, state)
            operand = "X" if code & _SRC_X else str(k)
            condition = f"{state.a} {test} {operand}"
            taken = self.emit(yes, state, depth + 1)
            fallen = self.emit(no, state, depth + 1)
            # The shorter branch goes inside the `if`; the other follows it (both return).
            if len(taken) > len(fallen):
                condition, taken, fallen = f"not ({condition})", fallen, taken
            self._add(out, f"if {condition}:")
            out += [" " + line for line in taken]
            out += fallen
            return out

    def _add(self, out: list[str], statement: str) -> None:
        self.statements += 1
        if self.statements > MAX_STATEMENTS:
            raise UncompilableProgramError(f"more than {MAX_STATEMENTS} statements")
        out.append(statement)

    def _materialize(self, out: list[str], state: _State) -> _State:
        """Assign the accumulator's expression to A (before X or M change, or a reuse)."""
        if state.a == "A" or state.a.isdigit():
            return state
        self._add(out, f"A = {state.a}")
        return replace(state, a="A")

    def _need(self, out: list[str], state: _State, end: int) -> _State:
        """Return 0 unless the frame holds `end` bytes."""
        if end <= state.checked:
            return state
        self._add(out, f"if m < {end}: return 0")
        return replace(state, checked=end)

    def _straight(self, out: list[str], pc: int, code: int, k: int, state: _State) -> _State:
        """Emit one instruction that neither jumps nor returns."""
        kind = code & 0x07
        if kind == _LD:
            return self._load(out, pc, code, k, state)
        if kind == _ALU:
            return self._alu(out, pc, code, k, state)
        if kind == _MISC and code & 0xF8 == _TXA:
            return replace(state, a="X")
        # Everything else writes X or M, which the accumulator's expression may read.
        if self.a_live[pc]:
            state = self._materialize(out, state)
        if kind in (_ST, _STX):
            _check_slot(pc, k)
            self._add(out, f"M{k} = {state.a if kind == _ST else 'X'}")
            return state
        if kind == _MISC and code & 0xF8 == _TAX:
            self._add(out, f"X = {state.a}")
            return state
        if kind == _LDX:
            return self._load_x(out, pc, code, k, state)
        raise UncompilableProgramError(f"unknown instruction {code:#x} at {pc}")

    def _load(self, out: list[str], pc: int, code: int, k: int, state: _State) -> _State:
        mode = code & 0xE0
        size = _SIZES.get(code & 0x18)
        if size is None:
            raise UncompilableProgramError(f"unknown load size {code:#x} at {pc}")
        if mode == _IMM:
            return replace(state, a=str(k))
        if mode == _LEN and size == 4:
            return replace(state, a=f"(m - {self.offset})")
        if mode == _MEM:
            _check_slot(pc, k)
            return replace(state, a=f"M{k}")
        at = self.offset + k
        if mode == _ABS:
            state = self._need(out, state, at + size)
            return replace(state, a=_read("", at, size))
        if mode == _IND:
            self._add(out, f"if m < X + {at + size}: return 0")
            return replace(state, a=_read("X + ", at, size))
        raise UncompilableProgramError(f"unknown load {code:#x} at {pc}")

    def _load_x(self, out: list[str], pc: int, code: int, k: int, state: _State) -> _State:
        mode = code & 0xE0
        if code & 0x18 not in _SIZES:
            raise UncompilableProgramError(f"unknown load size {code:#x} at {pc}")
        if mode == _IMM:
            value = str(k)
        elif mode == _LEN and code & 0x18 == 0:
            value = f"m - {self.offset}"
        elif mode == _MEM:
            _check_slot(pc, k)
            value = f"M{k}"
        elif mode == _MSH and code & 0x18 == 0x10:
            state = self._need(out, state, self.offset + k + 1)
            value = f"(p[{self.offset + k}] & 15) << 2"
        else:
            raise UncompilableProgramError(f"unknown load {code:#x} at {pc}")
        self._add(out, f"X = {value}")
        return state

    def _alu(self, out: list[str], pc: int, code: int, k: int, state: _State) -> _State:
        op = code & 0xF0
        operand = "X" if code & _SRC_X else str(k)
        a = state.a
        if op in _WRAPPING:
            return replace(state, a=f"(({a} {_WRAPPING[op]} {operand}) & {_U32})")
        if op in _BITWISE:
            return replace(state, a=f"({a} {_BITWISE[op]} {operand})")
        if op == _NEG:
            return replace(state, a=f"(-{a} & {_U32})")
        if op in (_DIV, _MOD):
            python = "//" if op == _DIV else "%"
            if code & _SRC_X:
                self._add(out, "if not X: return 0")
            elif k == 0:
                raise UncompilableProgramError(f"a division by the constant 0 at {pc}")
            return replace(state, a=f"({a} {python} {operand})")
        if op in (_LSH, _RSH):
            shift = "<<" if op == _LSH else ">>"
            if code & _SRC_X:
                return replace(state, a=f"((({a} {shift} X) & {_U32}) if X < 32 else 0)")
            if k >= 32:
                raise UncompilableProgramError(f"a shift by {k} at {pc}")
            return replace(state, a=f"(({a} {shift} {k}) & {_U32})")
        raise UncompilableProgramError(f"unknown arithmetic {code:#x} at {pc}")


def _read(base: str, at: int, size: int) -> str:
    """A big-endian read of `size` bytes of the frame at index `base` + `at`."""
    if size == 1:
        return f"p[{base}{at}]"
    if size == 2:
        return f"(p[{base}{at}] << 8 | p[{base}{at + 1}])"
    return f"int.from_bytes(p[{base}{at} : {base}{at + 4}])"


def _accumulator_liveness(program: Sequence[Instruction]) -> list[bool]:
    """Whether each instruction may read the accumulator before writing it (and one past
    the end, so that a jump there is looked up safely; the emitter refuses it)."""
    live = [False] * (len(program) + 256)
    for pc in range(len(program) - 1, -1, -1):
        code, _jt, _jf, k = program[pc]
        kind = code & 0x07

        def after(target: int) -> bool:
            return 0 <= target < len(program) and live[target]

        if kind == _RET:
            live[pc] = code & 0x18 == _RET_A
        elif kind == _JMP:
            if code & 0xF0 == _JA:
                live[pc] = after(pc + 1 + k)
            else:
                live[pc] = True
        elif kind == _LD or (kind == _MISC and code & 0xF8 == _TXA):
            live[pc] = False
        elif kind in (_ALU, _ST) or (kind == _MISC and code & 0xF8 == _TAX):
            live[pc] = True
        else:
            live[pc] = after(pc + 1)
    return live


def _uses_memory(code: int) -> bool:
    kind = code & 0x07
    return kind in (_ST, _STX) or (kind in (_LD, _LDX) and code & 0xE0 == _MEM)


def _check_slot(pc: int, k: int) -> None:
    if not 0 <= k < _MEMWORDS:
        raise UncompilableProgramError(f"scratch slot {k} out of range at {pc}")
