"""The Megatron backend inherits the torch backend's RL step: every attribute those inherited methods read must
exist on a Megatron backend too.

`MegatronTrainBackend` does not call `TorchTrainBackend.__init__` (it builds megatron-core's model and optimizer
instead), so an attribute that a new feature adds to the torch backend's ``__init__`` and reads in an inherited
method is missing there. CI has no GPU and megatron-core does not run on CPU: the first to see it would be a GPU run
(``--lr-decay-style`` once failed every Megatron run with ``no attribute 'schedule'``). This reads both classes'
source: the ``self.<name>`` reads of the inherited methods against what the Megatron class sets or defines.
"""

from __future__ import annotations

import ast
import inspect
import textwrap

from relax.backends.torch.backend import TorchTrainBackend

MEGATRON_SOURCE = "relax/backends/megatron/backend.py"


def _class_node(tree: ast.Module, name: str) -> ast.ClassDef:
    return next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name)


def _methods(cls: ast.ClassDef) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}


def _self_attrs(node: ast.AST, ctx: type) -> set[str]:
    return {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ctx)
            and isinstance(n.value, ast.Name) and n.value.id == "self"}


def _defined(cls: ast.ClassDef) -> set[str]:
    """Names a class gives its instances: methods, class attributes, and every ``self.x = ...`` in its methods."""
    names = set(_methods(cls))
    for n in cls.body:
        if isinstance(n, ast.Assign):
            names |= {t.id for t in n.targets if isinstance(t, ast.Name)}
        elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
            names.add(n.target.id)
    for fn in _methods(cls).values():
        names |= _self_attrs(fn, ast.Store)
    return names


def test_inherited_methods_read_only_what_the_megatron_backend_sets() -> None:
    torch_cls = _class_node(ast.parse(textwrap.dedent(inspect.getsource(TorchTrainBackend))), "TorchTrainBackend")
    with open(MEGATRON_SOURCE) as f:
        mcore_cls = _class_node(ast.parse(f.read()), "MegatronTrainBackend")
    torch_methods = _methods(torch_cls)
    overridden = set(_methods(mcore_cls)) | {t.id for n in mcore_cls.body if isinstance(n, ast.Assign)
                                             for t in n.targets if isinstance(t, ast.Name)}  # e.g. onload = offload
    # an override that calls ``super().name(...)`` still runs the torch backend's ``name``
    supers = {n.attr for fn in _methods(mcore_cls).values() for n in ast.walk(fn) if isinstance(n, ast.Attribute)
              and isinstance(n.value, ast.Call) and isinstance(n.value.func, ast.Name) and n.value.func.id == "super"}
    inherited = {name: fn for name, fn in torch_methods.items()
                 if (name not in overridden or name in supers) and name != "__init__"}
    # the inherited methods a Megatron backend can run: public ones, and those that reachable ones or Megatron's call
    reachable = {name for name in inherited if not name.startswith("_")}
    reachable |= {a for fn in _methods(mcore_cls).values() for a in _self_attrs(fn, ast.Load)} & set(inherited)
    while grown := {a for name in reachable for a in _self_attrs(inherited[name], ast.Load)} & set(inherited) - reachable:
        reachable |= grown
    inherited = {name: inherited[name] for name in reachable}
    # what either class gives a Megatron backend outside TorchTrainBackend.__init__
    init_only = _self_attrs(torch_methods["__init__"], ast.Store) - {
        a for name, fn in inherited.items() for a in _self_attrs(fn, ast.Store)}
    # a class-level default (``routing = None``) exists on every instance, whatever __init__ assigns later
    class_level = {t.id for n in torch_cls.body if isinstance(n, ast.Assign) for t in n.targets
                   if isinstance(t, ast.Name)}
    class_level |= {n.target.id for n in torch_cls.body if isinstance(n, ast.AnnAssign) and n.value is not None
                    and isinstance(n.target, ast.Name)}
    available = (_defined(torch_cls) - init_only) | class_level | _defined(mcore_cls)
    missing = {f"{name} reads self.{attr}" for name, fn in inherited.items()
               for attr in _self_attrs(fn, ast.Load) - available}
    assert not missing, "set by TorchTrainBackend.__init__ only: " + "; ".join(sorted(missing))
