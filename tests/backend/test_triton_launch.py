"""``cudagraph.backend_utils.triton_launch`` against fakes of Triton's compiled-kernel API: which compiled kernel a
launch uses (one per specialization), the argument layout of the C launcher, and every way back to the JIT call.
Real kernels run through it on CPU under Triton's interpreter (``test_backend_utils_readme.py``, the engine's kernel
tests) and natively on a CUDA device (``tests/gpu/engine/test_gpu_triton_launch.py``); without Triton in
``test_without_cuda.py``."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip(
    "triton", reason=("the launchers drive Triton kernels: pip install triton (CUDA builds of torch bring it)")
)

import triton

from cudagraph.backend_utils import FastLauncher, direct_launch, launch_values_and_key, triton_launch


@pytest.fixture(autouse=True)
def checked_triton(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Triton release whose launcher layout the shortcut was checked on, whatever is installed here."""
    monkeypatch.setattr(triton, "__version__", "3.6.0")


class FakeCompiled:
    """A compiled kernel's launch API as ``direct_launch`` uses it: its launcher (``run``) with the kernel handle and
    metadata, and ``[grid]``, the runner that calls Triton's launch hooks."""

    function = "cu-function"
    packed_metadata = ("packed",)

    def __init__(self) -> None:
        self.launches: list[tuple[object, ...]] = []
        self.runner_launches: list[tuple[tuple[int, ...], tuple[object, ...]]] = []

    def run(self, *launch: object) -> None:
        self.launches.append(launch)

    def __getitem__(self, grid: tuple[int, ...]):
        return lambda *args: self.runner_launches.append((grid, args))


class FakeKernel:
    """A JIT kernel as the launchers use it: its parameter names, ``warmup`` (compiles, here returns ``compiled``)
    and ``[grid]``, the JIT call."""

    arg_names = ["x_ptr", "n", "out_ptr", "scale", "BLOCK", "MODE"]

    def __init__(self, compiled: object) -> None:
        self.compiled = compiled
        self.warmups: list[tuple[tuple[object, ...], dict[str, object]]] = []
        self.jit_calls: list[tuple[tuple[int, ...], tuple[object, ...], dict[str, object]]] = []

    def __getitem__(self, grid: tuple[int, ...]):
        return lambda *args, **kwargs: self.jit_calls.append((grid, args, kwargs))

    def warmup(self, *args: object, grid: tuple[int, ...], **kwargs: object) -> object:
        self.warmups.append((args, kwargs))
        if isinstance(self.compiled, Exception):
            raise self.compiled
        return self.compiled


@pytest.fixture
def stream_handle(monkeypatch: pytest.MonkeyPatch) -> int:
    """The current stream's handle ``direct_launch`` launches on, whatever device the test runs on."""
    monkeypatch.setattr(triton_launch, "_current_raw_stream", lambda device_index: 1234)
    monkeypatch.setattr(triton_launch, "_current_device", lambda: 0)
    return 1234


def test_a_direct_launch_passes_every_argument_in_signature_order_with_tensors_as_addresses(
    stream_handle: int,
) -> None:
    x, out = torch.zeros(4), torch.zeros(4)
    compiled = FakeCompiled()
    kernel = FakeKernel(compiled)
    launch = direct_launch(kernel, (3, 2, 1), (x, 4, out, 0.5), {"MODE": "ieee", "BLOCK": 16}, num_warps=8)
    assert launch is not None
    assert kernel.warmups == [((x, 4, out, 0.5), {"MODE": "ieee", "BLOCK": 16, "num_warps": 8})]
    launch()
    launch()
    bound = (x.data_ptr(), 4, out.data_ptr(), 0.5, 16, "ieee")
    once = (3, 2, 1, stream_handle, "cu-function", ("packed",), None, None, None, *bound)
    assert compiled.launches == [once, once] and compiled.runner_launches == []


def test_with_launch_hooks_set_a_direct_launch_goes_through_the_runner_that_calls_them(
    monkeypatch: pytest.MonkeyPatch, stream_handle: int
) -> None:
    monkeypatch.setattr(triton.knobs.runtime, "launch_enter_hook", lambda metadata: None)
    x = torch.zeros(4)
    compiled = FakeCompiled()
    launch = direct_launch(FakeKernel(compiled), (2, 1, 1), (x, 4, x, 1.0), {"BLOCK": 8, "MODE": "tf32"}, 4)
    assert launch is not None
    launch()
    assert compiled.runner_launches == [((2, 1, 1), (x.data_ptr(), 4, x.data_ptr(), 1.0, 8, "tf32"))]
    assert compiled.launches == []


