//! bench-cli
