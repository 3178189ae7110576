"""What crosses the pipe between a lesson check (the parent) and the exercise process (the child).

A call to a student's function sends its arguments; the answer sends back what the function did
to them and what it returned. The engine objects in the arguments stay the parent's own:

    Shared.of(args, kwargs)            the parent's mutable objects the call can reach
    send_call(args, kwargs, shared)    -> bytes: the arguments, then the list of shared objects
    read_call(data)                    -> (args, kwargs, shared) rebuilt in the child
    send_answer(outcome, shared)       -> bytes: the outcome and every shared object's state,
                                          shared objects named by their index
    read_answer(data, shared)          -> outcome, the state copied back into the parent's objects

The child is the student's: read_answer trusts nothing in it. It unpickles with a closed list of
classes and of callables (no class, function or module comes back as a value), refuses anything
malformed with NotAResult, and copies back only attributes the parent's object already has.
Code objects (an Event's `where`) cross as references; tensors as dtype, shape and bytes.
"""

from __future__ import annotations

import io
import pickle
from collections import OrderedDict, deque
from dataclasses import dataclass
from enum import Enum
from types import CodeType
from typing import Any

MAX_ANSWER_BYTES = 64 * 2**20
CONTAINERS = (list, dict, set, deque)  # OrderedDict is a dict
TENSOR_DTYPES = ("float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "int8", "uint8", "bool")


class NotAResult(ValueError):
    """The child sent something that is not an answer to the call."""


def engine_classes() -> dict[tuple[str, str], type]:
    """The classes an answer may hold, by (module, name): the engine's data, nothing with behaviour
    beyond it. Imported here, not at module import (the engine loads torch)."""
    from nanoengine.block_manager import BlockManager
    from nanoengine.model_runner import StepInputs
    from nanoengine.sampling_params import SamplingParams
    from nanoengine.scheduler import Event, Scheduler, SchedulerOutput
    from nanoengine.sequence import EventKind, FinishReason, Logprob, Sequence, SequenceStatus

    classes = (BlockManager, StepInputs, SamplingParams, Event, Scheduler, SchedulerOutput, Sequence, Logprob)
    enums = (EventKind, FinishReason, SequenceStatus)
    return {(c.__module__, c.__qualname__): c for c in (*classes, *enums)}


def is_shared_type(obj: object) -> bool:
    """The parent's objects a call may change: engine objects (not frozen ones) and containers."""
    if isinstance(obj, CONTAINERS):
        return True
    cls = type(obj)
    return (
        cls.__module__.startswith("nanoengine.")
        and not isinstance(obj, Enum)
        and not getattr(getattr(cls, "__dataclass_params__", None), "frozen", False)
    )


def attributes(obj: object) -> dict[str, Any]:
    """An object's own attributes: its slots and its __dict__."""
    names = [n for cls in type(obj).__mro__ for n in getattr(cls, "__slots__", ()) if not n.startswith("__")]
    found = {n: getattr(obj, n) for n in names if hasattr(obj, n)}
    found.update(getattr(obj, "__dict__", {}))
    return found


def state_of(obj: object) -> Any:
    """A shared object's contents, as a fresh value (so that it is pickled, not named)."""
    if isinstance(obj, dict):
        return list(obj.items())
    if isinstance(obj, (list, set, deque)):
        return list(obj)
    return attributes(obj)


def is_tensor(obj: object) -> bool:
    return type(obj).__module__ == "torch" and type(obj).__name__ in ("Tensor", "Parameter")


@dataclass(slots=True)
class Shared:
    """The parent's objects a call can reach, in the order found; the answer names them by index."""

    objects: list[Any]

    @classmethod
    def of(cls, *roots: Any) -> Shared:
        found: dict[int, Any] = {}
        stack = list(roots)
        while stack:
            obj = stack.pop()
            if id(obj) in found or is_tensor(obj):
                continue
            if isinstance(obj, tuple | frozenset):
                stack.extend(obj)
            elif is_shared_type(obj):
                found[id(obj)] = obj
                state = state_of(obj)
                stack.extend(state.values() if isinstance(state, dict) else state)
        return cls(list(found.values()))


# ---- pickling, both ways ----------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class CodeRef:
    """A code object of the parent's, as the child holds it: its index in the call's list."""

    index: int


def rebuild_tensor(dtype: str, shape: tuple[int, ...], data: bytes) -> Any:
    import torch

    if dtype not in TENSOR_DTYPES or not all(isinstance(n, int) and n >= 0 for n in shape):
        raise NotAResult(f"a tensor of dtype {dtype!r} and shape {shape!r}")
    tensor = torch.empty(shape, dtype=getattr(torch, dtype))
    if len(data) != tensor.numel() * tensor.element_size():
        raise NotAResult("a tensor whose bytes do not fit its shape")
    if data:
        tensor.view(-1).view(torch.uint8).copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
    return tensor


def reduce_tensor(tensor: Any) -> tuple:
    flat = tensor.detach().cpu().contiguous()
    data = flat.view(-1).view(__import__("torch").uint8).numpy().tobytes() if flat.numel() else b""
    return rebuild_tensor, (str(flat.dtype).removeprefix("torch."), tuple(flat.shape), data)


class WirePickler(pickle.Pickler):
    """Names shared objects and code objects by index; sends tensors as bytes."""

    def __init__(self, file: io.BytesIO, shared: list[Any], codes: list[CodeType] | None) -> None:
        super().__init__(file, protocol=5)
        self.shared = {id(obj): i for i, obj in enumerate(shared)}
        self.codes = codes  # the parent's: each code object gets an index; the child's: None

    def persistent_id(self, obj: Any) -> Any:
        if id(obj) in self.shared:
            return ("shared", self.shared[id(obj)])
        if isinstance(obj, CodeRef):
            return ("code", obj.index)
        if isinstance(obj, CodeType):
            if self.codes is None:
                return ("code", -1)  # the child's own code: the parent shows no line for it
            self.codes.append(obj)
            return ("code", len(self.codes) - 1)
        return None

    def reducer_override(self, obj: Any) -> Any:
        return reduce_tensor(obj) if is_tensor(obj) else NotImplemented


def send_call(args: tuple, kwargs: dict, shared: Shared, codes: list[CodeType]) -> bytes:
    """The call's arguments, then the shared list: one pickler, so one memo, so the same objects."""
    buffer = io.BytesIO()
    pickler = WirePickler(buffer, [], codes)
    pickler.dump((args, kwargs))
    pickler.dump(shared.objects)
    return buffer.getvalue()


class CallUnpickler(pickle.Unpickler):
    """The child's side: the parent is trusted; its code objects become CodeRefs."""

    def persistent_load(self, pid: Any) -> Any:
        return CodeRef(pid[1])


def read_call(data: bytes) -> tuple[tuple, dict, list[Any]]:
    unpickler = CallUnpickler(io.BytesIO(data))
    args, kwargs = unpickler.load()
    return args, kwargs, unpickler.load()


def send_answer(outcome: tuple, shared: list[Any]) -> bytes:
    """The outcome and each shared object's state; a shared object anywhere in them is its index."""
    buffer = io.BytesIO()
    WirePickler(buffer, shared, None).dump((outcome, [state_of(obj) for obj in shared]))
    return buffer.getvalue()


# ---- the parent reads an answer ---------------------------------------------------------------
SAFE_CALLABLES: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): OrderedDict,
    ("collections", "deque"): deque,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    (__name__, "rebuild_tensor"): rebuild_tensor,
}


