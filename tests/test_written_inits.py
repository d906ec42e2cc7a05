"""Dataclasses of the compiled modules whose ``__init__`` is written out stay in step with
their fields.

A dataclass's generated ``__init__`` is interpreted code even in the compiled build, so
the records made per message or per connection write theirs out (``init=False``, or an
``__init__`` in the class body; :mod:`smcr.rdma.verbs`).  A field added, renamed or
reordered later must not leave the written one behind: each takes exactly the fields'
parameters (names, order, keyword-only or not, defaults; a ``default_factory`` field as
``None``), and sets every field from the parameter of its name, once.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
from typing import Any

import pytest

from smcr.core.events import HandshakeCompleted, NextHop, SendClc
from smcr.core.negotiation import ServerChoice
from smcr.nativebuild import MODULES, PACKAGE_DIR
from smcr.stack.hostconn import HostConn


def _module_name(path: str) -> str:
    return "smcr." + path.removesuffix(".py").replace("/", ".")


def _written_out() -> list[type[Any]]:
    """The dataclasses of the compiled modules that define their own ``__init__``."""
    found = []
    for path in MODULES:
        module = importlib.import_module(_module_name(path))
        for obj in vars(module).values():
            if (isinstance(obj, type) and obj.__module__ == module.__name__
                    and dataclasses.is_dataclass(obj) and "__init__" in vars(obj)):  # fmt: skip
                code = getattr(vars(obj)["__init__"], "__code__", None)
                if code is None or code.co_filename != "<string>":  # (not the generated one)
                    found.append(obj)
    return found


WRITTEN = _written_out()


def test_the_records_made_per_connection_are_among_them() -> None:
    """(Else the checks below would pass on an empty list.)"""
    names = {cls.__name__ for cls in WRITTEN}
    assert {"SendClc", "HandshakeCompleted", "ServerChoice", "Rmb", "Handshake", "HostConn",
            "ClcHeader", "_AcceptConfirm", "PostSend", "WorkCompletion"} <= names  # fmt: skip


def _init_def(cls: type[Any]) -> ast.FunctionDef:
    """The written ``__init__``'s definition, from the module's source file (a compiled
    module has no source for ``inspect``)."""
    path = PACKAGE_DIR / (cls.__module__.removeprefix("smcr.").replace(".", "/") + ".py")
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ClassDef) and node.name == cls.__name__:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                    return item
    raise AssertionError(f"{cls.__name__}: no __init__ in {path}")


def _parameters(cls: type[Any]) -> list[tuple[str, bool, object]]:
    """(name, keyword-only?, default or ``inspect.Parameter.empty``) of the written ``__init__``,
    from its source (the compiled build's classes do not all carry a signature), its defaults
    evaluated in the class's module."""
    args = _init_def(cls).args
    namespace = vars(importlib.import_module(cls.__module__))

    def value(node: ast.expr | None) -> object:
        if node is None:
            return inspect.Parameter.empty
        return eval(compile(ast.Expression(node), "<default>", "eval"), namespace)

    positional = args.args[1:]  # (self)
    pos_defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    return [(a.arg, False, value(d)) for a, d in zip(positional, pos_defaults, strict=True)] + [
        (a.arg, True, value(d)) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)]


FLAGS = ("trusted",)
"""Parameters a written ``__init__`` may take after the fields, none of them a field: how to
build, not what (``_AcceptConfirm``'s ``trusted``: a decoder's fields are not checked
again).  Each defaults to False, so that the dataclass's own ways of building one
(``dataclasses.replace``) check as before."""


@pytest.mark.parametrize("cls", WRITTEN, ids=lambda c: c.__name__)
def test_parameters_are_the_fields(cls: type[Any]) -> None:
    fields = [f for f in dataclasses.fields(cls) if f.init]
    params = _parameters(cls)
    while params and params[-1][0] in FLAGS:
        assert params.pop()[2] is False, "a flag defaults to False"
    assert [p[0] for p in params] == [f.name for f in fields]
    for (name, kw_only, default), f in zip(params, fields, strict=True):
        assert kw_only == f.kw_only, name
        if f.default is not dataclasses.MISSING:
            assert default == f.default, name
        elif f.default_factory is not dataclasses.MISSING:
            assert default is None, f"{name}: a default_factory field defaults to None"
        else:
            assert default is inspect.Parameter.empty, name


@pytest.mark.parametrize("cls", WRITTEN, ids=lambda c: c.__name__)
def test_every_field_is_set_once_from_its_parameter(cls: type[Any]) -> None:
    init = _init_def(cls)
    set_from: dict[str, ast.expr] = {}
    for node in ast.walk(init):
        target = value = None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            t = node.targets[0]
            if (isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
                    and t.value.id == "self"):  # fmt: skip
                target, value = t.attr, node.value
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "__setattr__" and len(node.args) == 3
              and isinstance(node.args[1], ast.Constant)):  # fmt: skip
            target, value = str(node.args[1].value), node.args[2]
        if target is not None and value is not None:
            assert target not in set_from, f"{cls.__name__}.{target} set twice"
            set_from[target] = value
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    assert sorted(set_from) == sorted(names)
    for name, value in set_from.items():
        used = {n.id for n in ast.walk(value) if isinstance(n, ast.Name)}
        assert name in used, f"{cls.__name__}.{name} is not set from its parameter"


def test_defaults_and_factories_as_the_dataclass_made_them() -> None:
    done = HandshakeCompleted(conn=3, first_contact=True, lgr_id=7)
    assert (done.conn, done.first_contact, done.lgr_id, done.version) == (3, True, 7, 1)
    assert SendClc(1, b"x") == SendClc(1, b"x") != SendClc(2, b"x")
    choice = ServerChoice(1, b"g" * 16, b"m" * 6)
    assert choice.next_hop == NextHop() and choice.terms is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        choice.version = 2  # type: ignore[misc]
    a = HostConn(1, None, None)  # type: ignore[arg-type]
    b = HostConn(2, None, None)  # type: ignore[arg-type]
    assert a.on_release == [] and a.aliases == {} and a.rmb_group == -1
    assert a.on_release is not b.on_release and a.aliases is not b.aliases
