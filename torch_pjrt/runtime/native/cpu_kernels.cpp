// torch-pjrt CPU kernels: XLA FFI handlers that run libtorch's own CPU kernels
// (MKL's sgemm, ATen's layer norm, GELU and flash attention), and a paged attention of
// our own, inside XLA:CPU programs, on XLA's intra-op thread pool.
//
// Why: XLA:CPU's dots reach about 80% of MKL's speed on a transformer's linear
// layers, its batched products half of it, and its layer norm a quarter of
// ATen's (docs/xla-cpu-performance.md). Calling those kernels with their own
// OpenMP threads from inside XLA oversubscribes the cores whenever XLA runs two
// thunks at once, so each call here cuts its work into blocks, runs every block
// single-threaded (MKL's per-thread thread count, c10::ParallelGuard for ATen),
// and hands the blocks to XLA's thread pool. The calling thread claims blocks as
// well, so a call finishes even when no pool thread is free.
//
// Every handler's first operand is a cost hint it ignores: a small reduction that
// makes XLA's cost model see work in the program (runtime/cpu_kernels.py, _hint).
//
// MKL is looked up at run time (dlsym in libtorch_cpu): a torch build without it
// reports the kernels unavailable, and programs keep XLA's own ops.

#include <ATen/ATen.h>
#include <ATen/native/layer_norm.h>
#include <c10/core/InferenceMode.h>
#include <c10/util/ParallelGuard.h>
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <memory>
#include <utility>
#include <mutex>
#include <string>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace torch_pjrt_cpu {

using SgemmFn = void (*)(const char*, const char*, const int*, const int*, const int*,
                         const float*, const float*, const int*, const float*, const int*,
                         const float*, float*, const int*);
using SetThreadsFn = int (*)(int);

SgemmFn sgemm = nullptr;
SetThreadsFn set_local_threads = nullptr;

// True when libtorch carries MKL's sgemm and its per-thread thread count.
bool resolve() {
  if (sgemm != nullptr) return true;
  void* lib = dlopen("libtorch_cpu.so", RTLD_LAZY | RTLD_NOLOAD);
  if (lib == nullptr) return false;
  auto g = reinterpret_cast<SgemmFn>(dlsym(lib, "sgemm_"));
  auto t = reinterpret_cast<SetThreadsFn>(dlsym(lib, "MKL_Set_Num_Threads_Local"));
  if (g == nullptr || t == nullptr) return false;
  set_local_threads = t;
  sgemm = g;
  return true;
}

// The kernels' blocks, one queue for the process, oldest call first.
//
// XLA runs independent thunks at once: the input and weight gradients of a linear
// layer are two GEMMs with no order between them. On the 2-core Xeon VM, whose two
// cores slow each other down when both run AVX-512 FMAs (a GEMM on one took 1.3x as
// long while the other ran FMAs, and no longer while it spun or copied memory), two
// 1024x256x1024 GEMMs side by side, one core each, took 1.30x the time of the same
// two one after the other with both cores on each; perf counted 1.32x the CPU time
// in MKL's kernels per GPT step that native eager spends, which never overlaps two.
// So a call's blocks join one queue, and a thread with blocks to run takes the
// oldest unclaimed block first, whichever call it belongs to: both cores finish one
// kernel, then start the next (GPT step, same process, interleaved: 0.957x -> 0.929x
// and 0.976x -> 0.941x of native eager).
struct Job {
  std::function<void(int)> block;
  int blocks = 0;
  int next = 0;  // the first unclaimed block (guarded by queue_mu)
  std::atomic<int> done{0};
  std::mutex mu;
  std::condition_variable cv;
};

std::mutex queue_mu;
std::deque<std::shared_ptr<Job>> queue;  // jobs with unclaimed blocks, oldest first

// Claims the oldest unclaimed block of any job; false when there is none, or once
// every block of `until` (when given) is claimed.
bool claim(std::shared_ptr<Job>& job, int& i, const Job* until = nullptr) {
  std::lock_guard<std::mutex> lock(queue_mu);
  if (queue.empty() || (until != nullptr && until->next == until->blocks)) return false;
  job = queue.front();
  i = job->next++;
  if (job->next == job->blocks) queue.pop_front();
  return true;
}

void run_claimed(const std::shared_ptr<Job>& job, int i) {
  job->block(i);
  if (job->done.fetch_add(1) + 1 == job->blocks) {
    std::lock_guard<std::mutex> lock(job->mu);
    job->cv.notify_all();
  }
}

