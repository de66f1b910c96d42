// The stats file as threads of one process write it (core/failover/engine_stats.h): the exit
// handler's write is the last word, whatever the engine's thread writes after it, and each write
// is a whole, valid file. Seen in a fast test under load (failover_unreplayable_opcode): the
// engine's thread and the exit handler wrote one temporary file at once, leaving a stats file
// with a second object's tail after the first, which the test's JSON reader refused.
#include <stdlib.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "core/failover/engine_stats.h"
#include "tests/unit/engine_rig.h"

namespace {

std::string read_whole(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

struct StatsDir {
  std::string path;
  StatsDir() {
    char pattern[] = "/tmp/vf-stats-file-XXXXXX";
    REQUIRE(mkdtemp(pattern) != nullptr);
    path = pattern;
  }
  ~StatsDir() {
    unlink((path + "/stats.json").c_str());
    rmdir(path.c_str());
  }
};

}  // namespace

TEST_CASE("The stats file: nothing is written after the exit handler's write", "[engine]") {
  Rig rig;
  StatsDir dir;
  rig.e->config.stats_file = dir.path + "/stats.json";
  vf::failover::write_stats(*rig.e, "change");
  CHECK(read_whole(rig.e->config.stats_file).find("\"reason\": \"change\"") != std::string::npos);
  vf::failover::write_stats(*rig.e, "exit");
  rig.p->failovers = 5;  // the engine's thread goes on after exit() began
  vf::failover::write_stats(*rig.e, "change");
  const std::string last = read_whole(rig.e->config.stats_file);
  CHECK(last.find("\"reason\": \"exit\"") != std::string::npos);
  CHECK(last.find("\"failovers\": 5") == std::string::npos);
}

TEST_CASE("The stats file: the engine's thread and the exit handler at once leave one whole file",
          "[engine]") {
  Rig rig;
  StatsDir dir;
  rig.e->config.stats_file = dir.path + "/stats.json";
  std::thread engine_thread([&] {
    for (int i = 0; i < 200; ++i) vf::failover::write_stats(*rig.e, "change");
  });
  for (int i = 0; i < 100; ++i) vf::failover::write_stats(*rig.e, "interval");
  vf::failover::write_stats(*rig.e, "exit");
  engine_thread.join();
  const std::string last = read_whole(rig.e->config.stats_file);
  CHECK(last.find("\"reason\": \"exit\"") != std::string::npos);
  // One JSON object: it ends at its first closing brace at the start of a line.
  CHECK(last.find("\n}\n") == last.size() - 3);
}
