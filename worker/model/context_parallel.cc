#include "worker/model/context_parallel.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tessera::model {
using runtime::Backend;
using runtime::Tensor;

namespace {

// The chunk pairs rank `me` computes against the key chunks of rank `src`: (query half,
// key half, causal). Half 0 holds chunk `rank`, half 1 chunk 2·cp−1−rank.
struct Block {
  int q, k;
  bool causal;
};
std::vector<Block> Blocks(int me, int src) {
  if (src == me) return {{0, 0, true}, {1, 0, false}, {1, 1, true}};
  std::vector<Block> out = {{1, 0, false}};  // chunk 2cp-1-me follows every chunk < cp
  if (src < me) out.push_back({0, 0, false});  // chunk me follows chunk src
  else out.push_back({1, 1, false});           // chunk 2cp-1-me follows chunk 2cp-1-src
  return out;
}

absl::StatusOr<Tensor> Half(const Tensor& t, int h) {
  const int64_t half = t.dim(0) / 2;
  return t.Slice(0, h * half, half);
}

absl::StatusOr<Tensor> Like(Backend& b, const Tensor& t) { return b.Empty(t.shape(), t.dtype()); }

// Sends every tensor to the next rank and receives the previous rank's into `into`.
absl::Status Pass(comm::Communicator& cp, const std::vector<const Tensor*>& send, const std::vector<Tensor*>& into) {
  const int next = (cp.rank() + 1) % cp.size(), prev = (cp.rank() + cp.size() - 1) % cp.size();
  cp.GroupStart();
  absl::Status st;
  for (size_t i = 0; i < send.size() && st.ok(); ++i) {
    st.Update(cp.Send(send[i]->data(), send[i]->numel(), send[i]->dtype(), next));
    st.Update(cp.Recv(into[i]->data(), into[i]->numel(), into[i]->dtype(), prev));
  }
  st.Update(cp.GroupEnd());
  return st;
}

}  // namespace

absl::StatusOr<TokenBatch> SplitForContextParallel(const TokenBatch& g, int cp, int rank, int multiple) {
  if (cp < 1 || rank < 0 || rank >= cp || multiple < 1)
    return absl::InvalidArgumentError(absl::StrCat("context parallel: rank ", rank, " of ", cp, " (multiple ", multiple, ")"));
  const size_t n = g.tokens.size();
  if (g.targets.size() != n || g.positions.size() != n || g.cu_seqlens.size() < 2 || g.cu_seqlens.front() != 0 ||
      g.cu_seqlens.back() != static_cast<int32_t>(n))
    return absl::InvalidArgumentError("batch: tokens, targets, positions and cu_seqlens disagree");
  const int64_t unit = 2 * int64_t(cp) * multiple;
  TokenBatch half[2];
  for (auto& h : half) h.cu_seqlens = {0};
  for (size_t s = 0; s + 1 < g.cu_seqlens.size(); ++s) {
    const int32_t begin = g.cu_seqlens[s], end = g.cu_seqlens[s + 1];
    if (end <= begin) return absl::InvalidArgumentError(absl::StrCat("batch: sequence ", s, " is empty"));
    const int64_t len = end - begin, padded = (len + unit - 1) / unit * unit, chunk = padded / (2 * cp);
    for (int h = 0; h < 2; ++h) {
      const int64_t c = h == 0 ? rank : 2 * cp - 1 - rank;
      for (int64_t j = c * chunk; j < (c + 1) * chunk; ++j) {
        const bool real = j < len;
        half[h].tokens.push_back(real ? g.tokens[begin + j] : 0);
        half[h].targets.push_back(real ? g.targets[begin + j] : -1);
        half[h].positions.push_back(real ? g.positions[begin + j] : g.positions[end - 1] + static_cast<int32_t>(j - len + 1));
      }
      half[h].cu_seqlens.push_back(half[h].cu_seqlens.back() + static_cast<int32_t>(chunk));
    }
  }
  TokenBatch out = std::move(half[0]);
  const int32_t base = static_cast<int32_t>(out.tokens.size());
  out.tokens.insert(out.tokens.end(), half[1].tokens.begin(), half[1].tokens.end());
  out.targets.insert(out.targets.end(), half[1].targets.begin(), half[1].targets.end());
  out.positions.insert(out.positions.end(), half[1].positions.begin(), half[1].positions.end());
  for (size_t i = 1; i < half[1].cu_seqlens.size(); ++i) out.cu_seqlens.push_back(base + half[1].cu_seqlens[i]);
  return out;
}

