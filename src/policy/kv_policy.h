// A KV policy is a combination of independent axes, not a class:
//   Placement (where blocks live and how they reach compute) x Representation (how a row is stored)
//   x Selection (which stored tokens a step attends) x Retention (which tokens are ever forgotten).
// Paper names are presets of this product. Every valid combination runs through the same executor;
// a spec that names two values of one axis, or a value that does not exist, is a clear error.
//
// Spec grammar (the --kv-policy flag): a preset name, or values joined by '+', each naming its axis by
// itself ("headinfer+sliding", "layer+f32", "resident+sliding+f16"). Axes a spec leaves out take the
// defaults the caller passes (e.g. the representation of --kv-type).
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "policy/placement.h"

namespace kvtier::policy {

enum class Axis { kPlacement, kRepresentation, kSelection, kRetention };

enum class Representation { kF16, kF32 };

enum class Selection {
  kAll,  // every stored token (sliding windows are applied by the attention mask)
};

enum class Retention {
  kNone,     // keep every position until truncation
  kSliding,  // free blocks that a sliding-window layer can no longer see (exact)
};

struct KvPolicy {
  Placement placement = Placement::kResident;
  Representation representation = Representation::kF16;
  Selection selection = Selection::kAll;
  Retention retention = Retention::kNone;

  // Exact: same tokens and logits as `resident` (bit-identical on the CPU backend): a lossless
  // representation, every token selected, and nothing forgotten that a query could still see.
  bool exact() const;
  // The canonical spec: the placement, then every axis that differs from its default ("layer+sliding").
  std::string spec() const;
  bool operator==(const KvPolicy&) const = default;
};

std::string_view axis_name(Axis a);
std::string_view representation_name(Representation r);
std::string_view selection_name(Selection s);
std::string_view retention_name(Retention r);

// One value of one axis, as `kvtier policies` lists it.
struct AxisValue {
  Axis axis;
  std::string_view name;
  bool exact;             // does this value keep a policy exact?
  std::string_view help;  // what it does, and the flags that tune it
};
std::span<const AxisValue> axis_values();

// A named combination (the papers' names and the baselines).
struct Preset {
  std::string_view name;
  std::string_view spec;  // the combination it stands for
  std::string_view help;
};
std::span<const Preset> presets();

// Parses a spec; throws Error(kInvalidArgument) naming the unknown value (with the known ones), or the
// two values that compete for one axis.
KvPolicy parse_kv_policy(std::string_view spec, const KvPolicy& defaults = {});
// "resident,layer+sliding" -> policies in order; an empty item or a repeated policy is an error.
std::vector<KvPolicy> parse_kv_policy_list(std::string_view list, const KvPolicy& defaults = {});
// Does the spec name a value of this axis itself (rather than leaving it to the defaults)?
bool spec_names_axis(std::string_view spec, Axis axis);

}  // namespace kvtier::policy
