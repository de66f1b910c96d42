#include <catch2/catch.hpp>

#include <fmt/format.h>

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

TEST_CASE("VERBS_FAILOVER=0 disables the hooks, junk is reported and ignored") {
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

TEST_CASE("failover settings: defaults") {
  const auto result = parse({});
  CHECK(result.problems.empty());
  CHECK(result.config.pairs.empty());
  CHECK(result.config.stats_file.empty());
  CHECK(result.config.stats_interval_s == 0);
  CHECK(result.config.qp_timeout == 14);
  CHECK(result.config.ctrl_port_first == 18600);
  CHECK(result.config.ctrl_port_last == 18615);
  CHECK(result.config.ctrl_peer_addresses.empty());
  CHECK(result.config.failback);
}

TEST_CASE("VERBS_FAILOVER_PAIRS is kept raw for device_pairs to parse") {
  const auto result = parse({{"VERBS_FAILOVER_PAIRS", "mlx5_0:mlx5_1, junk;;"}});
  CHECK(result.problems.empty());
  CHECK(result.config.pairs == "mlx5_0:mlx5_1, junk;;");
}

TEST_CASE("VERBS_FAILOVER_STATS: a path with %p expanded, empty is reported") {
  CHECK(parse({{"VERBS_FAILOVER_STATS", "/tmp/vf-stats-%p.json"}}, 99).config.stats_file ==
        "/tmp/vf-stats-99.json");
  const auto result = parse({{"VERBS_FAILOVER_STATS", ""}});
  REQUIRE(result.problems.size() == 1);
  CHECK(result.problems[0] ==
        "VERBS_FAILOVER_STATS is set but empty; accepted values: a file path (%p = pid); writing "
        "no stats file");
  CHECK(result.config.stats_file.empty());
}

TEST_CASE("VERBS_FAILOVER_STATS_INTERVAL: decimal seconds above 0, at most 86400") {
  CHECK(parse({{"VERBS_FAILOVER_STATS_INTERVAL", "10"}}).config.stats_interval_s == 10.0);
  CHECK(parse({{"VERBS_FAILOVER_STATS_INTERVAL", "0.5"}}).config.stats_interval_s == 0.5);
  CHECK(parse({{"VERBS_FAILOVER_STATS_INTERVAL", "86400"}}).config.stats_interval_s == 86400.0);
  CHECK(parse({{"VERBS_FAILOVER_STATS_INTERVAL", "0.001"}}).problems.empty());
  for (const char* bad : {"0", "0.0", "-1", "86400.5", "1e3", "ten", "", ".", "1.2.3", " 5", "5s",
                          "inf", "nan", "0x10"}) {
    INFO(bad);
    const auto result = parse({{"VERBS_FAILOVER_STATS_INTERVAL", bad}});
    REQUIRE(result.problems.size() == 1);
    CHECK(result.config.stats_interval_s == 0);
  }
  CHECK(parse({{"VERBS_FAILOVER_STATS_INTERVAL", "-2"}}).problems[0] ==
        "VERBS_FAILOVER_STATS_INTERVAL='-2' is not an interval; accepted values: seconds, a "
        "decimal number > 0 and <= 86400 (e.g. 0.5 or 10); using 0 (stats written at exit only)");
}

TEST_CASE("VERBS_FAILOVER_QP_TIMEOUT: an integer 1..31") {
  CHECK(parse({{"VERBS_FAILOVER_QP_TIMEOUT", "1"}}).config.qp_timeout == 1);
  CHECK(parse({{"VERBS_FAILOVER_QP_TIMEOUT", "17"}}).config.qp_timeout == 17);
  CHECK(parse({{"VERBS_FAILOVER_QP_TIMEOUT", "31"}}).config.qp_timeout == 31);
  for (const char* bad : {"0", "32", "-1", "14.0", "", "fast", "99999999999999999999", "+5"}) {
    INFO(bad);
    const auto result = parse({{"VERBS_FAILOVER_QP_TIMEOUT", bad}});
    REQUIRE(result.problems.size() == 1);
    CHECK(result.config.qp_timeout == 14);
  }
  CHECK(parse({{"VERBS_FAILOVER_QP_TIMEOUT", "40"}}).problems[0] ==
        "VERBS_FAILOVER_QP_TIMEOUT='40' is not a transport timeout exponent; accepted values: an "
        "integer 1-31 (4.096 us * 2^n); using 14");
}

TEST_CASE("VERBS_FAILOVER_CTRL_ADDRS: ports and peer addresses") {
  SECTION("one port") {
    const auto result = parse({{"VERBS_FAILOVER_CTRL_ADDRS", "18600"}});
    CHECK(result.problems.empty());
    CHECK(result.config.ctrl_port_first == 18600);
    CHECK(result.config.ctrl_port_last == 18600);
    CHECK(result.config.ctrl_peer_addresses.empty());
  }
  SECTION("a range") {
    const auto result = parse({{"VERBS_FAILOVER_CTRL_ADDRS", "18600-18607"}});
    CHECK(result.problems.empty());
    CHECK(result.config.ctrl_port_first == 18600);
    CHECK(result.config.ctrl_port_last == 18607);
  }
  SECTION("a range and addresses") {
    const auto result = parse({{"VERBS_FAILOVER_CTRL_ADDRS", "18600-18607@10.0.0.1,10.0.0.2"}});
    CHECK(result.problems.empty());
    CHECK(result.config.ctrl_port_first == 18600);
    CHECK(result.config.ctrl_port_last == 18607);
    CHECK(result.config.ctrl_peer_addresses == std::vector<std::string>{"10.0.0.1", "10.0.0.2"});
  }
  SECTION("addresses only keep the default ports") {
    const auto result = parse({{"VERBS_FAILOVER_CTRL_ADDRS", "@10.0.0.1"}});
    CHECK(result.problems.empty());
    CHECK(result.config.ctrl_port_first == 18600);
    CHECK(result.config.ctrl_port_last == 18615);
    CHECK(result.config.ctrl_peer_addresses == std::vector<std::string>{"10.0.0.1"});
  }
  SECTION("edges: port 1, port 65535, a range of exactly 1024") {
    CHECK(parse({{"VERBS_FAILOVER_CTRL_ADDRS", "1"}}).problems.empty());
    CHECK(parse({{"VERBS_FAILOVER_CTRL_ADDRS", "65535"}}).config.ctrl_port_last == 65535);
    const auto result = parse({{"VERBS_FAILOVER_CTRL_ADDRS", "1000-2023"}});
    CHECK(result.problems.empty());
    CHECK(result.config.ctrl_port_last == 2023);
  }
  SECTION("errors name the variable, the bad part and the syntax; defaults are kept") {
    const std::vector<std::pair<const char*, const char*>> cases = {
        {"0", "port '0' is not a number in 1-65535"},
        {"65536", "port '65536' is not a number in 1-65535"},
        {"abc", "port 'abc' is not a number in 1-65535"},
        {"18600-", "port '' is not a number in 1-65535"},
        {"-18600", "port '' is not a number in 1-65535"},
        {"18600-18500", "port range '18600-18500' ends before it starts"},
        {"1000-2024", "port range '1000-2024' spans 1025 ports (at most 1024)"},
        {"18600@", "'@' is not followed by an address"},
        {"@10.0.0", "address '10.0.0' is not a dotted IPv4 address"},
        {"@10.0.0.1,", "address '' is not a dotted IPv4 address"},
        {"@10.0.0.1,,10.0.0.2", "address '' is not a dotted IPv4 address"},
        {"@10.0.0.256", "address '10.0.0.256' is not a dotted IPv4 address"},
        {"@fe80::1", "address 'fe80::1' is not a dotted IPv4 address"},
        {"18600@10.0.0.1@10.0.0.2", "address '10.0.0.1@10.0.0.2' is not a dotted IPv4 address"},
    };
    for (const auto& [value, reason] : cases) {
      INFO(value);
      const auto result = parse({{"VERBS_FAILOVER_CTRL_ADDRS", value}});
      REQUIRE(result.problems.size() == 1);
      CHECK(result.problems[0] ==
            fmt::format("VERBS_FAILOVER_CTRL_ADDRS='{}' is not understood: {}; accepted values: "
                        "[PORT|FIRST-LAST][@ADDR[,ADDR...]] (ports 1-65535, at most 1024 in a "
                        "range; ADDR a dotted IPv4 address); using ports 18600-18615 and no peer "
                        "addresses",
                        value, reason));
      CHECK(result.config.ctrl_port_first == 18600);
      CHECK(result.config.ctrl_port_last == 18615);
      CHECK(result.config.ctrl_peer_addresses.empty());
    }
  }
}

TEST_CASE("VERBS_FAILOVER_FAILBACK switch") {
  CHECK_FALSE(parse({{"VERBS_FAILOVER_FAILBACK", "0"}}).config.failback);
  CHECK(parse({{"VERBS_FAILOVER_FAILBACK", "yes"}}).config.failback);
  const auto result = parse({{"VERBS_FAILOVER_FAILBACK", "sometimes"}});
  REQUIRE(result.problems.size() == 1);
  CHECK(result.problems[0] ==
        "VERBS_FAILOVER_FAILBACK='sometimes' is not understood; accepted values: "
        "1|0|on|off|yes|no|true|false; using 1");
  CHECK(result.config.failback);
}

TEST_CASE("VERBS_FAILOVER_PORT_STABLE_MS") {
  CHECK(parse({}).config.port_stable_ms == vf::Config::kDefaultPortStableMs);
  CHECK(parse({{"VERBS_FAILOVER_PORT_STABLE_MS", "0"}}).config.port_stable_ms == 0);
  CHECK(parse({{"VERBS_FAILOVER_PORT_STABLE_MS", "15000"}}).config.port_stable_ms == 15000);
  const auto result = parse({{"VERBS_FAILOVER_PORT_STABLE_MS", "2s"}});
  CHECK(result.config.port_stable_ms == vf::Config::kDefaultPortStableMs);
  REQUIRE(result.problems.size() == 1);
  CHECK(result.problems[0] ==
        "VERBS_FAILOVER_PORT_STABLE_MS='2s' is not a duration; accepted values: milliseconds, an "
        "integer 0-600000; using 2000");
  CHECK(parse({{"VERBS_FAILOVER_PORT_STABLE_MS", "600001"}}).problems.size() == 1);
}

TEST_CASE("VERBS_FAILOVER_GRACE_MS") {
  CHECK(parse({}).config.grace_ms == vf::Config::kDefaultGraceMs);
  CHECK(parse({{"VERBS_FAILOVER_GRACE_MS", "0"}}).config.grace_ms == 0);
  CHECK(parse({{"VERBS_FAILOVER_GRACE_MS", "30000"}}).config.grace_ms == 30000);
  const auto result = parse({{"VERBS_FAILOVER_GRACE_MS", "-1"}});
  CHECK(result.config.grace_ms == vf::Config::kDefaultGraceMs);
  REQUIRE(result.problems.size() == 1);
  CHECK(result.problems[0] ==
        "VERBS_FAILOVER_GRACE_MS='-1' is not a duration; accepted values: milliseconds, an "
        "integer 0-600000; using 10000");
  CHECK(parse({{"VERBS_FAILOVER_GRACE_MS", "600001"}}).problems.size() == 1);
}
