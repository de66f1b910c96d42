#include <catch2/catch.hpp>

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "core/stats.h"

namespace {

vf::StatsSnapshot sample_snapshot() {
  vf::StatsSnapshot snapshot;
  snapshot.pid = 1234;
  snapshot.program = "ib_write_bw";
  snapshot.reason = "exit";
  snapshot.written_unix_ms = 1764680000000;
  snapshot.devices.push_back({"rxe0", 1, "DOWN", "rxe1/1", 1, 1});
  vf::QpStats qp;
  qp.qpn = 17;
  qp.device = "rxe0/1";
  qp.backup = "rxe1/1";
  qp.peer = "other_process";
  qp.is_protected = true;
  qp.path = "standby";
  qp.state = "standby";
  qp.failovers = 1;
  qp.replayed_wrs = 3;
  qp.hidden_error_completions = 5;
  qp.synthesized_completions = 1;
  qp.standby_probes = 42;
  qp.standby_probe_failures = 2;
  qp.events.push_back({"failover", "port_down", "primary", "standby", 1764680000000000000ull,
                       1764680000012000000ull, 3});
  snapshot.qps.push_back(qp);
  vf::QpStats unprotected;
  unprotected.qpn = 18;
  unprotected.device = "rxe0/1";
  unprotected.path = "primary";
  unprotected.state = "unprotected";
  unprotected.unprotected_reason = "no backup device";
  snapshot.qps.push_back(unprotected);
  return snapshot;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

std::vector<std::string> list_directory(const std::string& path) {
  std::vector<std::string> names;
  if (DIR* dir = opendir(path.c_str())) {
    while (dirent* entry = readdir(dir)) {
      const std::string name = entry->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    closedir(dir);
  }
  std::sort(names.begin(), names.end());
  return names;
}

struct TempDir {
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string pattern = std::string(base && *base ? base : "/tmp") + "/vf-stats-test-XXXXXX";
    REQUIRE(mkdtemp(pattern.data()) != nullptr);
    path = pattern;
  }
  ~TempDir() {
    for (const auto& name : list_directory(path)) {
      const std::string child = path + "/" + name;
      if (rmdir(child.c_str()) != 0) unlink(child.c_str());
    }
    rmdir(path.c_str());
  }
  std::string path;
};

}  // namespace

TEST_CASE("stats JSON: the exact layout, totals computed from QPs and devices") {
  const std::string expected = R"({
  "pid": 1234,
  "program": "ib_write_bw",
  "reason": "exit",
  "written_unix_ms": 1764680000000,
  "totals": {"qps": 2, "protected_qps": 1, "unprotected_qps": 1, "failovers": 1, "failbacks": 0, "replayed_wrs": 3, "hidden_error_completions": 5, "hidden_async_events": 1, "synthesized_completions": 1},
  "devices": [
    {"name": "rxe0", "port": 1, "state": "DOWN", "backup": "rxe1/1", "port_changes": 1, "hidden_async_events": 1}
  ],
  "qps": [
    {"qpn": 17, "device": "rxe0/1", "backup": "rxe1/1", "peer": "other_process", "protected": true, "path": "standby", "state": "standby", "unprotected_reason": "", "failovers": 1, "failbacks": 0, "replayed_wrs": 3, "hidden_error_completions": 5, "hidden_async_events": 0, "synthesized_completions": 1, "standby_probes": 42, "standby_probe_failures": 2,
     "events": [{"kind": "failover", "reason": "port_down", "from": "primary", "to": "standby", "detected_unix_ns": 1764680000000000000, "resumed_unix_ns": 1764680000012000000, "ms": 12.000, "replayed_wrs": 3}]},
    {"qpn": 18, "device": "rxe0/1", "backup": null, "peer": null, "protected": false, "path": "primary", "state": "unprotected", "unprotected_reason": "no backup device", "failovers": 0, "failbacks": 0, "replayed_wrs": 0, "hidden_error_completions": 0, "hidden_async_events": 0, "synthesized_completions": 0, "standby_probes": 0, "standby_probe_failures": 0,
     "events": []}
  ]
}
)";
  CHECK(vf::render_stats_json(sample_snapshot()) == expected);
}

TEST_CASE("stats JSON: an empty snapshot") {
  vf::StatsSnapshot snapshot;
  snapshot.pid = 7;
  snapshot.program = "x";
  snapshot.reason = "interval";
  snapshot.written_unix_ms = 5;
  CHECK(vf::render_stats_json(snapshot) == R"({
  "pid": 7,
  "program": "x",
  "reason": "interval",
  "written_unix_ms": 5,
  "totals": {"qps": 0, "protected_qps": 0, "unprotected_qps": 0, "failovers": 0, "failbacks": 0, "replayed_wrs": 0, "hidden_error_completions": 0, "hidden_async_events": 0, "synthesized_completions": 0},
  "devices": [],
  "qps": []
}
)");
}