// Runs queued blocks, oldest first, until none is left (or every block of `until` is
// claimed): what a pool task and a kernel's calling thread both do.
void run_queued(const Job* until = nullptr) {
  std::shared_ptr<Job> job;
  int i;
  while (claim(job, i, until)) run_claimed(job, i);
}

// Runs block(i) for every i in [0, blocks): the blocks are queued behind those of
// earlier calls, blocks - 1 pool tasks are scheduled to help, and the calling thread
// runs queued blocks (older calls' first) until its own are all claimed, so a call
// finishes even when no pool thread is free. Returns when all its blocks have run.
void run_blocks(ffi::ThreadPool& pool, int blocks, std::function<void(int)> block) {
  if (blocks <= 1) {
    block(0);
    return;
  }
  auto job = std::make_shared<Job>();
  job->block = std::move(block);
  job->blocks = blocks;
  {
    std::lock_guard<std::mutex> lock(queue_mu);
    queue.push_back(job);
  }
  for (int i = 1; i < blocks; ++i) pool.Schedule([] { run_queued(); });
  run_queued(job.get());
  std::unique_lock<std::mutex> lock(job->mu);
  job->cv.wait(lock, [&] { return job->done.load() == job->blocks; });
}

// run_blocks, with an exception from any block (ATen's checks throw c10::Error)
// returned as the call's error instead of terminating the process; the first one wins.
ffi::Error run_aten_blocks(ffi::ThreadPool& pool, int blocks, const char* what,
                           std::function<void(int)> block) {
  std::mutex mu;
  std::string error;
  run_blocks(pool, blocks, [&](int i) {
    try {
      block(i);
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(mu);
      if (error.empty()) error = std::string(what) + ": " + e.what();
    }
  });
  return error.empty() ? ffi::Error::Success() : ffi::Error::Internal(error);
}

// [lo, hi) of block i when `extent` units are cut into `blocks` nearly equal blocks.
std::pair<int64_t, int64_t> block_range(int64_t extent, int i, int blocks) {
  return {extent * i / blocks, extent * (i + 1) / blocks};
}

// A float32 tensor over memory XLA owns (no copy, no ownership).
at::Tensor view(const float* data, at::IntArrayRef shape) {
  return at::from_blob(const_cast<float*>(data), shape, at::TensorOptions().dtype(at::kFloat));
}

// Blocks for `extent` units of work, at least `min_units` each, one per thread at most.
int block_count(ffi::ThreadPool& pool, int64_t extent, int64_t min_units) {
  int64_t threads = std::max<int64_t>(1, pool.num_threads());
  return int(std::max<int64_t>(1, std::min(threads, extent / min_units)));
}

// A block's least work, in flops: about 0.1 ms of one core. A smaller call runs on
// its calling thread alone: waking a pool thread and waiting for it costs more than it
// saves, and takes a core from the host thread that prepares the next program. vLLM
// serving a tiny Llama, 16 requests (bench/serving_steps.py --no-phases, alternating
// runs): 6,182-6,409 tok/s and 238-245 us of CPU a token with its 0.5-8 MFLOP products
// and attention cut in two, 6,528-6,829 and 217-225 us with each on one thread.
constexpr double kMinBlockFlops = 4e6;

// block_count, with at most one block per kMinBlockFlops of the call's `flops`.
int block_count(ffi::ThreadPool& pool, int64_t extent, int64_t min_units, double flops) {
  int64_t by_work = std::max<int64_t>(1, int64_t(flops / kMinBlockFlops));
  return int(std::min<int64_t>(by_work, block_count(pool, extent, min_units)));
}

// ------------------------------------------------------------------ GEMM
// C[p] = op(A[p]) @ op(B[p]) for row-major [..., M, K] @ [..., K, N] (op: the
// transpose when ta / tb), batch dimensions leading and equal.

// C[lo:hi, :] (rows_cut) or C[:, lo:hi] of one product, by column-major BLAS, which
// sees the row-major C as C^T = op(B)^T op(A)^T.
void product(const float* a, const float* b, float* c, int64_t m, int64_t n, int64_t k,
             bool ta, bool tb, int64_t lo, int64_t hi, bool rows_cut) {
  int rows = int(n), cols = int(m);  // of C^T
  if (rows_cut) {
    a += ta ? lo : lo * k;
    c += lo * n;
    cols = int(hi - lo);
  } else {
    b += tb ? lo * k : lo;
    c += lo;
    rows = int(hi - lo);
  }
  const char opb = tb ? 'T' : 'N', opa = ta ? 'T' : 'N';
  const int kk = int(k), ldb = int(tb ? k : n), lda = int(ta ? m : k), ldc = int(n);
  const float one = 1.0f, zero = 0.0f;
  sgemm(&opb, &opa, &rows, &cols, &kk, &one, b, &ldb, a, &lda, &zero, c, &ldc);
}

