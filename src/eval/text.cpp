#include "eval/text.h"

#include <algorithm>
#include <array>
#include <span>
#include <unordered_set>

#include "core/error.h"

namespace kvtier::eval {
namespace {

using Words = std::span<const std::string_view>;

constexpr std::string_view kPasskeyFiller[] = {"The grass is green.", "The sky is blue.",
                                               "The sun is yellow.", "Here we go.", "There and back again."};

constexpr std::string_view kAdjectives[] = {
    "quiet",   "ancient", "narrow", "bright", "cold",   "distant", "gentle",   "heavy", "hidden", "broad",
    "golden",  "silent",  "steep",  "early",  "late",   "simple",  "careful",  "small", "large",  "patient",
    "old",     "young",   "wooden", "stone",  "busy",   "empty",   "crowded",  "green", "grey",   "warm",
    "curious", "modest",  "proud",  "rough",  "smooth", "strange", "familiar", "rare",  "common", "humble"};
constexpr std::string_view kNouns[] = {
    "harbor",   "village", "river",  "mill",     "bridge",  "library", "garden",  "market",  "valley",
    "orchard",  "forest",  "road",   "tower",    "church",  "school",  "farm",    "kitchen", "workshop",
    "field",    "island",  "lake",   "mountain", "station", "castle",  "meadow",  "cottage", "square",
    "teacher",  "farmer",  "sailor", "merchant", "doctor",  "student", "painter", "builder", "traveler",
    "musician", "writer",  "miller", "weaver",   "baker",   "soldier", "keeper",  "child",   "neighbor"};
constexpr std::string_view kPeople[] = {"teacher", "farmer",  "sailor", "merchant", "doctor", "student",
                                        "painter", "builder", "miller", "weaver",   "baker",  "neighbor"};
constexpr std::string_view kPlaces[] = {"harbor", "village", "river",  "mill",    "bridge", "library",
                                        "garden", "market",  "valley", "orchard", "forest", "station",
                                        "square", "meadow",  "island", "castle",  "farm",   "workshop"};
constexpr std::string_view kVerbsPast[] = {"visited", "crossed",  "repaired", "painted", "described",
                                           "watched", "measured", "followed", "built",   "remembered",
                                           "cleaned", "opened",   "sold",     "found",   "carried"};
constexpr std::string_view kThings[] = {
    "a letter",         "the old map",     "a basket of apples", "a lantern",           "the ledger",
    "a small boat",     "the clock",       "a bundle of wool",   "the key to the gate", "a loaf of bread",
    "the fishing nets", "a book of songs", "the cart",           "a jar of honey",      "the tools"};
constexpr std::string_view kTimes[] = {
    "In the morning", "Every spring",       "After the storm", "Before the winter", "On most evenings",
    "Long ago",       "During the harvest", "At midday",       "Once a year",       "Later that week"};
constexpr std::string_view kReasons[] = {"because the weather had turned", "since nobody else had the time",
                                         "as the elders had asked",        "so that the others could rest",
                                         "although the path was long",     "while the light was still good",
                                         "before anyone could object"};
constexpr std::string_view kObservations[] = {
    "Nobody could say how old it really was.",
    "It was the kind of work that takes patience more than strength.",
    "People still talk about that year.",
    "The result was better than anyone expected.",
    "Most of them agreed that it had been worth the effort.",
    "Such things were common in those days.",
    "It took longer than planned, as these things usually do.",
    "The records from that time are incomplete.",
    "Some of the younger ones found it tedious.",
    "There was little else to do until the roads dried."};

constexpr std::string_view kOnsets[] = {"b", "br", "c", "d",  "dr", "f", "g",  "gr", "h",  "k", "l",
                                        "m", "n",  "p", "pl", "r",  "s", "st", "t",  "tr", "v", "w"};
constexpr std::string_view kVowels[] = {"a", "e", "i", "o", "u", "ai", "ea", "ou", "io"};
constexpr std::string_view kCodas[] = {"", "", "", "n", "r", "l", "s", "m", "nd", "st"};

std::string pick(Rng& rng, Words w) {
  return std::string(w[rng.below(w.size())]);
}

std::string essay_sentence(Rng& rng) {
  const std::string adj = pick(rng, kAdjectives);
  switch (rng.below(6)) {
    case 0:
      return pick(rng, kTimes) + ", the " + pick(rng, kPeople) + " " + pick(rng, kVerbsPast) + " the " + adj +
             " " + pick(rng, kPlaces) + ".";
    case 1:
      return "The " + pick(rng, kPeople) + " " + pick(rng, kVerbsPast) + " " + pick(rng, kThings) + " " +
             pick(rng, kReasons) + ".";
    case 2:
      return "Near the " + pick(rng, kPlaces) + " there was a " + adj + " " + pick(rng, kNouns) +
             " that few people noticed.";
    case 3:
      return pick(rng, kObservations);
    case 4:
      return pick(rng, kTimes) + " the " + pick(rng, kPlaces) + " was " + adj + " and " +
             pick(rng, kAdjectives) + ".";
    default:
      return "A " + adj + " " + pick(rng, kPeople) + " from the " + pick(rng, kPlaces) + " " +
             pick(rng, kVerbsPast) + " " + pick(rng, kThings) + ".";
  }
}

}  // namespace

std::string_view filler_name(Filler f) {
  switch (f) {
    case Filler::kPasskey:
      return "passkey";
    case Filler::kEssay:
      return "essay";
  }
  return "?";
}

std::string FillerStream::sentence(int64_t i) const {
  KVTIER_ASSERT(i >= 0, "sentence {}", i);
  if (filler_ == Filler::kPasskey) {
    return std::string(kPasskeyFiller[static_cast<size_t>(i) % std::size(kPasskeyFiller)]) + " ";
  }
  Rng rng(mix_seed(seed_, {static_cast<uint64_t>(i)}));
  std::string s = essay_sentence(rng);
  s += rng.below(8) == 0 ? "\n\n" : " ";  // paragraphs of about eight sentences
  return s;
}

std::string FillerStream::text(int64_t n) const {
  std::string out;
  for (int64_t i = 0; i < n; ++i) out += sentence(i);
  return out;
}

std::string random_key(Rng& rng) {
  return pick(rng, kAdjectives) + "-" + pick(rng, kNouns);
}

std::string random_word(Rng& rng) {
  std::string w;
  const uint64_t syllables = 2 + rng.below(2);
  for (uint64_t i = 0; i < syllables; ++i) {
    w += pick(rng, kOnsets);
    w += pick(rng, kVowels);
    if (i + 1 == syllables) w += pick(rng, kCodas);
  }
  return w;
}

std::vector<std::string> distinct_words(Rng& rng, size_t n, const std::vector<std::string>& avoid) {
  std::unordered_set<std::string> seen(avoid.begin(), avoid.end());
  std::vector<std::string> out;
  out.reserve(n);
  size_t tries = 0;
  while (out.size() < n) {
    KVTIER_ASSERT(++tries < 100 * n + 1000, "cannot draw {} distinct words", n);
    std::string w = random_word(rng);
    if (seen.insert(w).second) out.push_back(std::move(w));
  }
  return out;
}

std::string random_variable(Rng& rng) {
  std::string v;
  for (int i = 0; i < 5; ++i) v += static_cast<char>('A' + rng.below(26));
  return v;
}

}  // namespace kvtier::eval
