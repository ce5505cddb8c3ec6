//! Ring's gRPC services and messages, generated from `ring.proto` with tonic/prost.
//!
//! - `RaftTransport`: Raft messages between `ringd` members (raft-rs encoding, as bytes),
//!   with chunked snapshot transfer.
//! - `RingAdmin`: status, health reports, leases, membership and probes.

#![allow(clippy::all, missing_docs)]

/// Version 1 of the protocol.
pub mod v1 {
    tonic::include_proto!("ring.v1");
}
