//! libfabric-sys
