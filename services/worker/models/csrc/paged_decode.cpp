// Single-query paged attention on CPU, read straight from the block-addressed KV cache.
//
// The PyTorch path (paged_attention.py) gathers each decode's whole context into a fresh tensor with
// index_select and then runs SDPA over it: two passes over every key and value, plus the copy's writes,
// plus padding to the longest context of a group. This reads each context's keys and values once, in
// place, block by block, and keeps the scores of one sequence's KV head in a small buffer.
//
// Work item: one sequence (or one of its KV heads, when there are too few sequences to share out). The
// G = heads / kv_heads query heads of a KV head share every key and value row loaded (grouped-query
// attention without repeated keys). Arithmetic in float32 for float32 and
// bfloat16 caches alike, as SDPA's CPU kernels do. Compiled with -march=native: with AVX-512 the head
// dimension goes 16 lanes at a time (bfloat16 -> float32 is a 16-bit shift), else in plain loops.

#include <torch/extension.h>

#include <ATen/Parallel.h>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

inline float bf16_to_float(uint16_t raw) {
  uint32_t bits = static_cast<uint32_t>(raw) << 16;
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

inline float load_one(const float* p, int64_t i) { return p[i]; }
inline float load_one(const at::BFloat16* p, int64_t i) {
  return bf16_to_float(reinterpret_cast<const uint16_t*>(p)[i]);
}

#if defined(__AVX512F__)
// 16 lanes at a time; bfloat16 widens by a shift into the high half of each float32 lane.
constexpr int64_t kLanes = 16;
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const at::BFloat16* p) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

// q . k for one head: q already float32 and scaled.
template <typename scalar_t>
inline float dot(const float* q, const scalar_t* k, int64_t n) {
  if (n % kLanes != 0) {
    float sum = 0.f;
    for (int64_t d = 0; d < n; ++d) sum += q[d] * load_one(k, d);
    return sum;
  }
  __m512 acc = _mm512_setzero_ps();
  for (int64_t d = 0; d < n; d += kLanes) acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + d), load16(k + d), acc);
  return _mm512_reduce_add_ps(acc);
}

// acc += p * v for one head.
template <typename scalar_t>
inline void axpy(float p, const scalar_t* v, float* acc, int64_t n) {
  if (n % kLanes != 0) {
    for (int64_t d = 0; d < n; ++d) acc[d] += p * load_one(v, d);
    return;
  }
  const __m512 weight = _mm512_set1_ps(p);
  for (int64_t d = 0; d < n; d += kLanes)
    _mm512_storeu_ps(acc + d, _mm512_fmadd_ps(weight, load16(v + d), _mm512_loadu_ps(acc + d)));
}
#else
template <typename scalar_t>
inline float dot(const float* q, const scalar_t* k, int64_t n) {
  float sum = 0.f;
  for (int64_t d = 0; d < n; ++d) sum += q[d] * load_one(k, d);
  return sum;
}

template <typename scalar_t>
inline void axpy(float p, const scalar_t* v, float* acc, int64_t n) {
  for (int64_t d = 0; d < n; ++d) acc[d] += p * load_one(v, d);
}
#endif

inline void store_row(const float* src, float* dst, int64_t n, float scale) {
  for (int64_t i = 0; i < n; ++i) dst[i] = src[i] * scale;
}

inline void store_row(const float* src, at::BFloat16* dst, int64_t n, float scale) {
  for (int64_t i = 0; i < n; ++i) dst[i] = at::BFloat16(src[i] * scale);
}

// Hint the cache to fetch a row of every KV head (one token of a block) ahead of its use: blocks sit
// anywhere in the pool, so the hardware prefetcher cannot guess the next one.
inline void prefetch_row(const void* row, int64_t bytes) {
  const char* p = static_cast<const char*>(row);
  for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(p + off, 0, 3);
}

// One work item: sequence b, KV heads [h0, h1). Tokens are visited block by block, all of the item's
// heads per token, so each token's row (the heads side by side) is read once, front to back.
template <typename scalar_t>
struct Attention {
  const scalar_t *q, *k_cache, *v_cache;
  const int64_t *tables, *context_lens;
  scalar_t* out;
  int64_t heads, kv_heads, head_dim, block_size, table_width;
  float scale;

  // visit(t, row) for each token t < length of one sequence's cache rows, offset to the item's heads.
  // Block by block (a division per token would cost as much as its dot products), the next block's
  // rows prefetched while this one's are used.
  template <typename Visit>
  void each_row(const scalar_t* cache, const int64_t* table, int64_t length, int64_t head_offset,
                int64_t row_bytes, Visit&& visit) const {
    const int64_t row_stride = kv_heads * head_dim;
    for (int64_t start = 0; start < length; start += block_size) {
      const int64_t end = std::min(start + block_size, length);
      const scalar_t* block = cache + table[start / block_size] * block_size * row_stride + head_offset;
      const scalar_t* next =
          end < length ? cache + table[end / block_size] * block_size * row_stride + head_offset : nullptr;
      for (int64_t t = start; t < end; ++t) {
        if (next != nullptr) prefetch_row(next + (t - start) * row_stride, row_bytes);
        visit(t, block + (t - start) * row_stride);
      }
    }
  }