class FakeLauncher:
    """A compiled kernel's launcher (Triton 3.6's ``CudaLauncher``): its C entry point ``launch``, its launch flags
    and scratch sizes, and the Python ``__call__`` that allocates scratch and calls ``launch``."""

    def __init__(self, global_scratch_size: int = 0, profile_scratch_size: int = 0) -> None:
        self.global_scratch_size, self.profile_scratch_size = global_scratch_size, profile_scratch_size
        self.launch_cooperative_grid, self.launch_pdl = False, True
        self.native_launches: list[tuple[object, ...]] = []
        self.python_launches: list[tuple[object, ...]] = []

    def launch(self, *launch: object) -> None:
        self.native_launches.append(launch)

    def __call__(self, *launch: object) -> None:
        self.python_launches.append(launch)


class FakeCompiledWithLauncher(FakeCompiled):
    def __init__(self, launcher: FakeLauncher) -> None:
        super().__init__()
        self.run = launcher  # type: ignore[assignment,method-assign]


def test_a_direct_launch_calls_the_launchers_c_entry_point_with_its_flags_where_nothing_needs_scratch(
    stream_handle: int,
) -> None:
    x, out = torch.zeros(4), torch.zeros(4)
    launcher = FakeLauncher()
    launch = direct_launch(
        FakeKernel(FakeCompiledWithLauncher(launcher)), (3, 2, 1), (x, 4, out, 0.5), {"MODE": "ieee", "BLOCK": 16}, 8
    )
    assert launch is not None
    launch()
    bound = (x.data_ptr(), 4, out.data_ptr(), 0.5, 16, "ieee")
    # grid, stream, function, cooperative, pdl, global and profile scratch, packed metadata, launch metadata, hooks.
    once = (3, 2, 1, stream_handle, "cu-function", 0, 1, None, None, ("packed",), None, None, None, *bound)
    assert launcher.native_launches == [once] and launcher.python_launches == []


@pytest.mark.parametrize(
    ("launcher", "version"),
    [(FakeLauncher(global_scratch_size=64), "3.6.0"), (FakeLauncher(profile_scratch_size=8), "3.6.0"),
     (FakeLauncher(), "3.7.0")],
    ids=["global-scratch", "profile-scratch", "unverified-triton"],
)  # fmt: skip
def test_a_kernel_needing_scratch_or_another_triton_launches_through_the_launchers_python_call(
    monkeypatch: pytest.MonkeyPatch, stream_handle: int, launcher: FakeLauncher, version: str
) -> None:
    monkeypatch.setattr(triton, "__version__", version)
    x = torch.zeros(4)
    constexprs = {"BLOCK": 8, "MODE": "tf32"}
    launch = direct_launch(FakeKernel(FakeCompiledWithLauncher(launcher)), (2, 1, 1), (x, 4, x, 1.0), constexprs, 4)
    assert launch is not None
    launch()
    assert launcher.native_launches == []
    assert launcher.python_launches == [(2, 1, 1, stream_handle, "cu-function", ("packed",), None, None, None,
                                         x.data_ptr(), 4, x.data_ptr(), 1.0, 8, "tf32")]  # fmt: skip


def test_a_triton_without_the_launch_api_falls_back_to_the_jit_call() -> None:
    kernel = FakeKernel(AttributeError("'CompiledKernel' object has no attribute 'run'"))
    assert direct_launch(kernel, (1, 1, 1), (torch.zeros(1),), {}, num_warps=4) is None


def fast_kernel(launcher: FakeLauncher | None = None) -> tuple[FakeKernel, FakeLauncher]:
    launcher = launcher or FakeLauncher()
    return FakeKernel(FakeCompiledWithLauncher(launcher)), launcher


def test_a_fast_launch_compiles_once_per_specialization_and_calls_the_c_launcher(stream_handle: int) -> None:
    kernel, launcher = fast_kernel()
    fast = FastLauncher(kernel)
    assert not fast.jit_only
    x, out = torch.zeros(8), torch.zeros(8)
    for n in (4, 20):  # both i32, neither 1 nor a multiple of 16: one specialization
        fast((3,), (x, n, out, 0.5), {"MODE": "ieee", "BLOCK": 16}, num_warps=8)
    assert len(kernel.warmups) == 1 and kernel.jit_calls == []
    assert kernel.warmups[0] == ((x, 4, out, 0.5), {"MODE": "ieee", "BLOCK": 16, "num_warps": 8})
    # grid padded to 3 dimensions; constexprs follow the runtime arguments in signature order (BLOCK, then MODE).
    fixed = (3, 1, 1, stream_handle, "cu-function", 0, 1, None, None, ("packed",), None, None, None)
    assert launcher.native_launches == [(*fixed, x.data_ptr(), n, out.data_ptr(), 0.5, 16, "ieee") for n in (4, 20)]


