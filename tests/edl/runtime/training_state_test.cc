// TrainingState's two encodings (edl/runtime/training_state.h): every field round-trips through the
// state-sync header and through the checkpoint metadata, including the store's own JSON.
#include "edl/runtime/training_state.h"

#include <cstring>
#include <set>
#include <string>
#include <type_traits>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/testutil.h"

namespace edl::runtime {
namespace {

// A state whose every field (as ForEachTrainingStateField lists them) holds a distinct value that
// is neither 0 nor a default, doubles with a fraction that binary floating point cannot round to.
TrainingState Distinct(int salt = 0) {
  TrainingState s;
  int i = 1 + salt;
  ForEachTrainingStateField(s, [&i](const char*, auto& field) {
    using T = std::remove_reference_t<decltype(field)>;
    if constexpr (std::is_integral_v<T>) {
      field = 1000003 * i;
    } else {
      field = 0.1 * i + 1e-13;
    }
    ++i;
  });
  return s;
}

// Each field in turn differs from `s` (so a codec dropping one field cannot pass by accident).
std::vector<TrainingState> OneFieldChanged(const TrainingState& s) {
  std::vector<TrainingState> out;
  for (size_t k = 0; k < TrainingStateFieldCount(); ++k) {
    TrainingState c = s;
    size_t i = 0;
    ForEachTrainingStateField(c, [&](const char*, auto& field) {
      if (i++ == k) field = field + 7;
    });
    out.push_back(c);
  }
  return out;
}

TEST(TrainingStateTest, FieldListCoversTheStructWithUniqueNames) {
  TrainingState s;
  std::set<std::string> names;
  ForEachTrainingStateField(s, [&](const char* name, auto&) { names.insert(name); });
  EXPECT_EQ(names.size(), TrainingStateFieldCount());
  EXPECT_EQ(sizeof(TrainingState), 8 * TrainingStateFieldCount());
  for (const TrainingState& c : OneFieldChanged(Distinct())) EXPECT_NE(c, Distinct());
}

TEST(TrainingStateTest, EveryFieldRoundTripsThroughTheSyncHeader) {
  for (const TrainingState& want : OneFieldChanged(Distinct())) {
    const SyncHeader h = EncodeSyncHeader(want);
    TrainingState got;
    ASSERT_OK(DecodeSyncHeader(h, "rank 0", &got));
    EXPECT_EQ(got, want);
  }
}

TEST(TrainingStateTest, GarbledSyncHeaderIsCorruption) {
  SyncHeader h = EncodeSyncHeader(Distinct());
  h[0] ^= 0xff;
  TrainingState got = Distinct(5);
  Status s = DecodeSyncHeader(h, "rank 3", &got);
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  EXPECT_NE(s.ToString().find("rank 3"), std::string::npos) << s.ToString();
  EXPECT_EQ(got, Distinct(5)) << "a failed decode leaves the state alone";
  h = EncodeSyncHeader(Distinct());
  h[8] ^= 1;  // field count of another build
  EXPECT_TRUE(DecodeSyncHeader(h, "rank 3", &got).IsCorruption());
}

TEST(TrainingStateTest, EveryFieldRoundTripsThroughCheckpointMetadata) {
  for (const TrainingState& want : OneFieldChanged(Distinct())) {
    ckpt::CheckpointMeta meta;
    meta.id = 4;
    meta.generation = 9;
    EncodeCheckpointMeta(want, &meta);
    EXPECT_EQ(meta.step, want.step);
    EXPECT_EQ(meta.epoch, want.position.epoch);
    EXPECT_EQ(meta.cursor, want.position.cursor);
    // Through the store's own metadata JSON, as a saved checkpoint would be.
    ckpt::CheckpointMeta stored;
    ASSERT_OK(ckpt::CheckpointMeta::DecodeJson(meta.EncodeJson(), &stored));
    TrainingState got;
    ASSERT_OK(DecodeCheckpointMeta(stored, &got));
    EXPECT_EQ(got, want);
  }
}

TEST(TrainingStateTest, CheckpointMissingAFieldNamesIt) {
  ckpt::CheckpointMeta meta;
  meta.id = 12;
  EncodeCheckpointMeta(Distinct(), &meta);
  TrainingState probe;
  ForEachTrainingStateField(probe, [&](const char* name, auto&) {
    nlohmann::json extra = nlohmann::json::parse(meta.extra_json);
    extra["training_state"].erase(name);
    ckpt::CheckpointMeta m = meta;
    m.extra_json = extra.dump();
    TrainingState got = Distinct(3);
    Status s = DecodeCheckpointMeta(m, &got);
    EXPECT_TRUE(s.IsCorruption()) << name << ": " << s.ToString();
    EXPECT_NE(s.ToString().find(name), std::string::npos) << s.ToString();
    EXPECT_NE(s.ToString().find("checkpoint 12"), std::string::npos) << s.ToString();
    EXPECT_EQ(got, Distinct(3));
  });
}

TEST(TrainingStateTest, CheckpointWithoutTrainingStateOrDisagreeingIsCorruption) {
  ckpt::CheckpointMeta meta;
  EncodeCheckpointMeta(Distinct(), &meta);
  TrainingState got;
  ckpt::CheckpointMeta old = meta;
  old.extra_json = R"({"last_lr":0.1})";  // the layout before the training state had one codec
  Status s = DecodeCheckpointMeta(old, &got);
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  EXPECT_NE(s.ToString().find("--checkpoint_dir"), std::string::npos) << s.ToString();
  ckpt::CheckpointMeta moved = meta;
  moved.cursor += 1;  // the store's column and the training state disagree
  EXPECT_TRUE(DecodeCheckpointMeta(moved, &got).IsCorruption());
  ckpt::CheckpointMeta typed = meta;
  nlohmann::json extra = nlohmann::json::parse(meta.extra_json);
  extra["training_state"]["step"] = "12";
  typed.extra_json = extra.dump();
  EXPECT_TRUE(DecodeCheckpointMeta(typed, &got).IsCorruption());
}

}  // namespace
}  // namespace edl::runtime