PythonUnpickler: Any = pickle._Unpickler  # type: ignore[attr-defined]  # the Python one: its opcodes can be guarded


class AnswerUnpickler(PythonUnpickler):
    """Only the engine's data classes, their enums and a few containers; calls only to those."""

    dispatch = dict(PythonUnpickler.dispatch)

    def __init__(self, data: bytes, shared: list[Any], codes: list[CodeType]) -> None:
        super().__init__(io.BytesIO(data))
        self.shared, self.codes = shared, codes
        self.allowed = {**SAFE_CALLABLES, **engine_classes()}
        self.created: set[int] = set()

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self.allowed:
            raise NotAResult(f"it names {module}.{name}")
        return self.allowed[(module, name)]

    def persistent_load(self, pid: Any) -> Any:
        match pid:
            case ("shared", int(i)) if 0 <= i < len(self.shared):
                return self.shared[i]
            case ("code", int(i)):
                return self.codes[i] if 0 <= i < len(self.codes) else None
        raise NotAResult(f"it names an unknown object {pid!r:.60}")

    def load_reduce(self) -> None:
        func = self.stack[-2]
        if not any(func is allowed for allowed in self.allowed.values()) or (
            isinstance(func, type) and not is_callable_class(func)
        ):
            raise NotAResult(f"it calls {func!r:.60}")
        super().load_reduce()

    def load_newobj(self) -> None:
        super().load_newobj()
        self.created.add(id(self.stack[-1]))

    def load_build(self) -> None:
        """Only on an engine object this answer made: never on the parent's, nor on an enum member."""
        inst = self.stack[-2]
        if id(inst) not in self.created or isinstance(inst, Enum | type):
            raise NotAResult(f"it sets the attributes of {type(inst).__name__!r:.60}")
        super().load_build()

    def refuse(self) -> None:
        raise NotAResult("it holds an opcode a result never needs")

    dispatch[pickle.REDUCE[0]] = load_reduce
    dispatch[pickle.NEWOBJ[0]] = load_newobj
    dispatch[pickle.BUILD[0]] = load_build
    dispatch.update(
        dict.fromkeys(
            (pickle.INST[0], pickle.OBJ[0], pickle.EXT1[0], pickle.EXT2[0], pickle.EXT4[0], pickle.NEWOBJ_EX[0]), refuse
        )
    )


