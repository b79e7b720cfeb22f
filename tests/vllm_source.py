"""Read a vLLM release's Python source without importing it (contract tests).

A release is a directory (the installed vLLM) or a wheel (read in place). Names
are resolved the way Python would find them statically: a class attribute is a
method, a class-level assignment, an assignment to ``self.<name>`` in one of the
class's methods, or the same in a base class (bases followed through the
module's ``from ... import`` statements).
"""

from __future__ import annotations

import ast
import functools
import zipfile
from dataclasses import dataclass
from pathlib import Path

FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef


@dataclass(frozen=True)
class Found:
    """Where a name is defined: its node, and the module that defines it."""

    node: ast.AST
    module: str

    @property
    def params(self) -> tuple[str, ...] | None:
        """Parameter names of a function (``*args``/``**kwargs`` written so), else None."""
        if not isinstance(self.node, FunctionNode):
            return None
        args = self.node.args
        names = [a.arg for a in (*args.posonlyargs, *args.args)]
        if args.vararg is not None:
            names.append("*" + args.vararg.arg)
        names += [a.arg for a in args.kwonlyargs]
        if args.kwarg is not None:
            names.append("**" + args.kwarg.arg)
        return tuple(names)


class VllmSource:
    """The ``vllm`` package of one release: an installed directory or a wheel file."""

    def __init__(self, location: Path) -> None:
        self.location = location
        self._wheel = zipfile.ZipFile(location) if location.is_file() else None

    def _read(self, relative: str) -> str | None:
        if self._wheel is not None:
            try:
                return self._wheel.read(f"vllm/{relative}").decode()
            except KeyError:
                return None
        path = self.location / relative
        return path.read_text() if path.is_file() else None

    @functools.cache
    def module(self, name: str) -> ast.Module | None:
        """The parsed module ``vllm.x.y`` (a file or a package's ``__init__``), or None."""
        parts = name.split(".")
        if parts[0] != "vllm":
            return None
        base = "/".join(parts[1:])
        for relative in (f"{base}.py", f"{base}/__init__.py" if base else "__init__.py"):
            text = self._read(relative)
            if text is not None:
                return ast.parse(text)
        return None

    def lookup(self, module: str, qualname: str) -> Found | None:
        """``module:Class.attribute``, ``module:function`` or ``module:NAME``, or None."""
        head, _, rest = qualname.partition(".")
        found = self._module_name(module, head)
        if found is None or not rest:
            return found
        if not isinstance(found.node, ast.ClassDef):
            return None
        return self._class_attribute(found, rest, depth=0)

    def _module_name(self, module: str, name: str, depth: int = 0) -> Found | None:
        tree = self.module(module)
        if tree is None or depth > 8:
            return None
        for node in tree.body:
            if isinstance(node, (ast.ClassDef, *FunctionNode.__args__)) and node.name == name:
                return Found(node, module)
            if _assigns(node, name):
                return Found(node, module)
        for node in ast.walk(tree):  # re-exports, also inside `if TYPE_CHECKING` / try blocks
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        return self._module_name(node.module, alias.name, depth + 1)
        return None

    def _class_attribute(self, cls: Found, attribute: str, depth: int) -> Found | None:
        assert isinstance(cls.node, ast.ClassDef)
        for node in cls.node.body:
            if isinstance(node, FunctionNode) and node.name == attribute:
                return Found(node, cls.module)
            if _assigns(node, attribute):
                return Found(node, cls.module)
        for method in cls.node.body:
            if isinstance(method, FunctionNode):
                for node in ast.walk(method):
                    if _assigns_self(node, attribute):
                        return Found(node, cls.module)
        if depth > 8:
            return None
        for base in cls.node.bases:
            name = _base_name(base)
            base_cls = self._module_name(cls.module, name) if name else None
            if base_cls is not None and isinstance(base_cls.node, ast.ClassDef):
                found = self._class_attribute(base_cls, attribute, depth + 1)
                if found is not None:
                    return found
        return None

    def accepts_new_attributes(self, module: str, class_name: str) -> bool:
        """Whether instances of the class (and its bases in vLLM) can take attributes it does not define:
        no ``__slots__``, no ``@dataclass(slots=True)``."""
        found = self._module_name(module, class_name)
        if found is None or not isinstance(found.node, ast.ClassDef):
            return False
        node = found.node
        if any(_assigns(statement, "__slots__") for statement in node.body):
            return False
        for decorator in node.decorator_list:
            keywords = decorator.keywords if isinstance(decorator, ast.Call) else []
            if any(k.arg == "slots" and getattr(k.value, "value", False) for k in keywords):
                return False
        bases = [_base_name(base) for base in node.bases]
        return all(self._module_name(found.module, b) is None or self.accepts_new_attributes(found.module, b)
                   for b in bases if b and b not in ("ABC", "Generic", "object"))

    def exports(self, module: str, name: str) -> bool:
        """Whether ``from module import name`` works: a definition, a re-export, a submodule, or
        a name the module's ``__getattr__`` answers (vLLM's lazy ``current_platform``)."""
        if self._module_name(module, name) is not None or self.module(f"{module}.{name}") is not None:
            return True
        getattr_hook = self._module_name(module, "__getattr__")
        return getattr_hook is not None and any(
            isinstance(node, ast.Constant) and node.value == name for node in ast.walk(getattr_hook.node)
        )


def _assigns(node: ast.AST, name: str) -> bool:
    if isinstance(node, ast.Assign):
        return any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
    if isinstance(node, ast.AnnAssign):
        return isinstance(node.target, ast.Name) and node.target.id == name
    return False


def _assigns_self(node: ast.AST, name: str) -> bool:
    targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
    return isinstance(node, (ast.Assign, ast.AnnAssign)) and any(
        isinstance(t, ast.Attribute) and t.attr == name and isinstance(t.value, ast.Name) and t.value.id == "self"
        for t in targets
    )


def _base_name(base: ast.expr) -> str | None:
    if isinstance(base, ast.Subscript):  # Generic[T], AttentionImpl[Metadata]
        base = base.value
    return base.id if isinstance(base, ast.Name) else None