ffi::Error Gemm(ffi::ThreadPool pool, ffi::AnyBuffer /*cost_hint*/,
                ffi::Buffer<ffi::F32> a, ffi::Buffer<ffi::F32> b,
                ffi::ResultBuffer<ffi::F32> out, bool ta, bool tb) {
  auto ad = a.dimensions(), bd = b.dimensions(), od = out->dimensions();
  size_t rank = od.size();
  if (rank < 2 || ad.size() != rank || bd.size() != rank)
    return ffi::Error::InvalidArgument("torch_pjrt gemm: operands of different ranks");
  int64_t batch = 1;
  for (size_t d = 0; d + 2 < rank; ++d) {
    if (ad[d] != od[d] || bd[d] != od[d])
      return ffi::Error::InvalidArgument("torch_pjrt gemm: batch dimensions differ");
    batch *= od[d];
  }
  int64_t m = od[rank - 2], n = od[rank - 1];
  int64_t k = ta ? ad[rank - 2] : ad[rank - 1];
  if ((ta ? ad[rank - 1] : ad[rank - 2]) != m || (tb ? bd[rank - 1] : bd[rank - 2]) != k ||
      (tb ? bd[rank - 2] : bd[rank - 1]) != n)
    return ffi::Error::InvalidArgument("torch_pjrt gemm: shapes do not match");
  float* c = out->typed_data();
  if (batch == 0 || m == 0 || n == 0) return ffi::Error::Success();
  if (k == 0) {
    std::fill_n(c, batch * m * n, 0.0f);
    return ffi::Error::Success();
  }
  const float* pa = a.typed_data();
  const float* pb = b.typed_data();
  bool rows_cut = m >= n;
  // several matrices: whole ones per block; one: rows or columns, 64 at least
  double flops = 2.0 * double(batch) * double(m) * double(n) * double(k);
  int blocks = batch > 1 ? block_count(pool, batch, 1, flops)
                         : block_count(pool, rows_cut ? m : n, 64, flops);
  run_blocks(pool, blocks, [&](int i) {
    int previous = set_local_threads(1);  // the blocks are the parallelism
    if (batch > 1) {
      auto [first, end] = block_range(batch, i, blocks);
      for (int64_t p = first; p < end; ++p)
        product(pa + p * m * k, pb + p * k * n, c + p * m * n, m, n, k, ta, tb, 0, m, true);
    } else {
      auto [lo, hi] = block_range(rows_cut ? m : n, i, blocks);
      if (hi > lo) product(pa, pb, c, m, n, k, ta, tb, lo, hi, rows_cut);
    }
    set_local_threads(previous);
  });
  return ffi::Error::Success();
}

// ------------------------------------------------------------------ layer norm
#ifdef TORCH_PJRT_ATEN_STUBS
// Over the last dimension of x viewed as [M, N], with weight and bias [N]: ATen's
// CPU kernels on blocks of rows.

// [M, N] of a buffer holding M * N elements whatever its rank; N is the last dimension.
template <typename Dims>
bool rows_of(Dims dims, int64_t& m, int64_t& n) {
  if (dims.size() == 0) return false;
  n = dims[dims.size() - 1];
  m = 1;
  for (size_t d = 0; d + 1 < dims.size(); ++d) m *= dims[d];
  return true;
}

ffi::Error LayerNorm(ffi::ThreadPool pool, ffi::AnyBuffer /*cost_hint*/,
                     ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w,
                     ffi::Buffer<ffi::F32> b, ffi::ResultBuffer<ffi::F32> y,
                     ffi::ResultBuffer<ffi::F32> mean, ffi::ResultBuffer<ffi::F32> rstd,
                     float eps) {
  int64_t m, n;
  if (!rows_of(x.dimensions(), m, n) || w.element_count() != size_t(n) ||
      b.element_count() != size_t(n) || mean->element_count() != size_t(m))
    return ffi::Error::InvalidArgument("torch_pjrt layer_norm: shapes do not match");
  if (m == 0 || n == 0) return ffi::Error::Success();  // (the lowering keeps N > 0)
  const float* px = x.typed_data();
  at::Tensor W = view(w.typed_data(), {n}), B = view(b.typed_data(), {n});
  float *py = y->typed_data(), *pm = mean->typed_data(), *pr = rstd->typed_data();
  int blocks = block_count(pool, m, 16);
  return run_aten_blocks(pool, blocks, "torch_pjrt layer_norm", [&](int i) {
    auto [lo, hi] = block_range(m, i, blocks);
    int64_t rows = hi - lo;
    if (rows == 0) return;
    c10::ParallelGuard serial(true);  // ATen's parallel_for runs inline
    at::Tensor X = view(px + lo * n, {rows, n}), Y = view(py + lo * n, {rows, n});
    at::Tensor Mean = view(pm + lo, {rows}), Rstd = view(pr + lo, {rows});
    at::native::LayerNormKernel(at::kCPU, X, W, B, rows, n, eps, &Y, &Mean, &Rstd);
  });
}

