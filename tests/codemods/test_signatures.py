"""The signature model binds calls and judges overrides exactly as Python does.

Random signatures (every valid ordering of parameter kinds, names drawn from a small pool so keywords collide) are
turned into real functions with ``exec``; a call shape binds in the model exactly when calling the function (and
``inspect.Signature.bind``) accepts it. ``override_problem`` is checked against its definition by brute force: every
call the base accepts, up to a few positional arguments and any keywords from the pool, must be accepted by the
override. The examples use the runner's real signatures, as the manifest records them.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cudagraph.migrate.exports import ClassApi, load_exports
from cudagraph.migrate.signatures import Param, ParamKind, Signature

NAMES = ("a", "b", "c", "d", "e")
"""Parameter and keyword names: few, so a keyword often names a parameter (or a positional-only one)."""

FRESH = "zz"
"""A keyword no generated signature declares: only ``**kwargs`` takes it."""

SELF = Param("self", ParamKind.POSITIONAL_OR_KEYWORD, True)

_ORDER = (
    ParamKind.POSITIONAL_ONLY,
    ParamKind.POSITIONAL_OR_KEYWORD,
    ParamKind.VAR_POSITIONAL,
    ParamKind.KEYWORD_ONLY,
    ParamKind.VAR_KEYWORD,
)


@st.composite
def signatures(draw: st.DrawFn) -> Signature:
    """A signature Python accepts: kinds in declaration order, required positionals before optional ones."""
    names = draw(st.permutations(NAMES))
    counts = {
        ParamKind.POSITIONAL_ONLY: draw(st.integers(0, 2)),
        ParamKind.POSITIONAL_OR_KEYWORD: draw(st.integers(0, 3)),
        ParamKind.VAR_POSITIONAL: draw(st.integers(0, 1)),
        ParamKind.KEYWORD_ONLY: draw(st.integers(0, 2)),
        ParamKind.VAR_KEYWORD: draw(st.integers(0, 1)),
    }
    kinds = [kind for kind in _ORDER for _ in range(counts[kind])]
    positional = counts[ParamKind.POSITIONAL_ONLY] + counts[ParamKind.POSITIONAL_OR_KEYWORD]
    required_positional = draw(st.integers(0, positional))
    params = []
    for index, (name, kind) in enumerate(zip(names, kinds, strict=False)):
        if kind in (ParamKind.VAR_POSITIONAL, ParamKind.VAR_KEYWORD):
            required = False
        elif kind is ParamKind.KEYWORD_ONLY:
            required = draw(st.booleans())
        else:
            required = index < required_positional
        params.append(Param(name, kind, required))
    return Signature(tuple(params))


def source_of(signature: Signature, name: str = "function") -> str:
    """``def function(a, /, b=None, *c, d, **e): pass`` for ``signature``."""
    parts: list[str] = []
    for index, param in enumerate(signature.params):
        if param.kind is ParamKind.VAR_POSITIONAL:
            parts.append(f"*{param.name}")
        elif param.kind is ParamKind.VAR_KEYWORD:
            parts.append(f"**{param.name}")
        else:
            if param.kind is ParamKind.KEYWORD_ONLY and not any(
                earlier.kind in (ParamKind.KEYWORD_ONLY, ParamKind.VAR_POSITIONAL)
                for earlier in signature.params[:index]
            ):
                parts.append("*")
            parts.append(param.name if param.required else f"{param.name}=None")
        following = signature.params[index + 1] if index + 1 < len(signature.params) else None
        if param.kind is ParamKind.POSITIONAL_ONLY and (following is None or following.kind is not param.kind):
            parts.append("/")
    return f"def {name}({', '.join(parts)}):\n    pass\n"


def function_of(signature: Signature) -> Callable[..., None]:
    """A real function declaring ``signature``."""
    namespace: dict[str, object] = {}
    exec(source_of(signature), namespace)  # the source is generated above from a closed set of names
    function = namespace["function"]
    assert callable(function)
    return function


def python_binds(function: Callable[..., None], positional: int, keywords: Sequence[str]) -> bool:
    """Whether calling ``function`` with this shape raises no ``TypeError`` (its body does nothing)."""
    try:
        function(*range(positional), **dict.fromkeys(keywords, 0))
    except TypeError:
        return False
    return True


def inspect_binds(function: Callable[..., None], positional: int, keywords: Sequence[str]) -> bool:
    """Whether ``inspect.Signature.bind`` accepts the shape."""
    try:
        inspect.signature(function).bind(*range(positional), **dict.fromkeys(keywords, 0))
    except TypeError:
        return False
    return True


def _inspect_misjudges_positional_only_names(signature: Signature, keywords: Sequence[str]) -> bool:
    """Whether a keyword names a positional-only parameter, where ``inspect.Signature.bind`` and a real call disagree
    on some CPython releases.

    Python puts ``f(a=1)`` for ``def f(a=None, /, **kw)`` into ``kw``; CPython 3.11's ``bind`` raises instead. And
    CPython 3.13.0's ``bind`` accepts ``f(c=0)`` for ``def f(a=None, c=None, /)``, which the call refuses. The call
    itself is the truth the model follows; ``bind`` is compared everywhere else.
    """
    positional_only = {param.name for param in signature.params if param.kind is ParamKind.POSITIONAL_ONLY}
    return bool(positional_only & set(keywords))


keyword_sets = st.lists(st.sampled_from((*NAMES, FRESH)), unique=True, max_size=4)


@settings(max_examples=400, deadline=None)
@given(signatures(), st.integers(0, 6), keyword_sets)
def test_a_call_binds_in_the_model_exactly_when_python_binds_it(
    signature: Signature, positional: int, keywords: list[str]
) -> None:
    function = function_of(signature)
    assert Signature.from_inspect(inspect.signature(function)) == signature
    expected = python_binds(function, positional, keywords)
    if not _inspect_misjudges_positional_only_names(signature, keywords):
        assert inspect_binds(function, positional, keywords) == expected
    problem = signature.bind_problem(positional, keywords)
    assert (problem is None) == expected, (source_of(signature), positional, keywords, problem)
    assert problem is None or problem.strip() != ""


@settings(max_examples=200, deadline=None)
@given(signatures(), st.integers(0, 4), keyword_sets, st.booleans(), st.booleans())
def test_a_call_unpacking_arguments_is_proven_only_against_a_signature_taking_them(
    signature: Signature, positional: int, keywords: list[str], star_args: bool, star_kwargs: bool
) -> None:
    problem = signature.bind_problem(positional, keywords, star_args=star_args, star_kwargs=star_kwargs)
    if star_args and ParamKind.VAR_POSITIONAL not in {param.kind for param in signature.params}:
        assert problem is not None and "*args" in problem
    elif star_kwargs and ParamKind.VAR_KEYWORD not in {param.kind for param in signature.params}:
        assert problem is not None and "**kwargs" in problem
    elif star_args or star_kwargs:
        # Whatever is unpacked may fill what the visible arguments leave, but cannot undo what they break.
        visible = signature.bind_problem(positional, keywords)
        assert problem is None or visible is not None


def _calls(max_positional: int) -> list[tuple[int, tuple[str, ...]]]:
    """Every call shape up to ``max_positional`` positional arguments, with any keywords from the pool."""
    pool = (*NAMES, FRESH)
    keyword_sets = [combo for size in range(len(pool) + 1) for combo in itertools.combinations(pool, size)]
    return [(positional, keywords) for positional in range(max_positional + 1) for keywords in keyword_sets]


def brute_force_override_problem(
    override: Signature, base: Signature, *, required_by_name: bool
) -> tuple[int, tuple[str, ...]] | None:
    """The first call the base accepts and the override refuses (both without ``self``), by calling both.

    Unless ``required_by_name``, only calls passing the base's required positional parameters by position count.
    """
    override_function, base_function = function_of(override), function_of(base)
    by_position = sum(1 for param in base.positional if param.required)
    widest = len(override.params) + len(base.params) + 1  # past every slot: only *args takes more
    for positional, keywords in _calls(widest):
        if not required_by_name and positional < by_position:
            continue
        if python_binds(base_function, positional, keywords) and not python_binds(
            override_function, positional, keywords
        ):
            return positional, keywords
    return None


def _method(signature: Signature) -> Signature:
    return Signature((SELF, *signature.params))


@settings(max_examples=300, deadline=None)
@given(signatures(), signatures(), st.booleans())
def test_an_override_is_accepted_exactly_when_every_call_of_the_base_binds_to_it(
    override: Signature, base: Signature, required_by_name: bool
) -> None:
    problem = _method(override).override_problem(_method(base), required_by_name=required_by_name)
    witness = brute_force_override_problem(override, base, required_by_name=required_by_name)
    assert (problem is None) == (witness is None), (source_of(override), source_of(base), problem, witness)


@settings(max_examples=100, deadline=None)
@given(signatures())
def test_a_signature_overrides_itself_and_its_json_round_trips(signature: Signature) -> None:
    method = _method(signature)
    assert method.override_problem(method) is None
    assert Signature.from_json(method.to_json()) == method
    assert method.without_first() == signature


@settings(max_examples=200, deadline=None)
@given(signatures())
def test_spelled_is_how_python_writes_the_signature(signature: Signature) -> None:
    written = str(inspect.signature(function_of(signature)))
    assert signature.spelled() == written.replace("=None", "=...")


# Examples: the runner's real signatures, as the manifest holds them.

MANIFEST = load_exports()


def _runner(name: str) -> ClassApi:
    api = MANIFEST.api(f"cudagraph.runner.{name}")
    assert isinstance(api, ClassApi)
    return api


def test_the_legacy_call_of_the_decode_runner_lacks_its_config() -> None:
    constructor = _runner("DecodeCudaGraphRunner").methods["__init__"]
    assert constructor.spelled() == (
        "(self, model_runner, config, *, backend=..., show_progress=..., num_warmups=..., capture_barrier=..., "
        "metrics=..., query_len=...)"
    )
    call = constructor.without_first()
    assert call.bind_problem(1, ()) == "missing required argument 'config'"
    assert call.bind_problem(2, ()) is None
    assert call.bind_problem(1, ("config", "show_progress")) is None
    assert call.bind_problem(3, ()) == "takes at most 2 positional arguments, 3 given"
    assert call.bind_problem(2, ("bs",)) == "unexpected keyword argument 'bs'"
    assert call.bind_problem(2, ("config",)) == "argument 'config' given twice"
    assert call.bind_problem(0, (), star_args=True) == "the call passes *args, whose length cannot be checked here"
    assert call.bind_problem(0, (), star_kwargs=True) == "the call passes **kwargs, whose keys cannot be checked here"


def test_the_legacy_capture_hook_cannot_stand_in_for_the_new_one() -> None:
    hook = _runner("DecodeCudaGraphRunner").method("capture_bucket")
    assert hook is not None
    assert hook.spelled() == "(self, bucket)"
    legacy = Signature(
        (
            SELF,
            Param("bs", ParamKind.POSITIONAL_OR_KEYWORD, True),
            Param("forward", ParamKind.POSITIONAL_OR_KEYWORD, True),
            Param("stream_idx", ParamKind.POSITIONAL_OR_KEYWORD, False),
        )
    )
    assert legacy.override_problem(hook) == (
        "the override(bs, forward, stream_idx=...) requires forward, which callers of the base(bucket) need not pass"
    )
    # The base calls its hook as self.capture_bucket(bucket): renaming the parameter keeps that call working,
    # and only a caller naming it (bucket=...) would break.
    renamed = Signature((SELF, Param("bs", ParamKind.POSITIONAL_OR_KEYWORD, True)))
    assert renamed.override_problem(hook) is None
    assert renamed.override_problem(hook, required_by_name=True) == (
        "the base(bucket) may be called with bucket=...; the override(bs) has no bucket"
    )
    positional_only = Signature((SELF, Param("bucket", ParamKind.POSITIONAL_ONLY, True)))
    assert positional_only.override_problem(hook) is None
    assert positional_only.override_problem(hook, required_by_name=True) == (
        "the base(bucket) may be called with bucket=...; the override(bucket, /) has no bucket"
    )
    assert Signature((SELF, Param("shape", ParamKind.POSITIONAL_OR_KEYWORD, True))).override_problem(hook) is None
    positional_catch_all = Signature((SELF, Param("args", ParamKind.VAR_POSITIONAL, False)))
    assert positional_catch_all.override_problem(hook) is None
    assert positional_catch_all.override_problem(hook, required_by_name=True) == (
        "the base(bucket) may be called with bucket=...; the override(*args) has no bucket"
    )
    forwarding = Signature(
        (SELF, Param("args", ParamKind.VAR_POSITIONAL, False), Param("kwargs", ParamKind.VAR_KEYWORD, False))
    )
    assert forwarding.override_problem(hook) is None


@pytest.mark.parametrize(
    ("override", "problem"),
    [
        ((), "the base(a, b=...) is called with up to 2 positional arguments; the override() takes 0"),
        (
            (("a", ParamKind.POSITIONAL_OR_KEYWORD, True), ("c", ParamKind.POSITIONAL_OR_KEYWORD, False)),
            "the base(a, b=...) may be called with b=...; the override(a, c=...) has no b",
        ),
        (
            (
                ("a", ParamKind.POSITIONAL_OR_KEYWORD, True),
                ("b", ParamKind.POSITIONAL_OR_KEYWORD, False),
                ("c", ParamKind.KEYWORD_ONLY, True),
            ),
            "the override(a, b=..., *, c) requires c, which callers of the base(a, b=...) need not pass",
        ),
        (
            (("b", ParamKind.POSITIONAL_OR_KEYWORD, False), ("a", ParamKind.POSITIONAL_OR_KEYWORD, False)),
            "the base(a, b=...) may be called with 1 positional argument and b=...; "
            "the override(b=..., a=...) would get b twice",
        ),
        (
            (
                ("a", ParamKind.POSITIONAL_OR_KEYWORD, True),
                ("b", ParamKind.POSITIONAL_OR_KEYWORD, False),
                ("more", ParamKind.VAR_KEYWORD, False),
            ),
            None,
        ),
    ],
    ids=["too-few-slots", "renamed-option", "new-required-keyword", "reordered", "wider"],
)
def test_override_problems_name_the_call_that_breaks(
    override: tuple[tuple[str, ParamKind, bool], ...], problem: str | None
) -> None:
    base = Signature(
        (
            SELF,
            Param("a", ParamKind.POSITIONAL_OR_KEYWORD, True),
            Param("b", ParamKind.POSITIONAL_OR_KEYWORD, False),
        )
    )
    assert Signature((SELF, *(Param(*param) for param in override))).override_problem(base) == problem


def test_a_positional_only_name_passed_by_keyword_is_named_as_such() -> None:
    signature = Signature((Param("a", ParamKind.POSITIONAL_ONLY, True),))
    assert signature.bind_problem(0, ("a",)) == "positional-only argument 'a' passed by keyword"
    collecting = Signature((Param("a", ParamKind.POSITIONAL_ONLY, True), Param("kw", ParamKind.VAR_KEYWORD, False)))
    assert collecting.bind_problem(1, ("a",)) is None  # **kw takes the keyword; the parameter took the position
    assert collecting.bind_problem(0, ("a",)) == "missing required argument 'a'"


def test_from_inspect_reads_every_kind_and_default() -> None:
    def sample(a: int, /, b: int, c: int = 1, *rest: int, d: int, e: int = 2, **options: int) -> None:
        """A function with every kind of parameter."""

    assert Signature.from_inspect(inspect.signature(sample)) == Signature(
        (
            Param("a", ParamKind.POSITIONAL_ONLY, True),
            Param("b", ParamKind.POSITIONAL_OR_KEYWORD, True),
            Param("c", ParamKind.POSITIONAL_OR_KEYWORD, False),
            Param("rest", ParamKind.VAR_POSITIONAL, False),
            Param("d", ParamKind.KEYWORD_ONLY, True),
            Param("e", ParamKind.KEYWORD_ONLY, False),
            Param("options", ParamKind.VAR_KEYWORD, False),
        )
    )
    assert [kind.value for kind in ParamKind] == [
        "positional_only",
        "positional_or_keyword",
        "var_positional",
        "keyword_only",
        "var_keyword",
    ]