def is_callable_class(cls: type) -> bool:
    """Classes REDUCE may call: the containers and the enums (a value lookup), never an engine class
    (its __init__ could be told to allocate a pool of any size)."""
    return cls in (OrderedDict, deque, set, frozenset) or issubclass(cls, Enum)


def read_answer(data: bytes, shared: list[Any], codes: list[CodeType]) -> tuple:
    """The child's outcome; every shared object's state is copied into the parent's object first."""
    if len(data) > MAX_ANSWER_BYTES:
        raise NotAResult(f"it is {len(data)} bytes long")
    try:
        answer = AnswerUnpickler(data, shared, codes).load()
    except NotAResult:
        raise
    except Exception as e:  # a truncated or hand-made pickle fails in any of many ways
        raise NotAResult(f"it does not unpickle ({type(e).__name__})") from None
    match answer:
        case (tuple() as outcome, list() as states) if len(states) == len(shared):
            pass
        case _:
            raise NotAResult("it is not an (outcome, states) pair for this call")
    refuse_classes(answer)
    for obj, state in zip(shared, states):
        check_state(obj, state)
    for obj, state in zip(shared, states):
        apply_state(obj, state)
    return outcome


def refuse_classes(answer: Any) -> None:
    """No class, function or other callable comes back as a value (find_class hands them out)."""
    seen: set[int] = set()
    stack = [answer]
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, type) or callable(obj):
            raise NotAResult(f"it holds {obj!r:.60} as a value")
        if isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, list | tuple | set | frozenset | deque):
            stack.extend(obj)
        elif not is_tensor(obj) and not isinstance(obj, Enum) and type(obj).__module__.startswith("nanoengine."):
            stack.extend(attributes(obj).values())


def check_state(obj: Any, state: Any) -> None:
    want = dict if not isinstance(obj, CONTAINERS) else list
    if not isinstance(state, want):
        raise NotAResult(f"the state of a {type(obj).__name__} is a {type(state).__name__}")
    if isinstance(obj, dict) and not all(isinstance(item, tuple) and len(item) == 2 for item in state):
        raise NotAResult(f"the state of a {type(obj).__name__} is not a list of pairs")


def apply_state(obj: Any, state: Any) -> None:
    """Copy the state into the parent's object in place; attributes it does not have are ignored."""
    if isinstance(obj, dict):
        obj.clear()
        obj.update(state)
    elif isinstance(obj, list):
        obj[:] = state
    elif isinstance(obj, set | deque):
        obj.clear()
        obj.update(state) if isinstance(obj, set) else obj.extend(state)
    else:
        own = attributes(obj)
        for name, value in state.items():
            if isinstance(name, str) and name in own:
                setattr(obj, name, value)