ffi::Error LayerNormBackward(ffi::ThreadPool pool, ffi::AnyBuffer /*cost_hint*/,
                             ffi::Buffer<ffi::F32> dy, ffi::Buffer<ffi::F32> x,
                             ffi::Buffer<ffi::F32> mean, ffi::Buffer<ffi::F32> rstd,
                             ffi::Buffer<ffi::F32> w, ffi::ResultBuffer<ffi::F32> dx,
                             ffi::ResultBuffer<ffi::F32> dw,
                             ffi::ResultBuffer<ffi::F32> db) {
  int64_t m, n;
  if (!rows_of(x.dimensions(), m, n) || dy.element_count() != x.element_count() ||
      w.element_count() != size_t(n) || mean.element_count() != size_t(m) ||
      rstd.element_count() != size_t(m))
    return ffi::Error::InvalidArgument("torch_pjrt layer_norm_backward: shapes do not match");
  float *pdx = dx->typed_data(), *pdw = dw->typed_data(), *pdb = db->typed_data();
  if (n == 0) return ffi::Error::Success();
  if (m == 0) {
    std::fill_n(pdw, n, 0.0f);
    std::fill_n(pdb, n, 0.0f);
    return ffi::Error::Success();
  }
  const float *pdy = dy.typed_data(), *px = x.typed_data();
  const float *pm = mean.typed_data(), *pr = rstd.typed_data();
  at::Tensor W = view(w.typed_data(), {n});
  int blocks = block_count(pool, m, 16);
  // each block's weight and bias gradients, summed over the blocks at the end
  std::vector<float> partial(size_t(blocks) * 2 * n, 0.0f);
  ffi::Error error = run_aten_blocks(pool, blocks, "torch_pjrt layer_norm_backward", [&](int i) {
    auto [lo, hi] = block_range(m, i, blocks);
    int64_t rows = hi - lo;
    if (rows == 0) return;
    c10::ParallelGuard serial(true);
    at::Tensor dY = view(pdy + lo * n, {rows, n}), X = view(px + lo * n, {rows, n});
    at::Tensor Mean = view(pm + lo, {rows}), Rstd = view(pr + lo, {rows});
    at::Tensor dX = view(pdx + lo * n, {rows, n});
    at::Tensor dW = view(partial.data() + 2 * i * n, {n});
    at::Tensor dB = view(partial.data() + (2 * i + 1) * n, {n});
    at::native::LayerNormBackwardKernel(at::kCPU, dY, X, Mean, Rstd, W, rows, n, &dX, &dW, &dB);
  });
  if (!error.success()) return error;
  for (int64_t j = 0; j < n; ++j) {
    float sw = 0.0f, sb = 0.0f;
    for (int i = 0; i < blocks; ++i) {
      sw += partial[2 * i * n + j];
      sb += partial[(2 * i + 1) * n + j];
    }
    pdw[j] = sw;
    pdb[j] = sb;
  }
  return ffi::Error::Success();
}
#endif  // TORCH_PJRT_ATEN_STUBS

// ------------------------------------------------------------------ GELU
// ATen's vectorized GELU and its gradient (public ops, out= forms) on flat blocks.

constexpr int64_t kMinElements = 1 << 14;

ffi::Error Gelu(ffi::ThreadPool pool, ffi::AnyBuffer /*cost_hint*/,
                ffi::Buffer<ffi::F32> x, ffi::ResultBuffer<ffi::F32> y, bool tanh) {
  int64_t total = int64_t(x.element_count());
  if (y->element_count() != size_t(total))
    return ffi::Error::InvalidArgument("torch_pjrt gelu: shapes do not match");
  const float* px = x.typed_data();
  float* py = y->typed_data();
  int blocks = block_count(pool, total, kMinElements);
  return run_aten_blocks(pool, blocks, "torch_pjrt gelu", [&](int i) {
    auto [lo, hi] = block_range(total, i, blocks);
    int64_t len = hi - lo;
    if (len == 0) return;
    c10::InferenceMode no_autograd;
    c10::ParallelGuard serial(true);
    at::Tensor Y = view(py + lo, {len});
    at::gelu_out(Y, view(px + lo, {len}), tanh ? "tanh" : "none");
  });
}