TEST_CASE("stats JSON: totals sum every QP, hidden async events add devices and QPs") {
  auto snapshot = sample_snapshot();
  snapshot.devices.push_back({"rxe1", 1, "ACTIVE", std::nullopt, 0, 4});
  snapshot.qps[1].failbacks = 2;
  snapshot.qps[1].hidden_async_events = 10;
  snapshot.qps[1].replayed_wrs = 4;
  const std::string json = vf::render_stats_json(snapshot);
  CHECK(json.find("\"totals\": {\"qps\": 2, \"protected_qps\": 1, \"unprotected_qps\": 1, "
                  "\"failovers\": 1, \"failbacks\": 2, \"replayed_wrs\": 7, "
                  "\"hidden_error_completions\": 5, \"hidden_async_events\": 15, "
                  "\"synthesized_completions\": 1}") != std::string::npos);
  CHECK(json.find("{\"name\": \"rxe1\", \"port\": 1, \"state\": \"ACTIVE\", \"backup\": null, "
                  "\"port_changes\": 0, \"hidden_async_events\": 4}\n  ],") != std::string::npos);
}

TEST_CASE("stats JSON: switch durations") {
  auto snapshot = sample_snapshot();
  auto& events = snapshot.qps[0].events;
  const auto ms_of = [&](std::uint64_t detected, std::uint64_t resumed) {
    events[0].detected_unix_ns = detected;
    events[0].resumed_unix_ns = resumed;
    const std::string json = vf::render_stats_json(snapshot);
    const auto start = json.find("\"ms\": ") + 6;
    return json.substr(start, json.find(',', start) - start);
  };
  CHECK(ms_of(1000, 0) == "null");  // not resumed yet
  CHECK(ms_of(1000, 1000) == "0.000");
  CHECK(ms_of(0, 1234567) == "1.235");  // rounded to the microsecond
  CHECK(ms_of(0, 1234499) == "1.234");
  CHECK(ms_of(1, 2500000001) == "2500.000");
  CHECK(ms_of(3000000, 1000000) == "-2.000");  // the wall clock stepped back
  events[0].resumed_unix_ns = 0;
  CHECK(vf::render_stats_json(snapshot).find("\"resumed_unix_ns\": 0, \"ms\": null,") !=
        std::string::npos);
}

TEST_CASE("stats JSON: several events on one QP") {
  auto snapshot = sample_snapshot();
  snapshot.qps[0].events.push_back({"failback", "failback", "standby", "primary", 10, 0, 0});
  const std::string json = vf::render_stats_json(snapshot);
  CHECK(json.find("\"replayed_wrs\": 3}, {\"kind\": \"failback\", \"reason\": \"failback\", "
                  "\"from\": \"standby\", \"to\": \"primary\", \"detected_unix_ns\": 10, "
                  "\"resumed_unix_ns\": 0, \"ms\": null, \"replayed_wrs\": 0}]},\n") !=
        std::string::npos);
}

