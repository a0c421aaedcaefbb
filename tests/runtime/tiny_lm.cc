#include "tests/runtime/tiny_lm.h"

#include <algorithm>
#include <random>

#include "zeroshard/status.h"

namespace zeroshard::testing {

ModelSpec TinySpec(const TinyOptions& o) {
  ModelSpec spec;
  spec.units.push_back({"embed", {{"weight", {kVocab, kHidden}}}});
  UnitSpec mid{"mid", {{"w", {kHidden, kHidden}}, {"f", {kHidden, kHidden}}, {"b", {kHidden}}}};
  mid.params[1].trainable = !o.f_frozen;
  mid.params[2].no_decay = true;
  spec.units.push_back(mid);
  if (o.scale_unit) {
    UnitSpec scale{"scale", {{"g", {kHidden}}}};
    scale.params[0].trainable = false;
    spec.units.push_back(scale);
  }
  UnitSpec head{"head", {{"weight", {kVocab, kHidden}}, {"bias", {kVocab}}}};
  head.params[0].tied_to = ParamRef{"embed", "weight"};
  head.params[1].no_decay = true;
  spec.units.push_back(head);
  return spec;
}

namespace {

// Deterministic values from a key: uniform in [-1, 1).
float Noise(uint64_t seed, uint64_t a, uint64_t b, uint64_t c) {
  std::seed_seq seq{seed, a, b, c};
  std::mt19937 rng(seq);
  return std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng);
}

}  // namespace

std::vector<float> InitValues(uint64_t seed, int unit, int param, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  std::mt19937_64 rng(seed * 7919 + static_cast<uint64_t>(unit) * 131 +
                      static_cast<uint64_t>(param));
  std::normal_distribution<float> normal(0.0f, 0.3f);
  for (float& x : v) x = normal(rng);
  if (unit == kScale || (unit == kMid && param == 2)) {
    for (float& x : v) x = 1.0f + x;  // a scale near 1, a bias near 1
  }
  return v;
}

Batch MakeBatch(uint64_t seed, int64_t step, int micro) {
  Batch b;
  for (int i = 0; i < kBatch; ++i) {
    const float u = Noise(seed, 1000 + step, micro, i);
    b.tokens[i] = static_cast<int>((u + 1.0f) * 0.5f * kVocab) % kVocab;
    for (int v = 0; v < kVocab; ++v) b.target[i][v] = Noise(seed, 2000 + step, micro, i * 64 + v);
  }
  return b;
}

