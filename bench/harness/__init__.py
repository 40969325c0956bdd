"""The benchmark harness behind ``nox -s bench`` (``python bench/run.py``): every decode and prefill backend beside
eager, a raw ``torch.cuda.CUDAGraph``, ``torch.compile(mode="reduce-overhead")`` and the PyPI peers, in one process,
on the same model and inputs, so that ratios hold on a noisy machine.

One module per section (``decode``, ``breaks``, ``prefill``, ``speculative``, ``capture``, ``migration``), one
dataclass per row kind (``rows``), the configurations as tables (``configs``), and the outputs: the stdout table
(``report``), PNG plots (``plots``), regressions between two runs (``compare``) and the stated targets (``targets``).
The sections that need CUDA skip with a reason elsewhere; everything else runs on a CPU.
"""
