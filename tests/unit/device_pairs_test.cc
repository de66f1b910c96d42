#include <catch2/catch.hpp>

#include "core/device_pairs.h"

using vf::PortRef;

TEST_CASE("VERBS_FAILOVER_PAIRS: device names, optional ports, spaces") {
  const auto parsed = vf::parse_device_pairs("mlx5_0:mlx5_1, mlx5_1/1 : mlx5_0/2");
  REQUIRE(parsed.problems.empty());
  REQUIRE(parsed.rules.size() == 2);
  CHECK(parsed.rules[0].primary == PortRef{"mlx5_0", 1});
  CHECK(parsed.rules[0].backup == PortRef{"mlx5_1", 1});
  CHECK(parsed.rules[1].primary == PortRef{"mlx5_1", 1});
  CHECK(parsed.rules[1].backup == PortRef{"mlx5_0", 2});
  CHECK(vf::backup_for(parsed.rules, {"mlx5_1", 1}) == PortRef{"mlx5_0", 2});
  CHECK_FALSE(vf::backup_for(parsed.rules, {"mlx5_2", 1}));
}

TEST_CASE("VERBS_FAILOVER_PAIRS: bad entries are named and skipped, good ones kept") {
  const auto parsed =
      vf::parse_device_pairs("rxe0:rxe1,bogus,a:b:c,x/0:y,x/256:y,rxe0:rxe2,rxe3:rxe3,,rxe1:rxe0");
  REQUIRE(parsed.rules.size() == 2);
  CHECK(parsed.rules[0].primary == PortRef{"rxe0", 1});
  CHECK(parsed.rules[1].primary == PortRef{"rxe1", 1});
  REQUIRE(parsed.problems.size() == 6);
  CHECK(parsed.problems[0] ==
        "VERBS_FAILOVER_PAIRS entry 'bogus' is not PRIMARY:BACKUP with each DEVICE or "
        "DEVICE/PORT (port 1-255); entry ignored");
  CHECK(parsed.problems[1].find("'a:b:c'") != std::string::npos);
  CHECK(parsed.problems[2].find("'x/0:y'") != std::string::npos);
  CHECK(parsed.problems[3].find("'x/256:y'") != std::string::npos);
  CHECK(parsed.problems[4] ==
        "VERBS_FAILOVER_PAIRS entry 'rxe0:rxe2' names rxe0/1 as a primary a second time; the "
        "first entry wins");
  CHECK(parsed.problems[5] ==
        "VERBS_FAILOVER_PAIRS entry 'rxe3:rxe3' pairs rxe3/1 with itself; entry ignored");
}

TEST_CASE("automatic pairing: next active port of the same link layer, on another device") {
  constexpr int kEthernet = 2;
  constexpr int kInfiniband = 1;
  // Given out of order: the choice must not depend on enumeration order.
  const auto rules = vf::automatic_pairs({
      {"mlx5_1", 1, true, kEthernet},
      {"mlx5_0", 1, true, kEthernet},
      {"mlx5_3", 1, true, kInfiniband},
      {"mlx5_2", 1, false, kEthernet},  // down: neither protected nor a backup
  });
  CHECK(vf::backup_for(rules, {"mlx5_0", 1}) == PortRef{"mlx5_1", 1});
  CHECK(vf::backup_for(rules, {"mlx5_1", 1}) == PortRef{"mlx5_0", 1});
  CHECK_FALSE(vf::backup_for(rules, {"mlx5_2", 1}));
  CHECK_FALSE(vf::backup_for(rules, {"mlx5_3", 1}));  // the only InfiniBand port: pass-through
}

TEST_CASE("automatic pairing prefers another NIC, falls back to another port of the same NIC") {
  const auto rules = vf::automatic_pairs({
      {"a", 1, true, 2}, {"a", 2, true, 2}, {"b", 1, true, 2},
  });
  CHECK(vf::backup_for(rules, {"a", 1}) == PortRef{"b", 1});
  CHECK(vf::backup_for(rules, {"a", 2}) == PortRef{"b", 1});
  CHECK(vf::backup_for(rules, {"b", 1}) == PortRef{"a", 1});
  const auto single_nic = vf::automatic_pairs({{"a", 1, true, 2}, {"a", 2, true, 2}});
  CHECK(vf::backup_for(single_nic, {"a", 1}) == PortRef{"a", 2});
  CHECK(vf::backup_for(single_nic, {"a", 2}) == PortRef{"a", 1});
}

TEST_CASE("the lab's crossed rails: rxe0 backs rxe1 and the reverse") {
  const auto rules = vf::automatic_pairs({{"rxe1", 1, true, 2}, {"rxe0", 1, true, 2}});
  CHECK(vf::backup_for(rules, {"rxe0", 1}) == PortRef{"rxe1", 1});
  CHECK(vf::backup_for(rules, {"rxe1", 1}) == PortRef{"rxe0", 1});
}