// One micro-batch through the engine. Params are fp32 host views.
absl::Status MicroBatch(Engine& e, const ModelSpec& spec, const Batch& batch,
                        const TrainerOptions& t) {
  const bool has_scale = spec.units.size() == 4;
  const int scale = has_scale ? 2 : -1;
  const int head = has_scale ? 3 : 2;
  float x[kBatch][kHidden], z[kBatch][kHidden], y[kBatch][kHidden], dl[kBatch][kVocab];
  float dz[kBatch][kHidden], dx[kBatch][kHidden];
  // Forward.
  ZS_ASSIGN_OR_RETURN(UnitView ev, e.Gather(kEmbed));
  const float* E = ev.params[0].as<float>();
  for (int i = 0; i < kBatch; ++i) {
    for (int k = 0; k < kHidden; ++k) x[i][k] = E[batch.tokens[i] * kHidden + k];
  }
  if (!t.hold_embed) ZS_RETURN_IF_ERROR(e.Release(kEmbed));
  ZS_ASSIGN_OR_RETURN(UnitView mv, e.Gather(kMid));
  auto mid_forward = [&](const UnitView& v) {
    const float* W = v.params[0].as<float>();
    const float* F = v.params[1].as<float>();
    const float* b = v.params[2].as<float>();
    for (int i = 0; i < kBatch; ++i) {
      for (int r = 0; r < kHidden; ++r) {
        float s = b[r];
        for (int c = 0; c < kHidden; ++c) s += (W[r * kHidden + c] + F[r * kHidden + c]) * x[i][c];
        z[i][r] = s;
      }
    }
  };
  mid_forward(mv);
  ZS_RETURN_IF_ERROR(e.Release(kMid));
  std::vector<float> g(kHidden, 1.0f);
  if (has_scale) {
    ZS_ASSIGN_OR_RETURN(UnitView sv, e.Gather(scale));
    for (int k = 0; k < kHidden; ++k) g[k] = sv.params[0].as<float>()[k];
    ZS_RETURN_IF_ERROR(e.Release(scale));
  }
  for (int i = 0; i < kBatch; ++i) {
    for (int k = 0; k < kHidden; ++k) y[i][k] = g[k] * z[i][k];
  }
  ZS_ASSIGN_OR_RETURN(UnitView hv, e.Gather(head));
  if (t.hold_embed) ZS_RETURN_IF_ERROR(e.Release(kEmbed));
  const float* HE = hv.params[0].as<float>();
  const float* bias = hv.params[1].as<float>();
  for (int i = 0; i < kBatch; ++i) {
    for (int v = 0; v < kVocab; ++v) {
      float s = bias[v];
      for (int k = 0; k < kHidden; ++k) s += HE[v * kHidden + k] * y[i][k];
      dl[i][v] = (s - batch.target[i][v]) / kBatch;
    }
  }
  // Backward: head (its use of E), scale (nothing to reduce), mid, embed.
  ZS_ASSIGN_OR_RETURN(UnitView hg, e.GradView(head));
  float* dE = hg.params[0].as<float>();
  float* dbias = hg.params[1].as<float>();
  for (int v = 0; v < kVocab; ++v) {
    float sb = 0;
    for (int i = 0; i < kBatch; ++i) sb += dl[i][v];
    dbias[v] = sb;
    for (int k = 0; k < kHidden; ++k) {
      float s = 0;
      for (int i = 0; i < kBatch; ++i) s += dl[i][v] * y[i][k];
      dE[v * kHidden + k] = s;
    }
  }
  for (int i = 0; i < kBatch; ++i) {
    for (int k = 0; k < kHidden; ++k) {
      float s = 0;
      for (int v = 0; v < kVocab; ++v) s += HE[v * kHidden + k] * dl[i][v];
      dz[i][k] = g[k] * s;
    }
  }
  ZS_RETURN_IF_ERROR(e.ReduceGrads(head));
  ZS_RETURN_IF_ERROR(e.Release(head));
  if (t.recompute) {
    // Recompute x from the embedding (activation checkpointing's pattern).
    ZS_ASSIGN_OR_RETURN(UnitView again, e.Gather(kEmbed));
    const float* E2 = again.params[0].as<float>();
    for (int i = 0; i < kBatch; ++i) {
      for (int k = 0; k < kHidden; ++k) x[i][k] = E2[batch.tokens[i] * kHidden + k];
    }
    ZS_RETURN_IF_ERROR(e.Release(kEmbed));
  }
  ZS_ASSIGN_OR_RETURN(UnitView mv2, e.Gather(kMid));
  ZS_ASSIGN_OR_RETURN(UnitView mg, e.GradView(kMid));
  const float* W = mv2.params[0].as<float>();
  const float* F = mv2.params[1].as<float>();
  float* dW = mg.params[0].as<float>();
  float* dF = mg.params[1].as<float>();  // null when frozen
  float* db = mg.params[2].as<float>();
  for (int r = 0; r < kHidden; ++r) {
    float sb = 0;
    for (int i = 0; i < kBatch; ++i) sb += dz[i][r];
    db[r] = sb;
    for (int c = 0; c < kHidden; ++c) {
      float s = 0;
      for (int i = 0; i < kBatch; ++i) s += dz[i][r] * x[i][c];
      if (dW != nullptr) dW[r * kHidden + c] = s;
      if (dF != nullptr) dF[r * kHidden + c] = s;
    }
  }
  for (int i = 0; i < kBatch; ++i) {
    for (int c = 0; c < kHidden; ++c) {
      float s = 0;
      for (int r = 0; r < kHidden; ++r) s += (W[r * kHidden + c] + F[r * kHidden + c]) * dz[i][r];
      dx[i][c] = s;
    }
  }
  ZS_RETURN_IF_ERROR(e.ReduceGrads(kMid));
  ZS_RETURN_IF_ERROR(e.Release(kMid));
  ZS_RETURN_IF_ERROR(e.Gather(kEmbed).status());
  ZS_ASSIGN_OR_RETURN(UnitView eg, e.GradView(kEmbed));
  float* dEe = eg.params[0].as<float>();
  std::fill(dEe, dEe + kVocab * kHidden, 0.0f);
  for (int i = 0; i < kBatch; ++i) {
    for (int k = 0; k < kHidden; ++k) dEe[batch.tokens[i] * kHidden + k] += dx[i][k];
  }
  ZS_RETURN_IF_ERROR(e.ReduceGrads(kEmbed));
  return e.Release(kEmbed);
}

}  // namespace zeroshard::testing
