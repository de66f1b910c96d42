#include "core/stats.h"

#include <fcntl.h>
#include <unistd.h>

#include <fmt/format.h>

#include <atomic>
#include <cerrno>
#include <cstdio>  // rename
#include <system_error>

namespace vf {
namespace {

// Length of the valid UTF-8 sequence starting at text[i], or 0 if it is not one (overlong
// forms, surrogates and code points above U+10FFFF are invalid).
std::size_t utf8_sequence_length(std::string_view text, std::size_t i) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char lead = byte(i);
  std::size_t length = 0;
  unsigned char low = 0x80;
  unsigned char high = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) low = 0xA0;
    if (lead == 0xED) high = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) low = 0x90;
    if (lead == 0xF4) high = 0x8F;
  } else {
    return 0;
  }
  if (i + length > text.size()) return 0;
  if (byte(i + 1) < low || byte(i + 1) > high) return 0;
  for (std::size_t k = 2; k < length; ++k) {
    if (byte(i + k) < 0x80 || byte(i + k) > 0xBF) return 0;
  }
  return length;
}

std::string optional_string(const std::optional<std::string>& value) {
  return value ? json_quote(*value) : "null";
}

// Milliseconds between detection and resumption with 3 decimals, or null before resumption.
std::string switch_millis(const SwitchEvent& event) {
  if (event.resumed_unix_ns == 0) return "null";
  const bool negative = event.resumed_unix_ns < event.detected_unix_ns;  // the clock stepped
  const std::uint64_t ns = negative ? event.detected_unix_ns - event.resumed_unix_ns
                                    : event.resumed_unix_ns - event.detected_unix_ns;
  const std::uint64_t us = (ns + 500) / 1000;
  return fmt::format("{}{}.{:03}", negative && us != 0 ? "-" : "", us / 1000, us % 1000);
}

std::string render_event(const SwitchEvent& event) {
  return fmt::format(
      "{{\"kind\": {}, \"reason\": {}, \"from\": {}, \"to\": {}, \"detected_unix_ns\": {}, "
      "\"resumed_unix_ns\": {}, \"ms\": {}, \"replayed_wrs\": {}}}",
      json_quote(event.kind), json_quote(event.reason), json_quote(event.from),
      json_quote(event.to), event.detected_unix_ns, event.resumed_unix_ns, switch_millis(event),
      event.replayed_wrs);
}

std::string render_device(const DeviceStats& device) {
  return fmt::format(
      "{{\"name\": {}, \"port\": {}, \"state\": {}, \"backup\": {}, \"port_changes\": {}, "
      "\"hidden_async_events\": {}}}",
      json_quote(device.name), device.port, json_quote(device.state),
      optional_string(device.backup), device.port_changes, device.hidden_async_events);
}

std::string render_qp(const QpStats& qp) {
  std::string out = fmt::format(
      "{{\"qpn\": {}, \"device\": {}, \"backup\": {}, \"peer\": {}, \"protected\": {}, "
      "\"path\": {}, "
      "\"state\": {}, \"unprotected_reason\": {}, \"failovers\": {}, \"failbacks\": {}, "
      "\"replayed_wrs\": {}, \"hidden_error_completions\": {}, \"hidden_async_events\": {}, "
      "\"synthesized_completions\": {}, \"standby_probes\": {}, \"standby_probe_failures\": {},"
      "\n     \"events\": [",
      qp.qpn, json_quote(qp.device), optional_string(qp.backup), optional_string(qp.peer),
      qp.is_protected ? "true" : "false", json_quote(qp.path), json_quote(qp.state),
      json_quote(qp.unprotected_reason), qp.failovers, qp.failbacks, qp.replayed_wrs,
      qp.hidden_error_completions, qp.hidden_async_events, qp.synthesized_completions,
      qp.standby_probes, qp.standby_probe_failures);
  for (std::size_t i = 0; i < qp.events.size(); ++i) {
    if (i != 0) out += ", ";
    out += render_event(qp.events[i]);
  }
  out += "]}";
  return out;
}

