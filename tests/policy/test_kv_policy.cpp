// KV policies as combinations of axes: presets, '+' specs, defaults, and the errors for values that
// do not exist or compete for one axis.
#include <gtest/gtest.h>

#include "core/error.h"
#include "policy/kv_policy.h"

namespace kvtier::policy {
namespace {

std::string error_of(std::string_view spec) {
  try {
    (void)parse_kv_policy(spec);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    return e.what();
  }
  return "";
}

TEST(KvPolicy, PresetsAndSpecsParseToCombinations) {
  EXPECT_EQ(parse_kv_policy("resident"), KvPolicy{});
  const KvPolicy hs = parse_kv_policy("headinfer+sliding");
  EXPECT_EQ(hs.placement, Placement::kHeadInfer);
  EXPECT_EQ(hs.retention, Retention::kSliding);
  EXPECT_EQ(hs.representation, Representation::kF16);
  // Order does not matter; axes left out take the caller's defaults.
  KvPolicy d;
  d.representation = Representation::kF32;
  const KvPolicy ls = parse_kv_policy("sliding+layer", d);
  EXPECT_EQ(ls.placement, Placement::kLayer);
  EXPECT_EQ(ls.representation, Representation::kF32);
  EXPECT_EQ(parse_kv_policy("layer+f16", d).representation, Representation::kF16);
  // A spec of values alone (no placement) keeps the default placement.
  EXPECT_EQ(parse_kv_policy("sliding").placement, Placement::kResident);
  // spec() is canonical and parses back to the same policy.
  for (std::string_view s : {"resident", "layer+sliding", "headinfer+f32", "resident+f32+sliding"}) {
    const KvPolicy p = parse_kv_policy(s);
    EXPECT_EQ(parse_kv_policy(p.spec()), p) << s;
  }
  EXPECT_EQ(parse_kv_policy("sliding+f32+headinfer").spec(), "headinfer+f32+sliding");
  EXPECT_TRUE(parse_kv_policy("resident+f32+sliding").exact());
  EXPECT_TRUE(spec_names_axis("layer+sliding", Axis::kRetention));
  EXPECT_FALSE(spec_names_axis("layer+sliding", Axis::kRepresentation));
  EXPECT_TRUE(spec_names_axis("headinfer", Axis::kPlacement));
}

TEST(KvPolicy, WhatDoesNotComposeIsAClearError) {
  std::string m = error_of("layer+headinfer");
  EXPECT_NE(m.find("two placement values, 'layer' and 'headinfer'"), std::string::npos) << m;
  EXPECT_NE(m.find("one value per axis"), std::string::npos) << m;
  m = error_of("resident+f16+f32");
  EXPECT_NE(m.find("two representation values"), std::string::npos) << m;
  m = error_of("layer+sliding+none");
  EXPECT_NE(m.find("two retention values"), std::string::npos) << m;
  m = error_of("layer+lru");
  EXPECT_NE(m.find("unknown KV policy value 'lru'"), std::string::npos) << m;
  EXPECT_NE(m.find("retention: none sliding"), std::string::npos) << m;  // names the known values
  EXPECT_NE(error_of("layer++sliding").find("empty part"), std::string::npos);
  EXPECT_NE(error_of("").find("empty KV policy"), std::string::npos);
}

TEST(KvPolicy, ListsRejectRepeats) {
  const auto l = parse_kv_policy_list("resident,layer+sliding,headinfer");
  ASSERT_EQ(l.size(), 3u);
  EXPECT_EQ(l[1].retention, Retention::kSliding);
  EXPECT_THROW(parse_kv_policy_list("layer+sliding,sliding+layer"), Error);
  EXPECT_THROW(parse_kv_policy_list("layer,"), Error);
}

TEST(KvPolicy, EveryValueAndPresetIsListed) {
  int per_axis[4] = {};  // exact values per axis
  for (const AxisValue& v : axis_values()) {
    if (v.exact) ++per_axis[static_cast<int>(v.axis)];
    EXPECT_FALSE(v.help.empty()) << v.name;
    if (!v.exact) {
      EXPECT_EQ(v.flags.substr(0, 2), "--") << v.name << ": an approximate value names its knobs";
    }
    KvPolicy p = parse_kv_policy(v.name);  // every value parses alone
    EXPECT_EQ(p.exact(), v.exact) << v.name;
  }
  EXPECT_EQ(per_axis[0], 3);
  EXPECT_EQ(per_axis[1], 4);  // f16, f32, kvpr, hybrid (kivi4, kivi2 are approximate)
  EXPECT_EQ(per_axis[2], 1);
  EXPECT_EQ(per_axis[3], 2);
  for (const Preset& p : presets()) EXPECT_NO_THROW((void)parse_kv_policy(p.spec)) << p.name;
}

TEST(KvPolicy, KvprIsAPresetAloneAndARepresentationInACombination) {
  const KvPolicy alone = parse_kv_policy("kvpr");
  EXPECT_EQ(alone.placement, Placement::kLayer);
  EXPECT_EQ(alone.representation, Representation::kKvpr);
  EXPECT_TRUE(alone.exact());
  const KvPolicy hi = parse_kv_policy("headinfer+kvpr");
  EXPECT_EQ(hi.placement, Placement::kHeadInfer);
  EXPECT_EQ(hi.representation, Representation::kKvpr);
  EXPECT_EQ(hi.spec(), "headinfer+kvpr");
  EXPECT_THROW((void)parse_kv_policy("kvpr+hybrid"), Error);  // two representations
  KvPolicy bad = alone;
  bad.knobs.recompute = -3;  // -1 auto, -2 random
  EXPECT_THROW(check_knobs(bad), Error);
}

TEST(KvPolicy, KiviComposesWithKvpr) {
  const KvPolicy p = parse_kv_policy("layer+kivi4+kvpr");
  EXPECT_EQ(p.placement, Placement::kLayer);
  EXPECT_EQ(p.representation, Representation::kKivi4Kvpr);
  EXPECT_EQ(p.spec(), "layer+kivi4+kvpr");
  EXPECT_EQ(parse_kv_policy(p.spec()), p);  // the canonical spec parses back
  EXPECT_FALSE(p.exact());                  // KIVI's rounding stays
  EXPECT_TRUE(stores_inputs(p.representation));
  EXPECT_TRUE(recomputes_prefix(p.representation));
  EXPECT_TRUE(is_kivi(p.representation));
  EXPECT_EQ(kivi_bits(p.representation), 4);
  EXPECT_TRUE(representation_has(p.representation, "kivi4"));
  EXPECT_TRUE(representation_has(p.representation, "kvpr"));
  EXPECT_FALSE(representation_has(p.representation, "kivi2"));
  // either order, either width, with the other axes
  const KvPolicy q = parse_kv_policy("kvpr+headinfer+kivi2+sliding");
  EXPECT_EQ(q.representation, Representation::kKivi2Kvpr);
  EXPECT_EQ(q.spec(), "headinfer+kivi2+kvpr+sliding");
  EXPECT_EQ(kivi_bits(q.representation), 2);
  EXPECT_FALSE(recomputes_prefix(Representation::kHybrid));
  EXPECT_FALSE(is_kivi(Representation::kKvpr));
  // no other pair composes, and a third representation value is named in the error
  std::string m = error_of("layer+kivi4+hybrid");
  EXPECT_NE(m.find("two representation values, 'kivi4' and 'hybrid'"), std::string::npos) << m;
  EXPECT_NE(m.find("kivi4 or kivi2 with kvpr"), std::string::npos) << m;
  m = error_of("layer+kivi4+kvpr+kvpr");
  EXPECT_NE(m.find("'kivi4+kvpr' and 'kvpr'"), std::string::npos) << m;
  m = error_of("layer+kivi4+kivi2");
  EXPECT_NE(m.find("'kivi4' and 'kivi2'"), std::string::npos) << m;
  KvPolicy bad = p;
  bad.knobs.recompute = -3;
  EXPECT_THROW(check_knobs(bad), Error);
  bad = p;
  bad.knobs.kivi_group = 0;
  EXPECT_THROW(check_knobs(bad), Error);
}

// --locret-positions: compact (the default) or original, the latter on the resident placement only (an
// offloaded placement's locret store keeps compact rows), refused there with the reason.
TEST(KvPolicy, LocretOriginalPositionsAreForTheResidentPlacement) {
  EXPECT_EQ(parse_locret_positions("original"), LocretPositions::kOriginal);
  EXPECT_EQ(locret_positions_name(LocretPositions::kCompact), "compact");
  EXPECT_THROW(parse_locret_positions("true"), Error);
  KvPolicy p = parse_kv_policy("locret");
  p.knobs.budget = 64;
  p.knobs.locret_positions = LocretPositions::kOriginal;
  EXPECT_NO_THROW(check_knobs(p));
  KvPolicy q = parse_kv_policy("headinfer+locret");
  q.knobs = p.knobs;
  try {
    check_knobs(q);
    ADD_FAILURE() << "headinfer+locret with original positions was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("resident placement only"), std::string::npos) << e.what();
  }
  q.knobs.locret_positions = LocretPositions::kCompact;
  EXPECT_NO_THROW(check_knobs(q));
}

TEST(KvPolicy, PoolIsARetentionOfInfinigen) {
  KvPolicy p = parse_kv_policy("layer+infinigen+pool");
  EXPECT_EQ(p.placement, Placement::kLayer);
  EXPECT_EQ(p.selection, Selection::kInfinigen);
  EXPECT_EQ(p.retention, Retention::kPool);
  EXPECT_FALSE(p.exact());
  EXPECT_EQ(p.spec(), "layer+infinigen+pool");
  EXPECT_EQ(parse_kv_policy("headinfer+infinigen+pool").placement, Placement::kHeadInfer);
  EXPECT_NO_THROW(check_knobs(p));  // no limit: nothing is evicted
  p.knobs.pool_limit = 64ull << 20;
  p.knobs.pool_eviction = PoolEviction::kLru;
  EXPECT_NO_THROW(check_knobs(p));
  KvPolicy q = parse_kv_policy("layer+pool");  // parses, but the pool belongs to infinigen
  try {
    check_knobs(q);
    ADD_FAILURE() << "layer+pool accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs selection infinigen"), std::string::npos) << e.what();
  }
  EXPECT_NE(error_of("layer+infinigen+pool+sliding").find("two retention values"), std::string::npos);
}

}  // namespace
}  // namespace kvtier::policy
