#include <catch2/catch.hpp>

#include <errno.h>
#include <stdio.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

#include "core/log.h"

namespace {
std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

std::string temp_path() {
  char name[] = "/tmp/vf-log-test-XXXXXX";
  const int fd = mkstemp(name);
  close(fd);
  return name;
}
}  // namespace

TEST_CASE("lines below the level are not written, lines at or above are, whole") {
  const std::string path = temp_path();
  REQUIRE(vf::log_configure(vf::LogLevel::kInfo, path).empty());
  VF_LOG_DEBUG("hidden {}", 1);
  VF_LOG_INFO("shown {}", 2);
  VF_LOG_ERROR("also shown");
  const std::string text = read_file(path);
  CHECK(text.find("hidden") == std::string::npos);
  const std::string prefix = "verbs-failover[" + std::to_string(getpid()) + ":";
  CHECK(text.find(prefix) == 0);
  CHECK(text.find("] info: shown 2\n") != std::string::npos);
  CHECK(text.find("] error: also shown\n") != std::string::npos);
  vf::log_reset_for_tests();
  unlink(path.c_str());
}

TEST_CASE("logging never changes errno (it sits between a verb and its caller)") {
  const std::string path = temp_path();
  REQUIRE(vf::log_configure(vf::LogLevel::kTrace, path).empty());
  errno = EAGAIN;
  VF_LOG_ERROR("a line");
  CHECK(errno == EAGAIN);
  vf::log_reset_for_tests();
  unlink(path.c_str());
}

TEST_CASE("an unopenable log file is reported with the variable name and stderr stays in use") {
  const std::string error = vf::log_configure(vf::LogLevel::kWarn, "/nonexistent-dir/x.log");
  CHECK(error.find("VERBS_FAILOVER_LOG_FILE='/nonexistent-dir/x.log' cannot be opened") == 0);
  CHECK(vf::log_fd() == STDERR_FILENO);
  vf::log_reset_for_tests();
}

TEST_CASE("log_enabled is a plain level comparison") {
  vf::log_reset_for_tests();
  CHECK(vf::log_enabled(vf::LogLevel::kWarn));
  CHECK_FALSE(vf::log_enabled(vf::LogLevel::kInfo));
  REQUIRE(vf::log_configure(vf::LogLevel::kTrace, "").empty());
  CHECK(vf::log_enabled(vf::LogLevel::kTrace));
  vf::log_reset_for_tests();
}

TEST_CASE("the log file is created by its first line, not by configuring it") {
  const std::string path = temp_path() + ".d";  // a name no file has yet
  REQUIRE(vf::log_configure(vf::LogLevel::kWarn, path).empty());
  VF_LOG_INFO("below the level: writes nothing");
  CHECK(access(path.c_str(), F_OK) != 0);
  VF_LOG_WARN("first line");
  CHECK(read_file(path).find("] warn: first line\n") != std::string::npos);
  vf::log_reset_for_tests();
  unlink(path.c_str());
}

TEST_CASE("a log file whose directory is not a directory is refused at configure time") {
  const std::string path = temp_path();  // a file: "path/x.log" cannot be created
  const std::string error = vf::log_configure(vf::LogLevel::kWarn, path + "/x.log");
  CHECK(error.find("VERBS_FAILOVER_LOG_FILE='" + path + "/x.log' cannot be opened (Not a directory)") == 0);
  unlink(path.c_str());
  CHECK(vf::log_fd() == STDERR_FILENO);
  vf::log_reset_for_tests();
}