@pytest.mark.parametrize(
    "changed",
    [
        {"n": 1}, {"n": 32}, {"n": 2**31}, {"n": 2**63}, {"x": torch.zeros(9)[1:]},
        {"x": torch.zeros(8, dtype=torch.float16)}, {"scale": 2}, {"BLOCK": 32}, {"num_warps": 4},
    ],
    ids=["int-one", "int-multiple-of-16", "int-past-i32", "int-u64", "unaligned-tensor", "dtype", "int-for-float",
         "constexpr", "warps"],
)  # fmt: skip
def test_each_thing_triton_specializes_on_compiles_its_own_kernel(stream_handle: int, changed: dict) -> None:
    kernel, _ = fast_kernel()
    fast = FastLauncher(kernel)
    call = {"x": torch.zeros(8), "n": 4, "out": torch.zeros(8), "scale": 0.5, "BLOCK": 16, "num_warps": 8}

    def launch(values: dict) -> None:
        arguments = (values["x"], values["n"], values["out"], values["scale"])
        fast((1,), arguments, {"BLOCK": values["BLOCK"], "MODE": "ieee"}, num_warps=values["num_warps"])

    launch(call)
    launch({**call, **changed})
    launch(call)
    launch({**call, **changed})
    assert len(kernel.warmups) == 2, "the changed argument compiles once, and going back reuses the first kernel"


def test_specialization_keys_follow_triton() -> None:
    aligned = torch.zeros(8)

    def key(value: object) -> tuple[object, ...]:
        return tuple(launch_values_and_key((value,))[1])

    assert key(aligned) == (torch.float32, True)
    assert key(aligned[1:]) == (torch.float32, False)
    assert key(1) == (True, False, 0)
    assert key(48) == (False, True, 0)
    assert key(-(2**31)) == (False, True, 0)
    assert key(2**31) == (False, True, 2)
    assert key(2**63 + 1) == (False, False, 1)
    assert key(True) == (bool,) and key(1.0) == (float,) and key(None) == (type(None),)
    values, flattened = launch_values_and_key((aligned, 5, 0.5))
    assert values == [aligned.data_ptr(), 5, 0.5]
    assert flattened == [torch.float32, True, False, False, 0, float]


def test_with_launch_hooks_set_a_fast_launch_goes_through_the_jit_call(
    monkeypatch: pytest.MonkeyPatch, stream_handle: int
) -> None:
    kernel, launcher = fast_kernel()
    fast = FastLauncher(kernel)
    x = torch.zeros(4)
    fast((2,), (x, 4, x, 1.0), {"BLOCK": 8, "MODE": "tf32"})
    monkeypatch.setattr(triton.knobs.runtime, "launch_enter_hook", lambda metadata: None)
    fast((2,), (x, 4, x, 1.0), {"BLOCK": 8, "MODE": "tf32"})
    assert len(launcher.native_launches) == 1
    assert kernel.jit_calls == [((2,), (x, 4, x, 1.0), {"BLOCK": 8, "MODE": "tf32", "num_warps": 4})]


class InterpretedKernel:
    """Triton's interpreter's kernel: a JIT call and no ``warmup``."""

    def __init__(self) -> None:
        self.jit_calls: list[tuple[tuple[int, ...], tuple[object, ...]]] = []

    def __getitem__(self, grid: tuple[int, ...]):
        return lambda *args, **kwargs: self.jit_calls.append((grid, args))


def test_an_interpreted_kernel_or_an_unchecked_triton_launches_through_the_jit_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    interpreted = InterpretedKernel()
    fast = FastLauncher(interpreted)
    assert fast.jit_only
    fast((1,), (1,), {})
    assert interpreted.jit_calls == [((1,), (1,))]
    monkeypatch.setattr(triton, "__version__", "3.7.0")
    assert FastLauncher(fast_kernel()[0]).jit_only


@pytest.mark.parametrize("launcher", [FakeLauncher(global_scratch_size=64), FakeLauncher(profile_scratch_size=8)])
def test_a_kernel_needing_scratch_launches_through_the_jit_call_and_is_compiled_once(
    stream_handle: int, launcher: FakeLauncher
) -> None:
    kernel, _ = fast_kernel(launcher)
    fast = FastLauncher(kernel)
    x = torch.zeros(4)
    for _ in range(2):
        fast((2,), (x, 4, x, 1.0), {"BLOCK": 8, "MODE": "tf32"})
    assert launcher.native_launches == [] and len(kernel.jit_calls) == 2 and len(kernel.warmups) == 1


