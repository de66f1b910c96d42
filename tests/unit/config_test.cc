#include <catch2/catch.hpp>

#include <map>

#include "core/config.h"

namespace {

vf::ConfigResult parse(const std::map<std::string, std::string>& env, int pid = 4242) {
  return vf::parse_config(
      [&](std::string_view name) -> std::optional<std::string> {
        auto it = env.find(std::string(name));
        if (it == env.end()) return std::nullopt;
        return it->second;
      },
      pid);
}

}  // namespace

TEST_CASE("defaults: active, warn level, stderr, no backtrace") {
  const auto result = parse({});
  CHECK(result.problems.empty());
  CHECK(result.config.enabled);
  CHECK(result.config.log_level == vf::LogLevel::kWarn);
  CHECK(result.config.log_file.empty());
  CHECK_FALSE(result.config.backtrace);
}

TEST_CASE("every log level is accepted, in any case") {
  CHECK(parse({{"VERBS_FAILOVER_LOG", "error"}}).config.log_level == vf::LogLevel::kError);
  CHECK(parse({{"VERBS_FAILOVER_LOG", "warn"}}).config.log_level == vf::LogLevel::kWarn);
  CHECK(parse({{"VERBS_FAILOVER_LOG", "INFO"}}).config.log_level == vf::LogLevel::kInfo);
  CHECK(parse({{"VERBS_FAILOVER_LOG", "Debug"}}).config.log_level == vf::LogLevel::kDebug);
  CHECK(parse({{"VERBS_FAILOVER_LOG", "trace"}}).config.log_level == vf::LogLevel::kTrace);
}

TEST_CASE("an unknown log level names the variable and the accepted values, keeps the default") {
  const auto result = parse({{"VERBS_FAILOVER_LOG", "verbose"}});
  REQUIRE(result.problems.size() == 1);
  CHECK(result.problems[0] ==
        "VERBS_FAILOVER_LOG='verbose' is not a log level; accepted values: "
        "error|warn|info|debug|trace; using warn");
  CHECK(result.config.log_level == vf::LogLevel::kWarn);
}

TEST_CASE("VERBS_FAILOVER=0 disables the hooks; junk is reported and ignored") {
  CHECK_FALSE(parse({{"VERBS_FAILOVER", "0"}}).config.enabled);
  CHECK_FALSE(parse({{"VERBS_FAILOVER", "off"}}).config.enabled);
  CHECK(parse({{"VERBS_FAILOVER", "1"}}).config.enabled);
  const auto result = parse({{"VERBS_FAILOVER", "maybe"}});
  REQUIRE(result.problems.size() == 1);
  CHECK(result.problems[0].rfind("VERBS_FAILOVER='maybe' is not understood", 0) == 0);
  CHECK(result.config.enabled);
}

TEST_CASE("log file path expands %p to the pid and %% to a percent sign") {
  CHECK(parse({{"VERBS_FAILOVER_LOG_FILE", "/tmp/vf-%p.log"}}, 77).config.log_file ==
        "/tmp/vf-77.log");
  CHECK(vf::expand_path_pattern("a%%p-%p-%", 5) == "a%p-5-%");
  CHECK(vf::expand_path_pattern("%q", 5) == "%q");
}

TEST_CASE("an empty log file setting is reported and logging stays on stderr") {
  const auto result = parse({{"VERBS_FAILOVER_LOG_FILE", ""}});
  REQUIRE(result.problems.size() == 1);
  CHECK(result.problems[0].find("VERBS_FAILOVER_LOG_FILE is set but empty") == 0);
  CHECK(result.config.log_file.empty());
}

TEST_CASE("backtrace switch") {
  CHECK(parse({{"VERBS_FAILOVER_BACKTRACE", "1"}}).config.backtrace);
  CHECK_FALSE(parse({{"VERBS_FAILOVER_BACKTRACE", "no"}}).config.backtrace);
  CHECK(parse({{"VERBS_FAILOVER_BACKTRACE", "2"}}).problems.size() == 1);
}
