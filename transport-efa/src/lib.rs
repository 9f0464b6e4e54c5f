//! transport-efa