  void operator()(int64_t b, int64_t h0, int64_t h1, std::vector<float>& qf, std::vector<float>& acc,
                  std::vector<float>& scores) const {
    const int64_t group = heads / kv_heads;
    const int64_t length = context_lens[b], rows = (h1 - h0) * group;  // query heads of the item
    const int64_t* table = tables + b * table_width;
    const int64_t row_bytes = (h1 - h0) * head_dim * sizeof(scalar_t);
    const scalar_t* q_heads = q + (b * heads + h0 * group) * head_dim;
    qf.resize(rows * head_dim);
    acc.assign(rows * head_dim, 0.f);
    scores.resize(rows * length);
    for (int64_t i = 0; i < rows * head_dim; ++i) qf[i] = load_one(q_heads, i) * scale;
    const int64_t head_offset = h0 * head_dim;
    each_row(k_cache, table, length, head_offset, row_bytes, [&](int64_t t, const scalar_t* key) {
      for (int64_t r = 0; r < rows; ++r)  // scores[r][t] = q_r . k_t
        scores[r * length + t] = dot(qf.data() + r * head_dim, key + (r / group) * head_dim, head_dim);
    });
    for (int64_t r = 0; r < rows; ++r) {  // softmax over t, the 1 / sum folded into the output
      float* s = scores.data() + r * length;
      const float peak = *std::max_element(s, s + length);
      float sum = 0.f;
      for (int64_t t = 0; t < length; ++t) {
        s[t] = std::exp(s[t] - peak);
        sum += s[t];
      }
      const float inv = 1.f / sum;
      for (int64_t t = 0; t < length; ++t) s[t] *= inv;
    }
    each_row(v_cache, table, length, head_offset, row_bytes, [&](int64_t t, const scalar_t* value) {
      for (int64_t r = 0; r < rows; ++r)  // acc[r] += p[r][t] * v_t
        axpy(scores[r * length + t], value + (r / group) * head_dim, acc.data() + r * head_dim, head_dim);
    });
    store_row(acc.data(), out + (b * heads + h0 * group) * head_dim, rows * head_dim, 1.f);
  }
};

template <typename scalar_t>
void attend(const Attention<scalar_t>& attention, int64_t batch) {
  // Whole sequences per item while there are enough of them to share out; else one KV head per item.
  const int64_t kv_heads = attention.kv_heads;
  const int64_t split = batch < 4 * at::get_num_threads() ? kv_heads : 1;
  at::parallel_for(0, batch * split, 1, [&](int64_t first, int64_t last) {
    std::vector<float> qf, acc, scores;
    for (int64_t item = first; item < last; ++item) {
      const int64_t b = item / split, part = item % split;
      const int64_t h0 = split == 1 ? 0 : part, h1 = split == 1 ? kv_heads : part + 1;
      attention(b, h0, h1, qf, acc, scores);
    }
  });
}

}  // namespace

// q [B, H, D]; k_cache, v_cache [N, block_size, Hkv, D]; block_tables [B, nb] int64 (each row covers its
// context); context_lens [B] int64 (>= 1). Returns [B, H, D] in q's dtype.
torch::Tensor paged_decode(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                           torch::Tensor block_tables, torch::Tensor context_lens, double scale) {
  TORCH_CHECK(q.device().is_cpu() && k_cache.device().is_cpu(), "paged_decode runs on CPU tensors");
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes(), "bad shapes");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "the caches must be contiguous");
  TORCH_CHECK(q.scalar_type() == k_cache.scalar_type() && q.scalar_type() == v_cache.scalar_type(),
              "q and the caches must share a dtype");
  TORCH_CHECK(block_tables.scalar_type() == at::kLong && context_lens.scalar_type() == at::kLong,
              "block tables and context lengths are int64");
  const int64_t batch = q.size(0), heads = q.size(1), head_dim = q.size(2);
  const int64_t block_size = k_cache.size(1), kv_heads = k_cache.size(2);
  TORCH_CHECK(k_cache.size(3) == head_dim && heads % kv_heads == 0, "head shapes disagree");
  TORCH_CHECK(block_tables.size(0) == batch && context_lens.size(0) == batch, "one row per sequence");
  auto qc = q.contiguous();
  auto tables = block_tables.contiguous();
  auto lens = context_lens.contiguous();
  auto out = torch::empty_like(qc);
  const int64_t width = tables.size(1);
  // Every context must be covered by its table row and hold its new token: the loops read without checks.
  const int64_t* len_data = lens.data_ptr<int64_t>();
  for (int64_t b = 0; b < batch; ++b)
    TORCH_CHECK(len_data[b] >= 1 && len_data[b] <= width * block_size, "context_lens[", b, "] = ", len_data[b],
                " is outside [1, ", width * block_size, "] (the block table's reach)");
  AT_DISPATCH_SWITCH(q.scalar_type(), "paged_decode",
    AT_DISPATCH_CASE(at::kFloat, [&] {
      attend(Attention<float>{qc.data_ptr<float>(), k_cache.data_ptr<float>(), v_cache.data_ptr<float>(),
                              tables.data_ptr<int64_t>(), lens.data_ptr<int64_t>(), out.data_ptr<float>(),
                              heads, kv_heads, head_dim, block_size, width, static_cast<float>(scale)},
             batch);
    })
    AT_DISPATCH_CASE(at::kBFloat16, [&] {
      attend(Attention<at::BFloat16>{qc.data_ptr<at::BFloat16>(), k_cache.data_ptr<at::BFloat16>(),
                                     v_cache.data_ptr<at::BFloat16>(), tables.data_ptr<int64_t>(),
                                     lens.data_ptr<int64_t>(), out.data_ptr<at::BFloat16>(), heads, kv_heads,
                                     head_dim, block_size, width, static_cast<float>(scale)},
             batch);
    }));
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_decode", &paged_decode, "single-query paged attention over a block-addressed KV cache");
}