TEST_CASE("JSON strings escape quotes, backslashes, control characters and bad UTF-8") {
  CHECK(vf::json_quote("") == "\"\"");
  CHECK(vf::json_quote("plain /path") == "\"plain /path\"");
  CHECK(vf::json_quote("a\"b\\c") == R"("a\"b\\c")");
  CHECK(vf::json_quote("\n\r\t\b\f") == R"("\n\r\t\b\f")");
  CHECK(vf::json_quote(std::string_view("\x00\x01\x1f\x7f", 4)) == "\"\\u0000\\u0001\\u001f\x7f\"");
  CHECK(vf::json_quote("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80") ==
        "\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\"");  // valid UTF-8 passes through
  CHECK(vf::json_quote("\xff") == R"("\ufffd")");
  CHECK(vf::json_quote("a\xc3") == R"("a\ufffd")");                  // truncated sequence
  CHECK(vf::json_quote("\xc0\xaf") == R"("\ufffd\ufffd")");          // overlong '/'
  CHECK(vf::json_quote("\xed\xa0\x80") == R"("\ufffd\ufffd\ufffd")");  // a surrogate
  CHECK(vf::json_quote("\xf4\x90\x80\x80") == R"("\ufffd\ufffd\ufffd\ufffd")");  // > U+10FFFF

  auto snapshot = sample_snapshot();
  snapshot.program = "my \"prog\"\\\n";
  snapshot.qps[1].unprotected_reason = "tab\there";
  snapshot.qps[1].backup = "we\"ird";
  const std::string json = vf::render_stats_json(snapshot);
  CHECK(json.find(R"("program": "my \"prog\"\\\n",)") != std::string::npos);
  CHECK(json.find(R"("unprotected_reason": "tab\there")") != std::string::npos);
  CHECK(json.find(R"("backup": "we\"ird")") != std::string::npos);
}

TEST_CASE("the atomic writer replaces the file and leaves no temporary behind") {
  TempDir dir;
  const std::string path = dir.path + "/stats.json";
  std::string error;
  REQUIRE(vf::write_file_atomically(path, "first\n", error));
  CHECK(error.empty());
  CHECK(read_file(path) == "first\n");
  REQUIRE(vf::write_file_atomically(path, "second, longer\n", error));
  CHECK(read_file(path) == "second, longer\n");
  REQUIRE(vf::write_file_atomically(path, "", error));
  CHECK(read_file(path).empty());
  const std::string big(1 << 20, 'x');
  REQUIRE(vf::write_file_atomically(path, big, error));
  CHECK(read_file(path) == big);
  CHECK(list_directory(dir.path) == std::vector<std::string>{"stats.json"});
  struct stat info {};
  REQUIRE(stat(path.c_str(), &info) == 0);
  CHECK((info.st_mode & 0777) == (0644 & ~[] {
          const mode_t mask = umask(0);
          umask(mask);
          return mask;
        }()));
}

// Two threads of one process write the same stats file (the engine's thread on a change, the
// exit handler on the main thread): each write is whole, never two mixed in one file. Seen in
// a fast test under load: a stats file with a second JSON object's tail after the first one.
TEST_CASE("the atomic writer: concurrent writers of one path never leave a mixed file") {
  TempDir dir;
  const std::string path = dir.path + "/stats.json";
  const std::string shorter(3000, 'a');
  const std::string longer(9000, 'b');
  constexpr int kWrites = 300;
  bool ok[2] = {true, true};
  const auto writer = [&](int which) {
    std::string error;
    for (int i = 0; i < kWrites; ++i) {
      ok[which] = vf::write_file_atomically(path, which == 0 ? shorter : longer, error) && ok[which];
    }
  };
  std::thread first(writer, 0);
  std::thread second(writer, 1);
  int mixed = 0;
  for (int i = 0; i < kWrites; ++i) {
    const std::string now = read_file(path);
    if (!now.empty() && now != shorter && now != longer) ++mixed;
  }
  first.join();
  second.join();
  CHECK(ok[0]);
  CHECK(ok[1]);
  CHECK(mixed == 0);
  const std::string last = read_file(path);
  CHECK((last == shorter || last == longer));
  CHECK(list_directory(dir.path) == std::vector<std::string>{"stats.json"});
}

TEST_CASE("the atomic writer reports the path and the system error") {
  TempDir dir;
  std::string error;
  const std::string pid = std::to_string(getpid());

  SECTION("a directory that does not exist") {
    const std::string path = dir.path + "/missing/stats.json";
    CHECK_FALSE(vf::write_file_atomically(path, "x", error));
    CHECK(error.rfind("cannot create " + path + ".tmp." + pid + ".", 0) == 0);
    CHECK(error.find(": No such file or directory") != std::string::npos);
  }
  SECTION("the target is a directory: rename fails, the temporary is removed") {
    const std::string path = dir.path + "/taken";
    REQUIRE(mkdir(path.c_str(), 0755) == 0);
    CHECK_FALSE(vf::write_file_atomically(path, "x", error));
    CHECK(error.rfind("cannot rename " + path + ".tmp." + pid + ".", 0) == 0);
    CHECK(error.find(" to " + path + ": ") != std::string::npos);
    CHECK(list_directory(dir.path) == std::vector<std::string>{"taken"});
  }
  SECTION("a directory without write permission") {
    const std::string locked = dir.path + "/locked";
    REQUIRE(mkdir(locked.c_str(), 0500) == 0);
    const std::string path = locked + "/stats.json";
    if (geteuid() == 0) {
      // root writes anyway; use a path whose parent is a regular file instead
      const std::string file = dir.path + "/file";
      REQUIRE(vf::write_file_atomically(file, "x", error));
      CHECK_FALSE(vf::write_file_atomically(file + "/stats.json", "x", error));
      CHECK(error.rfind("cannot create " + file + "/stats.json.tmp." + pid + ".", 0) == 0);
      CHECK(error.find(": Not a directory") != std::string::npos);
      rmdir(locked.c_str());
      unlink(file.c_str());
    } else {
      CHECK_FALSE(vf::write_file_atomically(path, "x", error));
      CHECK(error.rfind("cannot create " + path + ".tmp." + pid + ".", 0) == 0);
      CHECK(error.find(": Permission denied") != std::string::npos);
      CHECK(list_directory(locked).empty());
    }
  }
}
