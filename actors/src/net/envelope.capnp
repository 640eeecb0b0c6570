# The envelope of every message between troupe nodes. The fields' meaning and the rules a
# decoder checks are in wire.hpp; the frame around the envelope is described in transport.hpp.
@0xa8f77522e3f05515;

$import "/capnp/c++.capnp".namespace("troupe::net::schema");

enum Kind {
  invalid @0;   # never sent: a zeroed envelope is refused
  call @1;      # a method call that expects a reply (ask)
  tell @2;      # a method call without reply
  reply @3;     # the result of a call
  error @4;     # a call failed: errorCode and errorMessage say why
  control @5;   # between nodes themselves (handshake, heartbeats); method is the control code
}

struct Envelope {
  kind @0 :Kind;
  target @1 :UInt64;        # the receiving actor
  method @2 :UInt64;        # the method id (or the control code)
  requestId @3 :UInt64;     # pairs a reply or error with its call
  replyTo @4 :UInt64;       # the actor (or waiting ask) the reply goes to
  errorCode @5 :UInt32;     # a troupe::errc value when kind is error
  errorMessage @6 :Text;
  payload @7 :Data;         # small payloads inline; large ones travel as the frame's raw body
}