template <typename T, typename Render>
std::string render_array(const std::vector<T>& items, Render render) {
  if (items.empty()) return "[]";
  std::string out = "[\n";
  for (std::size_t i = 0; i < items.size(); ++i) {
    out += "    ";
    out += render(items[i]);
    out += i + 1 < items.size() ? ",\n" : "\n";
  }
  out += "  ]";
  return out;
}

}  // namespace

std::string json_quote(std::string_view text) {
  std::string out;
  out.reserve(text.size() + 2);
  out += '"';
  for (std::size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\b': out += "\\b"; break;
        case '\f': out += "\\f"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        default:
          if (c < 0x20) {
            out += fmt::format("\\u{:04x}", c);
          } else {
            out += static_cast<char>(c);
          }
      }
      ++i;
      continue;
    }
    const std::size_t length = utf8_sequence_length(text, i);
    if (length == 0) {
      out += "\\ufffd";
      ++i;
    } else {
      out.append(text.substr(i, length));
      i += length;
    }
  }
  out += '"';
  return out;
}

std::string render_stats_json(const StatsSnapshot& snapshot) {
  std::uint64_t protected_qps = 0, failovers = 0, failbacks = 0, replayed = 0, hidden_errors = 0,
                hidden_async = 0, synthesized = 0;
  for (const QpStats& qp : snapshot.qps) {
    protected_qps += qp.is_protected ? 1 : 0;
    failovers += qp.failovers;
    failbacks += qp.failbacks;
    replayed += qp.replayed_wrs;
    hidden_errors += qp.hidden_error_completions;
    hidden_async += qp.hidden_async_events;
    synthesized += qp.synthesized_completions;
  }
  for (const DeviceStats& device : snapshot.devices) hidden_async += device.hidden_async_events;
  const std::uint64_t qps = snapshot.qps.size();

  std::string out = "{\n";
  out += fmt::format("  \"pid\": {},\n", snapshot.pid);
  out += fmt::format("  \"program\": {},\n", json_quote(snapshot.program));
  out += fmt::format("  \"reason\": {},\n", json_quote(snapshot.reason));
  out += fmt::format("  \"written_unix_ms\": {},\n", snapshot.written_unix_ms);
  out += fmt::format(
      "  \"totals\": {{\"qps\": {}, \"protected_qps\": {}, \"unprotected_qps\": {}, "
      "\"failovers\": {}, \"failbacks\": {}, \"replayed_wrs\": {}, \"hidden_error_completions\": "
      "{}, \"hidden_async_events\": {}, \"synthesized_completions\": {}}},\n",
      qps, protected_qps, qps - protected_qps, failovers, failbacks, replayed, hidden_errors,
      hidden_async, synthesized);
  out += "  \"devices\": " + render_array(snapshot.devices, render_device) + ",\n";
  out += "  \"qps\": " + render_array(snapshot.qps, render_qp) + "\n";
  out += "}\n";
  return out;
}

bool write_file_atomically(const std::string& path, std::string_view content, std::string& error) {
  // A name of its own per write: two threads of this process may write one path at once (the
  // engine's thread, the exit handler), and a shared temporary mixes their contents.
  static std::atomic<std::uint64_t> writes{0};
  const std::string temporary = fmt::format("{}.tmp.{}.{}", path, ::getpid(), ++writes);
  const auto system_error = [](int code) {
    return std::error_code(code, std::generic_category()).message();
  };
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    error = fmt::format("cannot create {}: {}", temporary, system_error(errno));
    return false;
  }
  std::size_t written = 0;
  while (written < content.size()) {
    const ssize_t n = ::write(fd, content.data() + written, content.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int code = n < 0 ? errno : EIO;
      ::close(fd);
      ::unlink(temporary.c_str());
      error = fmt::format("cannot write {}: {}", temporary, system_error(code));
      return false;
    }
    written += static_cast<std::size_t>(n);
  }
  if (::close(fd) != 0) {
    const int code = errno;
    ::unlink(temporary.c_str());
    error = fmt::format("cannot write {}: {}", temporary, system_error(code));
    return false;
  }
  if (::rename(temporary.c_str(), path.c_str()) != 0) {
    const int code = errno;
    ::unlink(temporary.c_str());
    error = fmt::format("cannot rename {} to {}: {}", temporary, path, system_error(code));
    return false;
  }
  return true;
}

}  // namespace vf