absl::StatusOr<std::vector<int32_t>> ContextParallelHalf(const TokenBatch& local) {
  const auto& cu = local.cu_seqlens;
  if (cu.size() < 3 || cu.size() % 2 == 0)
    return absl::InvalidArgumentError(
        absl::StrCat("batch: under context parallelism cu_seqlens holds 2B + 1 chunk boundaries, got ", cu.size()));
  const size_t nb = (cu.size() - 1) / 2;
  std::vector<int32_t> h(cu.begin(), cu.begin() + nb + 1);
  for (size_t i = 0; i <= nb; ++i)
    if (cu[nb + i] - cu[nb] != h[i] || 2 * int64_t(cu[nb]) != cu.back())
      return absl::InvalidArgumentError("batch: under context parallelism both halves must hold chunks of the same lengths");
  return h;
}

absl::Status RingAttentionForward(Backend& b, comm::Communicator& cp, const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& cu_half, Tensor& out, Tensor& lse) {
  const int me = cp.rank(), size = cp.size();
  Tensor outs[2], lses[2];
  bool started[2] = {false, false};  // the first block of a half writes it, later ones merge into it
  for (int h = 0; h < 2; ++h) {
    TESSERA_ASSIGN_OR_RETURN(outs[h], Half(out, h));
    TESSERA_ASSIGN_OR_RETURN(lses[h], Half(lse, h));
  }
  TESSERA_ASSIGN_OR_RETURN(Tensor o_blk, Half(out, 0));  // shapes only
  TESSERA_ASSIGN_OR_RETURN(o_blk, Like(b, o_blk));
  TESSERA_ASSIGN_OR_RETURN(Tensor l_blk, Half(lse, 0));
  TESSERA_ASSIGN_OR_RETURN(l_blk, Like(b, l_blk));
  Tensor kc = k, vc = v, kn, vn;
  TESSERA_ASSIGN_OR_RETURN(kn, Like(b, k));
  TESSERA_ASSIGN_OR_RETURN(vn, Like(b, v));
  if (size > 1) {  // the visiting K/V must not alias the inputs
    TESSERA_ASSIGN_OR_RETURN(kc, Like(b, k));
    TESSERA_ASSIGN_OR_RETURN(vc, Like(b, v));
    TESSERA_RETURN_IF_ERROR(b.Axpby(1.f, k, 0.f, kc));
    TESSERA_RETURN_IF_ERROR(b.Axpby(1.f, v, 0.f, vc));
  }
  for (int step = 0; step < size; ++step) {
    const int src = (me - step + size) % size;
    for (const Block& blk : Blocks(me, src)) {
      TESSERA_ASSIGN_OR_RETURN(Tensor qh, Half(q, blk.q));
      TESSERA_ASSIGN_OR_RETURN(Tensor kh, Half(kc, blk.k));
      TESSERA_ASSIGN_OR_RETURN(Tensor vh, Half(vc, blk.k));
      if (!started[blk.q]) {
        TESSERA_RETURN_IF_ERROR(b.AttentionForward(qh, kh, vh, cu_half, blk.causal, outs[blk.q], lses[blk.q]));
        started[blk.q] = true;
        continue;
      }
      TESSERA_RETURN_IF_ERROR(b.AttentionForward(qh, kh, vh, cu_half, blk.causal, o_blk, l_blk));
      TESSERA_RETURN_IF_ERROR(b.AttentionMerge(outs[blk.q], lses[blk.q], o_blk, l_blk));
    }
    if (step + 1 < size) {
      TESSERA_RETURN_IF_ERROR(Pass(cp, {&kc, &vc}, {&kn, &vn}));
      std::swap(kc, kn);
      std::swap(vc, vn);
    }
  }
  return absl::OkStatus();
}