ffi::Error GeluBackward(ffi::ThreadPool pool, ffi::AnyBuffer /*cost_hint*/,
                        ffi::Buffer<ffi::F32> g, ffi::Buffer<ffi::F32> x,
                        ffi::ResultBuffer<ffi::F32> dx, bool tanh) {
  int64_t total = int64_t(x.element_count());
  if (g.element_count() != size_t(total) || dx->element_count() != size_t(total))
    return ffi::Error::InvalidArgument("torch_pjrt gelu_backward: shapes do not match");
  const float *pg = g.typed_data(), *px = x.typed_data();
  float* pdx = dx->typed_data();
  int blocks = block_count(pool, total, kMinElements);
  return run_aten_blocks(pool, blocks, "torch_pjrt gelu_backward", [&](int i) {
    auto [lo, hi] = block_range(total, i, blocks);
    int64_t len = hi - lo;
    if (len == 0) return;
    c10::InferenceMode no_autograd;
    c10::ParallelGuard serial(true);
    at::Tensor dX = view(pdx + lo, {len});
    at::gelu_backward_out(dX, view(pg + lo, {len}), view(px + lo, {len}),
                          tanh ? "tanh" : "none");
  });
}


// ------------------------------------------------------------------ attention
// ATen's CPU flash attention (the kernels native CPU eager runs for SDPA) on blocks of
// the batch, or of the heads when the batch is one. Queries, keys, values, outputs and
// their gradients are [B, L, H, E] in memory: the layout a transformer's projections
// produce, so the head transposes around the call cancel in XLA. logsumexp is [B, H, L].

// The sizes of one attention call: q [B, L, Hq, E], k [B, S, Hk, E], v [B, S, Hk, Ev]
// in memory, Hk dividing Hq; and how its work is cut into blocks: of batch entries, or
// of heads for a batch of one (not with grouped heads).
struct AttentionShape {
  int64_t b = 0, l = 0, hq = 0, e = 0, s = 0, hk = 0, ev = 0;
  int64_t extent = 0;  // units the blocks cut
  int dim = 0;         // of the logical [B, H, L, E] tensors that the blocks cut

  // Parses q, k, v; false when they do not fit together.
  template <typename Dims>
  bool parse(Dims q, Dims k, Dims v) {
    if (q.size() != 4 || k.size() != 4 || v.size() != 4) return false;
    b = q[0], l = q[1], hq = q[2], e = q[3];
    s = k[1], hk = k[2], ev = v[3];
    if (k[0] != b || v[0] != b || v[1] != s || v[2] != hk || k[3] != e || hk == 0 ||
        hq % hk != 0)
      return false;
    bool heads = b == 1 && hq == hk;
    extent = heads ? hq : b;
    dim = heads ? 1 : 0;
    return true;
  }
  size_t out_elements() const { return size_t(b * l * hq * ev); }
  size_t lse_elements() const { return size_t(b * hq * l); }
  bool empty() const { return b * hq * l * s * e == 0; }

  // The [B, H, rows, width] logical view of a [B, rows, H, width] buffer, block [lo, hi).
  at::Tensor heads(const float* data, int64_t rows, int64_t h, int64_t width, int64_t lo,
                   int64_t hi) const {
    return view(data, {b, rows, h, width}).transpose(1, 2).slice(dim, lo, hi);
  }
  at::Tensor lse(const float* data, int64_t lo, int64_t hi) const {
    return view(data, {b, hq, l}).slice(dim, lo, hi);
  }
};

