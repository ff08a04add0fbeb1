mod cstr;
pub mod emitter;
pub mod error;
pub mod parser;
pub mod tag;
mod util;

use self::error::Error;
