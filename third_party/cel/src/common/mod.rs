pub mod ast;
pub mod traits;
pub mod types;
pub mod value;