// `keys`: how many of k's and v's rows (the first ones) the queries attend to, a run-time
// number: a key/value cache padded to a bucket of lengths is one program for all of them
// (pjrt::attention_prefix), each call computing exactly what ATen's kernel computes on the
// unpadded rows (its blocks follow the logical sizes; the rows past `keys` are not read).
ffi::Error Attention(ffi::ThreadPool pool, ffi::AnyBuffer /*cost_hint*/,
                     ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k,
                     ffi::Buffer<ffi::F32> v, ffi::Buffer<ffi::S64> keys,
                     ffi::ResultBuffer<ffi::F32> out, ffi::ResultBuffer<ffi::F32> lse,
                     bool causal, double scale) {
  AttentionShape a;
  if (!a.parse(q.dimensions(), k.dimensions(), v.dimensions()) ||
      out->element_count() != a.out_elements() || lse->element_count() != a.lse_elements() ||
      keys.element_count() != 1)
    return ffi::Error::InvalidArgument("torch_pjrt attention: shapes do not match");
  if (a.empty()) return ffi::Error::InvalidArgument("torch_pjrt attention: empty operands");
  const int64_t n = *keys.typed_data();
  if (n < 1 || n > a.s)
    return ffi::Error::InvalidArgument("torch_pjrt attention: keys out of range");
  const float *pq = q.typed_data(), *pk = k.typed_data(), *pv = v.typed_data();
  float *po = out->typed_data(), *pl = lse->typed_data();
  int blocks = block_count(pool, a.extent, 1);
  return run_aten_blocks(pool, blocks, "torch_pjrt attention", [&](int i) {
    auto [lo, hi] = block_range(a.extent, i, blocks);
    if (hi == lo) return;
    c10::InferenceMode no_autograd;
    c10::ParallelGuard serial(true);
    auto [o, m] = at::_scaled_dot_product_flash_attention_for_cpu(
        a.heads(pq, a.l, a.hq, a.e, lo, hi), a.heads(pk, a.s, a.hk, a.e, lo, hi).narrow(2, 0, n),
        a.heads(pv, a.s, a.hk, a.ev, lo, hi).narrow(2, 0, n), 0.0, causal, std::nullopt, scale);
    a.heads(po, a.l, a.hq, a.ev, lo, hi).copy_(o);
    a.lse(pl, lo, hi).copy_(m);
  });
}

ffi::Error AttentionBackward(ffi::ThreadPool pool, ffi::AnyBuffer /*cost_hint*/,
                             ffi::Buffer<ffi::F32> grad, ffi::Buffer<ffi::F32> q,
                             ffi::Buffer<ffi::F32> k, ffi::Buffer<ffi::F32> v,
                             ffi::Buffer<ffi::F32> out, ffi::Buffer<ffi::F32> lse,
                             ffi::ResultBuffer<ffi::F32> dq, ffi::ResultBuffer<ffi::F32> dk,
                             ffi::ResultBuffer<ffi::F32> dv, bool causal, double scale) {
  AttentionShape a;
  if (!a.parse(q.dimensions(), k.dimensions(), v.dimensions()) ||
      out.element_count() != a.out_elements() || grad.element_count() != a.out_elements() ||
      lse.element_count() != a.lse_elements() || dq->element_count() != q.element_count() ||
      dk->element_count() != k.element_count() || dv->element_count() != v.element_count())
    return ffi::Error::InvalidArgument("torch_pjrt attention_backward: shapes do not match");
  if (a.empty())
    return ffi::Error::InvalidArgument("torch_pjrt attention_backward: empty operands");
  const float *pg = grad.typed_data(), *pq = q.typed_data(), *pk = k.typed_data();
  const float *pv = v.typed_data(), *po = out.typed_data(), *pl = lse.typed_data();
  float *pdq = dq->typed_data(), *pdk = dk->typed_data(), *pdv = dv->typed_data();
  int blocks = block_count(pool, a.extent, 1);
  return run_aten_blocks(pool, blocks, "torch_pjrt attention_backward", [&](int i) {
    auto [lo, hi] = block_range(a.extent, i, blocks);
    if (hi == lo) return;
    c10::InferenceMode no_autograd;
    c10::ParallelGuard serial(true);
    auto [gq, gk, gv] = at::_scaled_dot_product_flash_attention_for_cpu_backward(
        a.heads(pg, a.l, a.hq, a.ev, lo, hi), a.heads(pq, a.l, a.hq, a.e, lo, hi),
        a.heads(pk, a.s, a.hk, a.e, lo, hi), a.heads(pv, a.s, a.hk, a.ev, lo, hi),
        a.heads(po, a.l, a.hq, a.ev, lo, hi), a.lse(pl, lo, hi), 0.0, causal, std::nullopt,
        scale);
    a.heads(pdq, a.l, a.hq, a.e, lo, hi).copy_(gq);
    a.heads(pdk, a.s, a.hk, a.e, lo, hi).copy_(gk);
    a.heads(pdv, a.s, a.hk, a.ev, lo, hi).copy_(gv);
  });
}

// ------------------------------------------------------------------ paged attention
// Causal attention of ragged requests over a paged KV cache, reading each key and value
// row where the cache holds it. XLA:CPU can only gather a request's pages into a padded
// copy first (a loop per element at memory speed: two thirds of a decode step's attention
// for a tiny Llama), then attend over the padding as well.
//
// cache [blocks, block_size, 2, kv_heads, d] (key then value); request r owns the query
// rows qsl[r]..qsl[r + 1] (at most max_query_len of them), the last ones of its seq_lens[r]
// positions, and attends causally to the keys its table's pages hold. Rows no request owns
// are zeros; a page outside the cache reads as NaN (as the pure-XLA kernel's fill does).
// Work units: up to kRowTile rows of one request and one key head, claimed in turn by
// the pool's threads (their costs differ with the requests' lengths).

