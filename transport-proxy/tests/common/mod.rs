pub mod cases;
pub mod mock;