def test_arguments_that_do_not_fill_the_signature_before_the_constexprs_launch_through_the_jit_call(
    stream_handle: int,
) -> None:
    kernel, launcher = fast_kernel()
    fast = FastLauncher(kernel)
    x = torch.zeros(4)
    fast((2,), (x, 4), {"BLOCK": 8, "MODE": "tf32"})  # out_ptr and scale missing: the C layout would be wrong
    assert launcher.native_launches == [] and kernel.warmups == [] and len(kernel.jit_calls) == 1


def test_bind_launches_directly_or_binds_the_jit_call(stream_handle: int) -> None:
    kernel, launcher = fast_kernel()
    x = torch.zeros(4)
    FastLauncher(kernel).bind((2, 1, 1), (x, 4, x, 1.0), {"BLOCK": 8, "MODE": "tf32"})()
    assert len(launcher.native_launches) == 1 and kernel.jit_calls == []
    interpreted = InterpretedKernel()
    FastLauncher(interpreted).bind((2,), (x, 4), {"BLOCK": 8})()
    assert interpreted.jit_calls == [((2,), (x, 4))]


@pytest.mark.parametrize("value", [0, 1, 2, 3, 16, 17, 1000, 4096, 4097])
def test_launch_size_helpers_agree_with_triton(value: int) -> None:
    assert triton_launch.next_power_of_2(value) == triton.next_power_of_2(value)
    for denominator in (1, 3, 16):
        assert triton_launch.cdiv(value, denominator) == triton.cdiv(value, denominator)


def test_through_jit_sends_every_launch_of_the_block_to_the_jit_call_and_no_more(stream_handle: int) -> None:
    kernel, launcher = fast_kernel()
    fast = FastLauncher(kernel)
    x = torch.zeros(4)
    with triton_launch.through_jit():
        fast((2,), (x, 4, x, 1.0), {"BLOCK": 8, "MODE": "tf32"})
    fast((2,), (x, 4, x, 1.0), {"BLOCK": 8, "MODE": "tf32"})
    assert len(kernel.jit_calls) == 1 and len(launcher.native_launches) == 1


def test_a_pdl_launch_compiles_with_triton_s_option_and_keeps_its_own_compiled_kernel(stream_handle: int) -> None:
    kernel, launcher = fast_kernel()
    fast = FastLauncher(kernel)
    x = torch.zeros(4)
    for launch_pdl in (True, False, True):
        fast((2,), (x, 4, x, 1.0), {"BLOCK": 8, "MODE": "tf32"}, launch_pdl=launch_pdl)
    # One compile each way; the flag reaches the compile only where asked for (an older Triton has no such option).
    assert [kwargs for _, kwargs in kernel.warmups] == [
        {"BLOCK": 8, "MODE": "tf32", "num_warps": 4, "launch_pdl": True},
        {"BLOCK": 8, "MODE": "tf32", "num_warps": 4},
    ]
    assert len(launcher.native_launches) == 3 and kernel.jit_calls == []


def test_a_pdl_launch_through_the_jit_call_or_bound_passes_the_option(stream_handle: int) -> None:
    kernel, launcher = fast_kernel()
    x = torch.zeros(4)
    with triton_launch.through_jit():
        FastLauncher(kernel)((2,), (x, 4, x, 1.0), {"BLOCK": 8, "MODE": "tf32"}, launch_pdl=True)
    assert kernel.jit_calls == [
        ((2,), (x, 4, x, 1.0), {"BLOCK": 8, "MODE": "tf32", "num_warps": 4, "launch_pdl": True})
    ]
    FastLauncher(kernel).bind((2, 1, 1), (x, 4, x, 1.0), {"BLOCK": 8, "MODE": "tf32"}, launch_pdl=True)()
    assert kernel.warmups[-1][1]["launch_pdl"] is True and len(launcher.native_launches) == 1
    recorded: list[dict[str, object]] = []

    class InterpretedWithOptions(InterpretedKernel):
        def __getitem__(self, grid: tuple[int, ...]):
            return lambda *args, **kwargs: recorded.append(kwargs)

    FastLauncher(InterpretedWithOptions()).bind((2,), (x, 4), {"BLOCK": 8}, launch_pdl=True)()
    assert recorded == [{"BLOCK": 8, "num_warps": 4, "launch_pdl": True}]
