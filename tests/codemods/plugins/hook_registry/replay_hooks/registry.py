"""A hook registry keyed by dotted method paths: each around-hook wraps the method the path names."""

import functools
import importlib

AROUND_HOOKS = {}


def around(target):
    """Register the decorated function as an around-hook of the method at ``target`` (``module.Class.method``)."""

    def register(hook):
        AROUND_HOOKS.setdefault(target, []).append(hook)
        return hook

    return register


def resolve(path):
    """The class and method name a dotted path ``module.Class.method`` names."""
    owner_path, _, method = path.rpartition(".")
    module_path, _, class_name = owner_path.rpartition(".")
    return getattr(importlib.import_module(module_path), class_name), method


def install():
    """Wrap every registered method with its hooks; returns an undo function."""
    originals = []
    for path, hooks in AROUND_HOOKS.items():
        owner, method = resolve(path)
        original = getattr(owner, method)
        wrapped = original
        for hook in hooks:
            wrapped = _wrap(hook, wrapped)
        originals.append((owner, method, original))
        setattr(owner, method, wrapped)

    def undo():
        for owner, method, original in reversed(originals):
            setattr(owner, method, original)

    return undo


def _wrap(hook, inner):
    @functools.wraps(inner)
    def call(self, *args, **kwargs):
        return hook(inner, self, *args, **kwargs)

    return call
