// A fixed-capacity map from a verbs object's address to the shim's record for it.
//
// Why this shape: the data path (post_send, poll_cq...) must find the record of the object it was
// handed without taking a lock and without allocating. Lookups are wait-free (atomic loads along a
// linear probe); inserts and erases are rare (object creation/destruction) and serialise on a
// mutex that readers never touch. An erased slot keeps its key with a null value (a tombstone)
// until an insert reuses it, so a concurrent reader walking the probe chain never stops early.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>

namespace vf {

template <typename Record, std::size_t kCapacity>
class ObjectRegistry {
  static_assert(kCapacity >= 16, "registry too small to be useful");
  static_assert((kCapacity & (kCapacity - 1)) == 0, "capacity must be a power of two");

 public:
  ObjectRegistry() = default;
  ObjectRegistry(const ObjectRegistry&) = delete;
  ObjectRegistry& operator=(const ObjectRegistry&) = delete;

  Record* find(const void* key) const noexcept {
    std::size_t index = slot_of(key);
    for (std::size_t probes = 0; probes < kCapacity; ++probes) {
      const Slot& slot = slots_[index];
      const void* slot_key = slot.key.load(std::memory_order_acquire);
      if (slot_key == key) return slot.record.load(std::memory_order_acquire);
      if (slot_key == nullptr) return nullptr;
      index = (index + 1) & (kCapacity - 1);
    }
    return nullptr;
  }

  // False when the key is present already or the table is full; the caller then treats the
  // object as unmanaged (pass-through), never as an error of the application.
  bool insert(const void* key, Record* record) {
    if (key == nullptr || record == nullptr) return false;
    std::lock_guard lock(writers_);
    Slot* reusable = nullptr;
    std::size_t index = slot_of(key);
    for (std::size_t probes = 0; probes < kCapacity; ++probes) {
      Slot& slot = slots_[index];
      const void* slot_key = slot.key.load(std::memory_order_relaxed);
      if (slot_key == key) {
        if (slot.record.load(std::memory_order_relaxed) != nullptr) return false;
        slot.record.store(record, std::memory_order_release);
        ++size_;
        return true;
      }
      if (slot_key == nullptr) {
        if (reusable == nullptr) reusable = &slot;
        break;
      }
      if (reusable == nullptr && slot.record.load(std::memory_order_relaxed) == nullptr) {
        reusable = &slot;
      }
      index = (index + 1) & (kCapacity - 1);
    }
    if (reusable == nullptr) return false;
    reusable->key.store(key, std::memory_order_release);
    reusable->record.store(record, std::memory_order_release);
    ++size_;
    return true;
  }

  // Returns the record that was registered (the caller owns and frees it), or nullptr.
  Record* erase(const void* key) {
    std::lock_guard lock(writers_);
    std::size_t index = slot_of(key);
    for (std::size_t probes = 0; probes < kCapacity; ++probes) {
      Slot& slot = slots_[index];
      const void* slot_key = slot.key.load(std::memory_order_relaxed);
      if (slot_key == key) {
        Record* old = slot.record.exchange(nullptr, std::memory_order_acq_rel);
        if (old != nullptr) --size_;
        clear_tombstones_ending_at(index);
        return old;
      }
      if (slot_key == nullptr) return nullptr;
      index = (index + 1) & (kCapacity - 1);
    }
    return nullptr;
  }

  // Slots holding a key, live or tombstone (for tests of the clean-up).
  std::size_t occupied_slots() const {
    std::lock_guard lock(writers_);
    std::size_t count = 0;
    for (const Slot& slot : slots_) count += slot.key.load(std::memory_order_relaxed) != nullptr;
    return count;
  }

  std::size_t size() const {
    std::lock_guard lock(writers_);
    return size_;
  }

  static constexpr std::size_t capacity() { return kCapacity; }

  // fork(): the child must not inherit the writer lock held by another parent thread.
  void lock_for_fork() { writers_.lock(); }
  void unlock_after_fork() { writers_.unlock(); }

 private:
  struct Slot {
    std::atomic<const void*> key{nullptr};
    std::atomic<Record*> record{nullptr};
  };

  // A tombstone followed by an empty slot ends every probe chain through it (a reader would stop
  // at that empty slot anyway), so it, and the run of tombstones before it, can become empty
  // again. Without this, churn of distinct addresses would fill the table with tombstones and
  // make every miss scan all of it.
  void clear_tombstones_ending_at(std::size_t index) {
    for (std::size_t steps = 0; steps < kCapacity; ++steps) {
      Slot& slot = slots_[index];
      const Slot& next = slots_[(index + 1) & (kCapacity - 1)];
      const bool tombstone = slot.key.load(std::memory_order_relaxed) != nullptr &&
                             slot.record.load(std::memory_order_relaxed) == nullptr;
      if (!tombstone || next.key.load(std::memory_order_relaxed) != nullptr) return;
      slot.key.store(nullptr, std::memory_order_release);
      index = (index - 1) & (kCapacity - 1);
    }
  }

  static std::size_t slot_of(const void* key) noexcept {
    // Fibonacci hashing spreads heap addresses, whose low bits are alignment zeros.
    const auto bits = reinterpret_cast<std::uintptr_t>(key);
    return static_cast<std::size_t>((bits * 0x9E3779B97F4A7C15ull) >> 32) & (kCapacity - 1);
  }

  Slot slots_[kCapacity];
  mutable std::mutex writers_;
  std::size_t size_ = 0;
};

}  // namespace vf
