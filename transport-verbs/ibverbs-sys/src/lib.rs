//! ibverbs-sys