constexpr int64_t kRowTile = 16;

struct PagedUnit {
  int64_t request, row0, rows, head;
  int64_t pos0;  // position of the tile's first row
  int64_t keys;  // keys the tile reads: 0..(its last row's position), within the table
};

__attribute__((target_clones("arch=haswell", "default")))
float dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

__attribute__((target_clones("arch=haswell", "default")))
void axpy(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

ffi::Error PagedAttention(ffi::ThreadPool pool, ffi::AnyBuffer /*cost_hint*/,
                          ffi::Buffer<ffi::F32> query, ffi::Buffer<ffi::F32> cache,
                          ffi::Buffer<ffi::S32> table, ffi::Buffer<ffi::S32> qsl,
                          ffi::Buffer<ffi::S32> seq_lens, ffi::ResultBuffer<ffi::F32> out,
                          double scale, int64_t max_query_len) {
  auto qd = query.dimensions(), cd = cache.dimensions(), td = table.dimensions();
  if (qd.size() != 3 || cd.size() != 5 || td.size() != 2 || cd[2] != 2 || cd[4] != qd[2] ||
      cd[3] == 0 || qd[1] % cd[3] != 0 || qsl.element_count() != size_t(td[0] + 1) ||
      seq_lens.element_count() != size_t(td[0]) || out->element_count() != query.element_count())
    return ffi::Error::InvalidArgument("torch_pjrt paged_attention: shapes do not match");
  const int64_t tokens = qd[0], heads = qd[1], d = qd[2];
  const int64_t num_blocks = cd[0], block_size = cd[1], kv_heads = cd[3];
  const int64_t group = heads / kv_heads, requests = td[0], pages = td[1];
  const float* q = query.typed_data();
  const float* kv = cache.typed_data();
  const int32_t* bt = table.typed_data();
  const int32_t* starts = qsl.typed_data();
  const int32_t* lens = seq_lens.typed_data();
  float* o = out->typed_data();
  std::fill(o, o + out->element_count(), 0.0f);

  std::vector<PagedUnit> units;
  double flops = 0;  // a query row and a key: two products of d
  for (int64_t r = 0; r < requests; ++r) {
    int64_t lo = std::clamp<int64_t>(starts[r], 0, tokens);
    int64_t hi = std::clamp<int64_t>(starts[r + 1], lo, tokens);
    int64_t rows = std::min(hi - lo, max_query_len);
    for (int64_t row0 = 0; row0 < rows; row0 += kRowTile) {
      int64_t tile = std::min(kRowTile, rows - row0);
      int64_t pos0 = lens[r] - (starts[r + 1] - starts[r]) + row0;
      int64_t keys = std::clamp<int64_t>(pos0 + tile, 0, pages * block_size);
      for (int64_t h = 0; h < kv_heads; ++h) units.push_back({r, row0, tile, h, pos0, keys});
      flops += 4.0 * double(kv_heads * tile * group * d) * double(keys);
    }
  }
  const int64_t row_stride = 2 * kv_heads * d;  // floats from one cache row to the next
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> nan_row(static_cast<size_t>(d), nan);
  auto key_row = [&](int64_t r, int64_t pos, int64_t h, int64_t which) -> const float* {
    int64_t block = bt[r * pages + pos / block_size];
    if (block < 0 || block >= num_blocks) return nan_row.data();
    return kv + (block * block_size + pos % block_size) * row_stride + (which * kv_heads + h) * d;
  };

  std::atomic<size_t> next{0};
  auto work = [&](int) {
    std::vector<float> scores, acc, weight;
    std::vector<int64_t> count;
    for (size_t u; (u = next.fetch_add(1)) < units.size();) {
      const PagedUnit& w = units[u];
      const int64_t r = w.request, first = starts[r] + w.row0;  // flat row of the tile's first
      const int64_t pos0 = w.pos0, keys = w.keys;
      const int64_t n_q = w.rows * group;
      scores.assign(size_t(n_q * std::max<int64_t>(keys, 1)), 0.0f);
      for (int64_t j = 0; j < keys; ++j) {
        const float* k = key_row(r, j, w.head, 0);
        for (int64_t i = 0; i < w.rows; ++i)
          for (int64_t g = 0; g < group; ++g)
            scores[(i * group + g) * keys + j] =
                dot(q + ((first + i) * heads + w.head * group + g) * d, k, d) * float(scale);
      }
      acc.assign(size_t(n_q * d), 0.0f);
      weight.assign(size_t(n_q), 0.0f);
      count.assign(size_t(n_q), 0);
      for (int64_t i = 0; i < w.rows; ++i) {
        const int64_t n = std::clamp<int64_t>(pos0 + i + 1, 0, keys);  // causal: 0..position
        for (int64_t g = 0; g < group; ++g) {
          const int64_t x = i * group + g;
          float* s = scores.data() + x * keys;
          float m = -std::numeric_limits<float>::infinity();
          for (int64_t j = 0; j < n; ++j) m = std::max(m, s[j]);
          float sum = 0.0f;
          for (int64_t j = 0; j < n; ++j) sum += (s[j] = std::exp(s[j] - m));
          weight[size_t(x)] = n > 0 ? 1.0f / sum : 0.0f;
          count[size_t(x)] = n;
        }
      }
      for (int64_t j = 0; j < keys; ++j) {
        const float* v = key_row(r, j, w.head, 1);
        for (int64_t x = 0; x < n_q; ++x)
          if (j < count[size_t(x)]) axpy(scores[x * keys + j], v, acc.data() + x * d, d);
      }
      for (int64_t i = 0; i < w.rows; ++i)
        for (int64_t g = 0; g < group; ++g) {
          const int64_t x = i * group + g;
          float* dst = o + ((first + i) * heads + w.head * group + g) * d;
          for (int64_t e = 0; e < d; ++e) dst[e] = acc[x * d + e] * weight[size_t(x)];
        }
    }
  };
  int blocks = block_count(pool, int64_t(units.size()), 1, flops);
  run_blocks(pool, blocks, work);
  return ffi::Error::Success();
}

}  // namespace torch_pjrt_cpu

