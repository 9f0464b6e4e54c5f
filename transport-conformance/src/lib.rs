//! transport-conformance
