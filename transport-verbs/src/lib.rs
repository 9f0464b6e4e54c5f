//! transport-verbs