absl::Status RingAttentionBackward(Backend& b, comm::Communicator& cp, const Tensor& q, const Tensor& k, const Tensor& v,
                                   const Tensor& cu_half, const Tensor& out, const Tensor& dout, const Tensor& lse,
                                   Tensor& dq, Tensor& dk, Tensor& dv) {
  const int me = cp.rank(), size = cp.size();
  TESSERA_RETURN_IF_ERROR(b.Fill(dq, 0));
  // The visiting K/V and their gradient accumulators (which travel with them).
  Tensor kc, vc, dkc, dvc, kn, vn, dkn, dvn;
  for (auto [t, like] : {std::pair{&kc, &k}, {&vc, &v}, {&dkc, &k}, {&dvc, &v}, {&kn, &k}, {&vn, &v}, {&dkn, &k},
                         {&dvn, &v}}) {
    TESSERA_ASSIGN_OR_RETURN(*t, Like(b, *like));
  }
  TESSERA_RETURN_IF_ERROR(b.Axpby(1.f, k, 0.f, kc));
  TESSERA_RETURN_IF_ERROR(b.Axpby(1.f, v, 0.f, vc));
  TESSERA_RETURN_IF_ERROR(b.Fill(dkc, 0));
  TESSERA_RETURN_IF_ERROR(b.Fill(dvc, 0));
  TESSERA_ASSIGN_OR_RETURN(Tensor q0, Half(q, 0));
  TESSERA_ASSIGN_OR_RETURN(Tensor k0, Half(k, 0));
  TESSERA_ASSIGN_OR_RETURN(Tensor v0, Half(v, 0));
  TESSERA_ASSIGN_OR_RETURN(Tensor dq_blk, Like(b, q0));
  TESSERA_ASSIGN_OR_RETURN(Tensor dk_blk, Like(b, k0));
  TESSERA_ASSIGN_OR_RETURN(Tensor dv_blk, Like(b, v0));
  for (int step = 0; step < size; ++step) {
    const int src = (me - step + size) % size;
    for (const Block& blk : Blocks(me, src)) {
      TESSERA_ASSIGN_OR_RETURN(Tensor qh, Half(q, blk.q));
      TESSERA_ASSIGN_OR_RETURN(Tensor oh, Half(out, blk.q));
      TESSERA_ASSIGN_OR_RETURN(Tensor doh, Half(dout, blk.q));
      TESSERA_ASSIGN_OR_RETURN(Tensor lh, Half(lse, blk.q));
      TESSERA_ASSIGN_OR_RETURN(Tensor kh, Half(kc, blk.k));
      TESSERA_ASSIGN_OR_RETURN(Tensor vh, Half(vc, blk.k));
      TESSERA_RETURN_IF_ERROR(b.AttentionBackward(qh, kh, vh, cu_half, blk.causal, oh, doh, lh, dq_blk, dk_blk, dv_blk));
      TESSERA_ASSIGN_OR_RETURN(Tensor dqh, Half(dq, blk.q));
      TESSERA_ASSIGN_OR_RETURN(Tensor dkh, Half(dkc, blk.k));
      TESSERA_ASSIGN_OR_RETURN(Tensor dvh, Half(dvc, blk.k));
      TESSERA_RETURN_IF_ERROR(b.Axpby(1.f, dq_blk, 1.f, dqh));
      TESSERA_RETURN_IF_ERROR(b.Axpby(1.f, dk_blk, 1.f, dkh));
      TESSERA_RETURN_IF_ERROR(b.Axpby(1.f, dv_blk, 1.f, dvh));
    }
    if (size == 1) break;
    if (step + 1 < size) {
      TESSERA_RETURN_IF_ERROR(Pass(cp, {&kc, &vc, &dkc, &dvc}, {&kn, &vn, &dkn, &dvn}));
      std::swap(kc, kn), std::swap(vc, vn);
    } else {  // the last hop brings every rank's accumulators home
      TESSERA_RETURN_IF_ERROR(Pass(cp, {&dkc, &dvc}, {&dkn, &dvn}));
    }
    std::swap(dkc, dkn), std::swap(dvc, dvn);
  }
  TESSERA_RETURN_IF_ERROR(b.Axpby(1.f, dkc, 0.f, dk));
  return b.Axpby(1.f, dvc, 0.f, dv);
}

}  // namespace tessera::model
