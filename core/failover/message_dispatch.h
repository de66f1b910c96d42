// Messages to and from the peer's shim: sending on a session that exists or reconnecting to one
// of the peer's addresses, the outbox of the application's threads, the second session to a
// peer's management address, and process_message, which hands each received message to the
// room that owns it (pairing, switch, re-arm, memory mirror).
#pragma once

#include "core/failover/engine_state.h"

namespace vf::failover {

// To this process's inbox, or on a session to the peer that exists: never connects.
bool send_on_open_session(Engine& e, Protection& p, const ControlMessage& message);

// As send_on_open_session, and also on a session to every other address the peer advertised,
// starting from the `rotation`-th: one that exists (an outgoing session to it, up or still
// connecting; not one whose far end is another process), else a new one started with
// connect_async (never waited for; never to this host's own addresses; at most
// kMaxRouteConnectsPerSend outgoing sessions to the peer's addresses in all). For messages worth repeating on every route when an
// answer is late (a switch request): the session in use may have died without a sign (its
// network's link down), and another network may still reach the peer. The peer must treat a
// second copy as the first (a switch request is idempotent by epoch). Returns the number of
// sessions it was handed to (queued on a connecting one counts).
int send_on_every_route(Engine& e, Protection& p, const ControlMessage& message,
                        std::size_t rotation);

// As send_on_open_session, else connects to each address the peer advertised (blocking, at
// most kConnectTimeoutMs each). False (logged once) when no address answers.
bool send_to_peer(Engine& e, Protection& p, const ControlMessage& message);

// Sends what the application's threads queued (Engine::outbox: MrUpdates).
void flush_outbox(Engine& e);

// Hands a message to the room that owns its type. `from` is the sending process (local: this
// one), `session` the session it came on (0 for this process's inbox).
void process_message(Engine& e, const PeerRef& from, std::uint64_t session,
                     ControlMessage& message);

// The control channel's callbacks (engine_thread.cc): a message on a session (a Hello, or one
// for process_message), and a session closed (a pairing that waited on it moves on).
void on_session_message(Engine& e, ControlSession& session, ControlMessage& message);
void on_session_closed(Engine& e, const ControlSession& closed);

// Connections opened to a peer's first-contact address (a rail) are doubled by one to the first
// address it advertises (management first), so the channel outlives the rail.
void on_hello(Engine& e, ControlSession& session);

}  // namespace vf::failover
