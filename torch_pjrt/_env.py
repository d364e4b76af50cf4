"""Every TORCH_PJRT_* environment variable, in one table."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class EnvVar:
    name: str
    default: str
    doc: str


VARIABLES: tuple[EnvVar, ...] = (
    EnvVar("TORCH_PJRT_PLATFORM", "", "PJRT platform to run on (cpu, cuda, rocm, tpu, neuron); "
           "empty: the platform JAX picks."),
    EnvVar("TORCH_PJRT_EAGER_MODE", "fused", "Eager execution mode: fused, strict or debug."),
    EnvVar("TORCH_PJRT_CPU_FALLBACK", "1", "1: ops without a lowering run on the CPU (counted, "
           "warned once); 0: they raise RuntimeError."),
    EnvVar("TORCH_PJRT_CACHE_DIR", "", "Directory of the persistent compile cache; empty: "
           "$XDG_CACHE_HOME/torch_pjrt (or ~/.cache/torch_pjrt). Created for the user alone "
           "(0700); refused, with a warning, where another user owns it or others can write it."),
    EnvVar("TORCH_PJRT_CACHE_SHARED", "0", "1: use a compile cache (and its entries) that "
           "other users own or can write, for a team sharing one on purpose. Its entries are "
           "unpickled and run as code: whoever can write there runs code in every process "
           "that reads it (docs/reliability.md)."),
    EnvVar("TORCH_PJRT_COMPILE_CACHE", "1", "1: keep compiled XLA programs on disk under "
           "TORCH_PJRT_CACHE_DIR/xla and reuse them across processes; 0: off."),
    EnvVar("TORCH_PJRT_CACHE_MAX_BYTES", "4e9", "Size limit of the on-disk compile cache; the "
           "least recently used programs are evicted past it."),
    EnvVar("TORCH_PJRT_MEMORY_LIMIT", "", "Bytes of device memory torch-pjrt may hold per "
           "device before raising torch.OutOfMemoryError; empty: the device's own limit "
           "(host RAM on CPU)."),
    EnvVar("TORCH_PJRT_HOST_MALLOC", "1", "On the cpu platform: 1: glibc's malloc keeps freed "
           "blocks for reuse (no mmap, no trimming, one arena), so programs do not page-fault "
           "their buffers in on every run; 0: malloc's own settings."),
    EnvVar("TORCH_PJRT_CPU_KERNELS", "1", "On the cpu platform: 1: large float32 matrix "
           "products call MKL's sgemm and layer norm ATen's kernels (libtorch's own), on "
           "XLA's thread pool; 0: XLA's own ops (docs/xla-cpu-performance.md)."),
    EnvVar("TORCH_PJRT_FUSED_MAX_OPS", "10000", "Fused eager: flush the pending graph once it "
           "holds this many ops."),
    EnvVar("TORCH_PJRT_FUSED_SPLIT_BACKWARD", "1", "Fused eager: 1: a backward pass starts by "
           "running the pending graph (the forward), so a training step is a forward and a "
           "backward program; 0: one graph across both (docs/xla-cpu-performance.md)."),
    EnvVar("TORCH_PJRT_TIERED", "1", "Fused eager: 1: a graph whose fused program is not "
           "compiled runs op by op on its ops' own programs where that is cheaper than "
           "waiting for the compile, and the fused program compiles in the background once "
           "the graph recurs; 0: every flush waits for its fused program "
           "(docs/compile-cost.md)."),
    EnvVar("TORCH_PJRT_FUSED_LOOPS", "1", "Fused eager: 1: a graph whose ops repeat over most "
           "of it (a decode or training loop with no sync inside) is cut where the step "
           "repeats, so that the step compiles once; 0: one program per graph "
           "(docs/compile-cost.md)."),
    EnvVar("TORCH_PJRT_XLA_CPU_OPT_LEVEL", "2", "On the cpu platform, the LLVM optimization "
           "level of every program XLA compiles (xla_backend_optimization_level) where no "
           "quicker one is chosen: 2 compiles in a quarter of level 3's time (XLA's default; "
           "threefry random bits, 606 ms to 142 ms) with no slower steps in the model zoo "
           "(docs/compile-cost.md); 3 restores XLA's default."),
    EnvVar("TORCH_PJRT_QUICK_OPS", "1", "Fused eager on the cpu platform: 1: ops of a graph "
           "run one by one (TORCH_PJRT_TIERED) that have no program yet get one compiled "
           "quickly (LLVM unoptimized: 40% of the compile time; its results may differ from "
           "the optimized program's by an ulp); 0: the optimized program strict mode runs."),
    EnvVar("TORCH_PJRT_COMPILE_THREADS", "", "Programs compiled at once (op programs a "
           "flush needs, side by side; fused programs in the background on one fewer); "
           "empty: one per core."),
    EnvVar("TORCH_PJRT_DEBUG_COMPARE", "0", "Debug eager: also run every op on the CPU and raise "
           "at the first op whose result differs."),
    EnvVar("TORCH_PJRT_BUCKETS", "4", "torch.compile with dynamic sizes, and fused eager's "
           "attention over a growing KV cache: pad each dynamic size to a bucket and compile "
           "once per bucket; the value is buckets per doubling of the "
           "size (1, 2, 4, 8 or 16; sizes up to 16 use powers of two); 0 or off: compile once "
           "per shape (docs/dynamic-shapes.md)."),
    EnvVar("TORCH_PJRT_HF_PADDING", "1", "1: transformers' continuous batching pads its "
           "batches to multiples of 64 query and 256 KV tokens where its cache is on pjrt "
           "(as it does for CUDA graphs), so that batches share programs; 0: a program per "
           "batch shape (docs/serving.md)."),
    EnvVar("TORCH_PJRT_COORDINATOR", "", "Multi-process jobs: host:port where rank 0 serves "
           "JAX's coordination service; empty: MASTER_ADDR and MASTER_PORT + 1 "
           "(docs/distributed.md)."),
    EnvVar("TORCH_PJRT_DIST_CHECK", "1", "1: before each collective of a pjrt process group "
           "its ranks agree through the group's store on the call (a rank missing past the "
           "group's timeout, or a different collective, shape or dtype, raises "
           "DistBackendError on every rank); 0: no check (a mismatch can hang or abort)."),
    EnvVar("TORCH_PJRT_FUZZ_EXAMPLES", "300", "tests/fuzz: how many random programs the "
           "differential fuzz test runs (a fixed seed; the compiled test runs a tenth as "
           "many); more for a long sweep (docs/reliability.md)."),
    EnvVar("TORCH_PJRT_PYTORCH_TESTS", "", "tools/pytorch_tests.py and its CI slice: "
           "PyTorch's own test/ directory of the installed torch (not in the wheel; "
           "docs/pytorch-tests.md says how to assemble it); empty: the slice is skipped."),
    EnvVar("TORCH_PJRT_CONV_PATCHES", "1", "On the cpu platform: 1: convolutions with a "
           "small output image (at most 64 positions) or few input values per patch (at "
           "most 32) run as one matrix product of their patches, where XLA:CPU's "
           "convolution is slow; 0: XLA's convolution always (lowering/families/conv.py)."),
    EnvVar("TORCH_PJRT_VERBOSE", "0", "1: print compiles, recompiles and CPU fallbacks to "
           "stderr (a shortcut: the `torch_pjrt` logger at INFO with a stderr handler; "
           "applications configure that logger as any other)."),
    EnvVar("TORCH_PJRT_METRICS", "", "1: print torch_pjrt.metrics.report() at exit and warn "
           "once per line that syncs in every training step; 0: note no lines of user code "
           "for the report (syncs, compiles, fallbacks); empty: note them, print nothing "
           "(docs/observability.md)."),
    EnvVar("TORCH_PJRT_DUMP_DIR", "", "Directory to write each compiled program to: its "
           "StableHLO, optimized HLO and a map to the ATen ops / FX nodes and source lines it "
           "holds, named as profiles name the program; empty: no dumps."),
)

_BY_NAME = {v.name: v for v in VARIABLES}


def get(name: str) -> str:
    """The value of a documented variable (its default when unset)."""
    return os.environ.get(name, _BY_NAME[name].default)


def flag(name: str) -> bool:
    return get(name).strip().lower() not in ("", "0", "false", "no", "off")


def cache_dir() -> str:
    explicit = get("TORCH_PJRT_CACHE_DIR")
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "torch_pjrt")


def markdown_table() -> str:
    rows = ["| variable | default | meaning |", "| --- | --- | --- |"]
    rows += [f"| `{v.name}` | `{v.default}` | {v.doc} |" for v in VARIABLES]
    return "\n".join(rows)
