#include "tools/ckpt_main.h"

#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>

#include <nlohmann/json.hpp>

#include "edl/base/flags.h"
#include "edl/ckpt/checkpoint_store.h"
#include "edl/ckpt/crc32c.h"

namespace edl::ckpt {
namespace {

constexpr const char* kUsage =
    "usage: edl ckpt ls|verify|export --checkpoint_dir DIR [flags]\n"
    "  ls      list checkpoints (--json for machine-readable output)\n"
    "  verify  check every tensor checksum (--id N, default all); exit 1 on corruption\n"
    "  export  write checkpoint --id N (default latest) as raw files + index.json to --out DIR";

std::string FormatTime(int64_t wall_micros) {
  const std::time_t t = static_cast<std::time_t>(wall_micros / 1000000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string Crc(uint32_t v) {
  char buf[16];
  snprintf(buf, sizeof(buf), "%08x", v);
  return buf;
}

int Fail(const Status& s) {
  std::cerr << "edl ckpt: " << s.ToString() << "\n";
  return 1;
}

int RunLs(CheckpointStore* store, bool json) {
  std::vector<CheckpointMeta> all;
  Status s = store->List(&all);
  if (!s.ok()) return Fail(s);
  if (json) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& m : all) {
      nlohmann::json j = nlohmann::json::parse(m.EncodeJson());
      j.erase("tensors");
      j["bytes"] = m.TotalBytes();
      j["num_tensors"] = m.tensors.size();
      out.push_back(std::move(j));
    }
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  printf("%-6s %-10s %-6s %-10s %-6s %-21s %12s %8s  %s\n", "id", "step", "epoch", "generation",
         "world", "time (UTC)", "bytes", "tensors", "fingerprint");
  for (const auto& m : all) {
    printf("%-6lld %-10lld %-6lld %-10lld %-6d %-21s %12llu %8zu  %s\n",
           static_cast<long long>(m.id), static_cast<long long>(m.step),
           static_cast<long long>(m.epoch), static_cast<long long>(m.generation), m.world_size,
           FormatTime(m.wall_time_micros).c_str(), static_cast<unsigned long long>(m.TotalBytes()),
           m.tensors.size(), m.fingerprint.c_str());
  }
  if (all.empty()) printf("(no checkpoints in %s)\n", store->Describe().c_str());
  return 0;
}

int RunVerify(CheckpointStore* store, int64_t id) {
  std::vector<CheckpointMeta> all;
  Status s = store->List(&all);
  if (!s.ok()) return Fail(s);
  bool any_corrupt = false, found = false;
  for (const auto& m : all) {
    if (id > 0 && m.id != id) continue;
    found = true;
    VerifyReport report;
    s = store->Verify(m.id, &report);
    if (!s.ok()) return Fail(s);
    if (report.corrupt.empty()) {
      printf("checkpoint %lld: OK (%zu tensors, %llu bytes)\n", static_cast<long long>(m.id),
             report.tensors_checked, static_cast<unsigned long long>(report.bytes_checked));
      continue;
    }
    any_corrupt = true;
    printf("checkpoint %lld: CORRUPT (%zu of %zu tensors bad)\n", static_cast<long long>(m.id),
           report.corrupt.size(), m.tensors.size());
    for (const auto& c : report.corrupt) printf("  %s\n", c.c_str());
  }
  if (!found) {
    return Fail(Status::NotFound(id > 0 ? "checkpoint " + std::to_string(id) + " is not in " +
                                              store->Describe()
                                        : store->Describe() + " holds no checkpoint"));
  }
  return any_corrupt ? 1 : 0;
}

// Writes one tensor's bytes to `path`.
Status WriteFile(const std::string& path, const uint8_t* data, uint64_t bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  out.close();
  if (!out) return Status::IOError("cannot write " + path + "; check --out and free space");
  return Status::OK();
}

int RunExport(CheckpointStore* store, int64_t id, const std::string& out_dir) {
  if (out_dir.empty()) return Fail(Status::InvalidArgument("export needs --out DIR"));
  if (id <= 0) {
    std::vector<CheckpointMeta> all;
    Status s = store->List(&all);
    if (!s.ok()) return Fail(s);
    if (all.empty()) return Fail(Status::NotFound(store->Describe() + " holds no checkpoint"));
    id = all.back().id;
  }
  LoadedCheckpoint ckpt;
  Status s = store->Read(id, &ckpt);
  if (!s.ok()) return Fail(s);
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) return Fail(Status::IOError("cannot create " + out_dir + ": " + ec.message()));
  nlohmann::json index = nlohmann::json::parse(ckpt.meta.EncodeJson());
  nlohmann::json tensors = nlohmann::json::array();
  for (size_t i = 0; i < ckpt.meta.tensors.size(); ++i) {
    const TensorRecord& t = ckpt.meta.tensors[i];
    std::string file = t.name;
    for (char& c : file) {
      if (c == '/' || c == '\\' || c == ' ') c = '_';
    }
    file = std::to_string(i) + "-" + file + ".bin";
    s = WriteFile(out_dir + "/" + file, ckpt.data[i].get(), t.bytes);
    if (!s.ok()) return Fail(s);
    tensors.push_back({{"name", t.name},
                       {"dtype", DataTypeName(t.dtype)},
                       {"shape", t.shape},
                       {"bytes", t.bytes},
                       {"file", file},
                       {"crc32c", Crc(t.crc32c)}});
  }
  index["tensors"] = std::move(tensors);
  index["byte_order"] = "little";
  index["checksum"] = "crc32c (Castagnoli) of the file's bytes, hex";
  std::ofstream out(out_dir + "/index.json");
  out << index.dump(2) << "\n";
  out.close();
  if (!out) return Fail(Status::IOError("cannot write " + out_dir + "/index.json"));
  printf("exported checkpoint %lld (%zu tensors, %llu bytes) to %s\n", static_cast<long long>(id),
         ckpt.meta.tensors.size(), static_cast<unsigned long long>(ckpt.meta.TotalBytes()),
         out_dir.c_str());
  return 0;
}

}  // namespace

int RunCkptMain(int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') {
    const bool help = argc >= 2 && std::strcmp(argv[1], "--help") == 0;
    (help ? std::cout : std::cerr) << kUsage << "\n";
    return help ? 0 : 2;
  }
  const std::string action = argv[1];
  if (action != "ls" && action != "verify" && action != "export") {
    std::cerr << "edl ckpt: unknown action '" << action << "'\n" << kUsage << "\n";
    return 2;
  }
  std::string dir, out_dir;
  int64_t id = 0;
  bool json = false;
  po::options_description desc("checkpoint store");
  desc.add_options()("checkpoint_dir", po::value<std::string>(&dir)->required(),
                     "directory of the checkpoint store")(
      "id", po::value<int64_t>(&id)->default_value(0),
      "checkpoint id (verify: default every one; export: default the latest)")(
      "out", po::value<std::string>(&out_dir), "export: output directory")(
      "json", po::bool_switch(&json), "ls: print JSON");
  ParsedFlags flags;
  Status s = ParseFlags("ckpt " + action, kUsage, desc, argc - 1, argv + 1, &flags);
  if (!s.ok()) {
    std::cerr << "edl ckpt: " << s.ToString() << "\n";
    return 2;
  }
  if (flags.help) return 0;
  RocksDbStoreOptions options;
  options.dir = dir;
  std::unique_ptr<CheckpointStore> store = OpenRocksDbStore(options);
  if (action == "ls") return RunLs(store.get(), json);
  if (action == "verify") return RunVerify(store.get(), id);
  return RunExport(store.get(), id, out_dir);
}

}  // namespace edl::ckpt
