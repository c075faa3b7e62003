//! RESP (Redis protocol) gateway: see docs/resp.md.
