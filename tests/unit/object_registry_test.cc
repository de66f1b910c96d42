#include <catch2/catch.hpp>

#include <atomic>
#include <thread>
#include <vector>

#include "core/object_registry.h"

namespace {
struct Record {
  int value;
};
using SmallRegistry = vf::ObjectRegistry<Record, 16>;
}  // namespace

TEST_CASE("find returns what insert registered, nothing for unknown keys") {
  SmallRegistry registry;
  int a = 0, b = 0;
  Record ra{1}, rb{2};
  REQUIRE(registry.insert(&a, &ra));
  REQUIRE(registry.insert(&b, &rb));
  CHECK(registry.find(&a) == &ra);
  CHECK(registry.find(&b) == &rb);
  int c = 0;
  CHECK(registry.find(&c) == nullptr);
  CHECK(registry.size() == 2);
}

TEST_CASE("a key cannot be registered twice, null keys and records are refused") {
  SmallRegistry registry;
  int a = 0;
  Record r1{1}, r2{2};
  REQUIRE(registry.insert(&a, &r1));
  CHECK_FALSE(registry.insert(&a, &r2));
  CHECK(registry.find(&a) == &r1);
  CHECK_FALSE(registry.insert(nullptr, &r1));
  int b = 0;
  CHECK_FALSE(registry.insert(&b, nullptr));
}

TEST_CASE("erase hands back the record, the key can be registered again") {
  SmallRegistry registry;
  int a = 0;
  Record r1{1}, r2{2};
  REQUIRE(registry.insert(&a, &r1));
  CHECK(registry.erase(&a) == &r1);
  CHECK(registry.find(&a) == nullptr);
  CHECK(registry.erase(&a) == nullptr);
  REQUIRE(registry.insert(&a, &r2));
  CHECK(registry.find(&a) == &r2);
}

TEST_CASE("a full registry refuses inserts, erased slots are reused") {
  SmallRegistry registry;
  std::vector<int> keys(SmallRegistry::capacity() + 1);
  std::vector<Record> records(keys.size());
  for (std::size_t i = 0; i < SmallRegistry::capacity(); ++i) {
    REQUIRE(registry.insert(&keys[i], &records[i]));
  }
  CHECK_FALSE(registry.insert(&keys.back(), &records.back()));
  // Every key stays findable in a full table, including those whose probe chain wraps.
  for (std::size_t i = 0; i < SmallRegistry::capacity(); ++i) {
    CHECK(registry.find(&keys[i]) == &records[i]);
  }
  REQUIRE(registry.erase(&keys[3]) == &records[3]);
  CHECK(registry.insert(&keys.back(), &records.back()));
  CHECK(registry.find(&keys.back()) == &records.back());
  for (std::size_t i = 0; i < SmallRegistry::capacity(); ++i) {
    if (i != 3) CHECK(registry.find(&keys[i]) == &records[i]);
  }
}

TEST_CASE("many create/destroy cycles of distinct addresses never exhaust the table") {
  SmallRegistry registry;
  std::vector<int> keys(1000);
  Record record{0};
  for (int& key : keys) {
    REQUIRE(registry.insert(&key, &record));
    REQUIRE(registry.erase(&key) == &record);
  }
  CHECK(registry.size() == 0);
  CHECK(registry.occupied_slots() == 0);  // no tombstones left behind to slow down misses
}

TEST_CASE("erasing leaves live keys of the same probe chain findable, dead ends are cleaned") {
  SmallRegistry registry;
  std::vector<int> keys(12);
  std::vector<Record> records(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) REQUIRE(registry.insert(&keys[i], &records[i]));
  for (std::size_t i = 0; i < keys.size(); i += 2) REQUIRE(registry.erase(&keys[i]) == &records[i]);
  for (std::size_t i = 1; i < keys.size(); i += 2) CHECK(registry.find(&keys[i]) == &records[i]);
  for (std::size_t i = 0; i < keys.size(); i += 2) CHECK(registry.find(&keys[i]) == nullptr);
  for (std::size_t i = 1; i < keys.size(); i += 2) REQUIRE(registry.erase(&keys[i]) == &records[i]);
  CHECK(registry.occupied_slots() == 0);
}

TEST_CASE("readers see a stable record while another thread inserts and erases other keys") {
  vf::ObjectRegistry<Record, 1024> registry;
  std::vector<int> stable_keys(64);
  std::vector<Record> stable(64);
  for (std::size_t i = 0; i < stable_keys.size(); ++i) {
    stable[i].value = static_cast<int>(i);
    REQUIRE(registry.insert(&stable_keys[i], &stable[i]));
  }
  std::atomic<bool> stop{false};
  std::atomic<long> wrong{0};
  std::thread reader([&] {
    while (!stop.load()) {
      for (std::size_t i = 0; i < stable_keys.size(); ++i) {
        const Record* found = registry.find(&stable_keys[i]);
        if (found == nullptr || found->value != static_cast<int>(i)) ++wrong;
      }
    }
  });
  std::vector<int> churn(256);
  Record churn_record{-1};
  for (int round = 0; round < 200; ++round) {
    for (int& key : churn) registry.insert(&key, &churn_record);
    for (int& key : churn) registry.erase(&key);
  }
  stop = true;
  reader.join();
  CHECK(wrong.load() == 0);
}