XLA_FFI_DEFINE_HANDLER_SYMBOL(torch_pjrt_cpu_gemm, torch_pjrt_cpu::Gemm,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()  // cost_hint
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<bool>("ta")
                                  .Attr<bool>("tb"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(torch_pjrt_cpu_gelu, torch_pjrt_cpu::Gelu,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()  // cost_hint
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<bool>("tanh"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(torch_pjrt_cpu_gelu_backward, torch_pjrt_cpu::GeluBackward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()  // cost_hint
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<bool>("tanh"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(torch_pjrt_cpu_attention, torch_pjrt_cpu::Attention,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()  // cost_hint
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S64>>()  // keys
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<bool>("causal")
                                  .Attr<double>("scale"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(torch_pjrt_cpu_attention_backward,
                              torch_pjrt_cpu::AttentionBackward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()  // cost_hint
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<bool>("causal")
                                  .Attr<double>("scale"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(torch_pjrt_cpu_paged_attention, torch_pjrt_cpu::PagedAttention,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()  // cost_hint
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<double>("scale")
                                  .Attr<int64_t>("max_query_len"));

#ifdef TORCH_PJRT_ATEN_STUBS
XLA_FFI_DEFINE_HANDLER_SYMBOL(torch_pjrt_cpu_layer_norm, torch_pjrt_cpu::LayerNorm,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()  // cost_hint
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("eps"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(torch_pjrt_cpu_layer_norm_backward,
                              torch_pjrt_cpu::LayerNormBackward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()  // cost_hint
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
#endif

// {target name: handler} for jax.ffi.register_ffi_target; empty without MKL.
std::vector<std::pair<const char*, void*>> torch_pjrt_cpu_kernels() {
  if (!torch_pjrt_cpu::resolve()) return {};
  std::vector<std::pair<const char*, void*>> out = {
      {"torch_pjrt_cpu_gemm", reinterpret_cast<void*>(torch_pjrt_cpu_gemm)},
      {"torch_pjrt_cpu_gelu", reinterpret_cast<void*>(torch_pjrt_cpu_gelu)},
      {"torch_pjrt_cpu_gelu_backward", reinterpret_cast<void*>(torch_pjrt_cpu_gelu_backward)},
      {"torch_pjrt_cpu_attention", reinterpret_cast<void*>(torch_pjrt_cpu_attention)},
      {"torch_pjrt_cpu_attention_backward",
       reinterpret_cast<void*>(torch_pjrt_cpu_attention_backward)},
      {"torch_pjrt_cpu_paged_attention", reinterpret_cast<void*>(torch_pjrt_cpu_paged_attention)}};
#ifdef TORCH_PJRT_ATEN_STUBS
  out.push_back({"torch_pjrt_cpu_layer_norm", reinterpret_cast<void*>(torch_pjrt_cpu_layer_norm)});
  out.push_back({"torch_pjrt_cpu_layer_norm_backward",
                 reinterpret_cast<void*>(torch_pjrt_cpu_layer_norm_backward)});
#endif
  return out;
}
